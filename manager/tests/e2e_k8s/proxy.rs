//! A TCP proxy in front of the Kubernetes stand-in that records each request line it forwards
//! (the manager's API calls per tick).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// A TCP proxy to the stand-in that counts the requests it forwards, by method and path.
pub struct CountingProxy {
    pub addr: String,
    seen: Arc<Mutex<Vec<(String, String)>>>,
}

impl CountingProxy {
    pub fn start(upstream: &str) -> Self {
        let upstream = upstream.trim_start_matches("http://").to_string();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let (mut c_read, mut s_write) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (mut s_read, mut c_write) = (server, client);
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut s_read, &mut c_write);
                    let _ = c_write.shutdown(std::net::Shutdown::Both);
                });
                let s = s.clone();
                std::thread::spawn(move || {
                    let mut carry = String::new();
                    let mut buf = [0u8; 16384];
                    loop {
                        let n = match c_read.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        carry.push_str(&String::from_utf8_lossy(&buf[..n]));
                        while let Some(i) = carry.find("\r\n") {
                            let line: String = carry.drain(..i + 2).collect();
                            let mut parts = line.split_whitespace();
                            if let (Some(m), Some(p), Some(v)) =
                                (parts.next(), parts.next(), parts.next())
                            {
                                if v.starts_with("HTTP/1.")
                                    && ["GET", "POST", "DELETE", "PUT", "PATCH"].contains(&m)
                                {
                                    s.lock().unwrap().push((m.to_string(), p.to_string()));
                                }
                            }
                        }
                        if s_write.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = s_write.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        CountingProxy {
            addr: format!("http://{addr}"),
            seen,
        }
    }

    pub fn take(&self) -> Vec<(String, String)> {
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}
