//! The results archiver against the floor of reading the same bytes: a tree of one file (random
//! bytes, then text) archived as the upload does it (tar, gzip writer, 256 KiB chunks on a
//! channel to an async receiver that drops them), against `read` of the same file in 1 MiB
//! pieces. Both read from the page cache (the file is read once before). Prints wall seconds,
//! MB/s and the process's CPU seconds of each, and the ratios.
//!
//! `cargo bench -p codalab-worker --bench archive` (CLW_BENCH_MIB sets the size, 1024 by
//! default; CLW_BENCH_THREADS the gzip threads, 2 by default; CLW_BENCH_KINDS `random`, `text`
//! or both, the default). Run as a test (`cargo test --all-targets`, which passes no `--bench`),
//! it archives 4 MiB of each kind once: a check that it works, not a figure.

use std::io::{Read, Write};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use codalab_worker::archive::{write_tar_gz_par, ChannelWriter, Excludes};
use codalab_worker::nofollow::Dir;

/// CPU seconds of the whole process, all threads (`/proc/self/stat`'s utime and stime, in
/// clock ticks of 10 ms).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // After the command's name in parentheses: state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<f64> = rest
        .split(' ')
        .skip(11)
        .take(2)
        .map(|v| v.parse().unwrap())
        .collect();
    (f[0] + f[1]) / 100.0
}

/// Wall and CPU seconds of `f`.
fn timed(f: impl FnOnce()) -> (f64, f64) {
    let (c0, t0) = (cpu_seconds(), Instant::now());
    f();
    (t0.elapsed().as_secs_f64(), cpu_seconds() - c0)
}

fn fill(path: &std::path::Path, bytes: usize, random: bool) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut x: u64 = 0x9e3779b97f4a7c15;
    let line = b"codalab compressible line of text 0123456789\n";
    let mut buf = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len());
        for (i, b) in buf[..n].iter_mut().enumerate() {
            *b = if random {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            } else {
                line[i % line.len()]
            };
        }
        f.write_all(&buf[..n]).unwrap();
        left -= n;
    }
    f.flush().unwrap();
}

fn read_floor(path: &std::path::Path) -> u64 {
    let mut f = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0;
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            return total;
        }
        total += n as u64;
    }
}

fn archive(dir: &std::path::Path, threads: usize, rt: &tokio::runtime::Runtime) -> u64 {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(16);
    let drain = rt.spawn(async move {
        let mut n = 0u64;
        while let Some(chunk) = rx.recv().await {
            n += chunk.unwrap().len() as u64;
        }
        n
    });
    let sent = Arc::new(AtomicU64::new(0));
    let mut w = write_tar_gz_par(
        &Dir::open(dir).unwrap(),
        &Excludes::new(&[]),
        ChannelWriter::new(tx, sent),
        threads,
    )
    .unwrap();
    w.flush().unwrap();
    drop(w);
    rt.block_on(drain).unwrap()
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let mib: usize = std::env::var("CLW_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if bench { 1024 } else { 4 });
    let threads: usize = std::env::var("CLW_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
    let dir = tmp.path().join("bundle");
    std::fs::create_dir(&dir).unwrap();
    let file = dir.join("out.bin");
    let bytes = mib << 20;
    println!("archive of {mib} MiB, {threads} gzip threads, against read(2) of the same file");
    let kinds = std::env::var("CLW_BENCH_KINDS").unwrap_or_else(|_| "random,text".into());
    for (kind, random) in [("random", true), ("text", false)] {
        if !kinds.split(',').any(|k| k == kind) {
            continue;
        }
        fill(&file, bytes, random);
        read_floor(&file);
        let mut runs = Vec::new();
        for _ in 0..if bench { 3 } else { 1 } {
            let mut sent = 0;
            let a = timed(|| sent = archive(&dir, threads, &rt));
            let mut got = 0;
            let r = timed(|| got = read_floor(&file));
            assert_eq!(got, bytes as u64);
            runs.push((a, r, sent));
        }
        runs.sort_by(|x, y| x.0 .1.total_cmp(&y.0 .1));
        let ((aw, ac), (rw, rc), sent) = runs[runs.len() / 2];
        let mb = bytes as f64 / 1e6;
        println!(
            "{kind:>6}: archive {aw:.3} s ({:.0} MB/s) {ac:.3} CPU s, {sent} bytes out | read {rw:.3} s \
             ({:.0} MB/s) {rc:.3} CPU s | CPU {:.2}x the read's",
            mb / aw,
            mb / rw,
            ac / rc
        );
    }
}
