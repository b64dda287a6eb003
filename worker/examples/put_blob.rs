//! Sends one upload as the worker sends its results, for side-by-side runs with `curl -T`:
//! `put_blob SERVER UUID DIR` archives DIR (the worker's archiver, chunks on a channel to a
//! streamed body), `put_blob SERVER UUID FILE` streams the file's bytes the same way; both go
//! through the worker's own client (`RestClient::upload_bundle_contents`), signed in with
//! CODALAB_USERNAME and CODALAB_PASSWORD as the worker is. Prints the seconds taken.
//! `bench/upload_pairs.py` runs it beside curl.

use std::io::Read;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use codalab_worker::archive::{write_tar_gz_par, ChannelWriter, Excludes};
use codalab_worker::nofollow::Dir;
use protocol::{ClientConfig, Credentials, RestClient};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (server, uuid, path) = (&args[1], &args[2], std::path::PathBuf::from(&args[3]));
    let credentials = Credentials::resolve(None).expect("CODALAB_USERNAME and CODALAB_PASSWORD");
    let client = RestClient::new(ClientConfig::new(server.as_str()), credentials).unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(16);
    let t0 = Instant::now();
    let sender = tokio::task::spawn_blocking(move || {
        if path.is_dir() {
            let w = ChannelWriter::new(tx, Arc::new(AtomicU64::new(0)));
            let mut w =
                write_tar_gz_par(&Dir::open(&path).unwrap(), &Excludes::new(&[]), w, 2).unwrap();
            std::io::Write::flush(&mut w).unwrap();
        } else {
            let mut f = std::fs::File::open(&path).unwrap();
            loop {
                let mut buf = vec![0u8; 256 * 1024];
                let n = f.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                buf.truncate(n);
                tx.blocking_send(Ok(bytes::Bytes::from(buf))).unwrap();
            }
        }
    });
    let body = reqwest::Body::wrap_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    client.upload_bundle_contents(uuid, "", body).await.unwrap();
    sender.await.unwrap();
    println!("{:.3} s", t0.elapsed().as_secs_f64());
}
