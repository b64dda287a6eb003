//! Sends one upload as the worker sends its results, for side-by-side runs with `curl -T`:
//! `put_blob URL DIR` archives DIR (the worker's archiver, chunks on a channel to a streamed
//! reqwest body), `put_blob URL FILE` streams the file's bytes the same way. The
//! `Authorization` header is read from CLW_AUTH (never argv). Prints the answer's status, the
//! seconds taken and the answer's start. `bench/upload_pairs.py` runs it beside curl.

use std::io::Read;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use codalab_worker::archive::{write_tar_gz_par, ChannelWriter, Excludes};
use codalab_worker::nofollow::Dir;

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args().collect();
    let (url, path) = (args[1].clone(), std::path::PathBuf::from(&args[2]));
    let auth = std::env::var("CLW_AUTH").unwrap();
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
    let r = reqwest::Client::new()
        .put(&url)
        .header("Authorization", auth)
        .header("X-Requested-With", "XMLHttpRequest")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    sender.await.unwrap();
    println!(
        "{status} {:.3} s {}",
        t0.elapsed().as_secs_f64(),
        text.chars().take(80).collect::<String>()
    );
}
