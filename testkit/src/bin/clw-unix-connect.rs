//! `clw-unix-connect SOCKET`: connects to a Unix socket and asks it `GET /_ping` (the Docker
//! API's liveness call); prints `connected: <first line of the answer>` and exits 0, or prints
//! why it could not connect and exits 1. Mounted into test runs, whose images have no client of
//! their own, to show whether a run can reach an engine's socket.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("usage: clw-unix-connect SOCKET");
    match UnixStream::connect(&path) {
        Ok(mut s) => {
            let _ = s.write_all(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n");
            let mut line = String::new();
            let _ = BufReader::new(s).read_line(&mut line);
            println!("connected: {}", line.trim_end());
        }
        Err(e) => {
            println!("cannot connect to {path}: {e}");
            std::process::exit(1);
        }
    }
}
