//! Streamed archives of run results (the tar itself is written by [`crate::nofollow::archive`]),
//! GNU-tar-like exclude patterns, and the lexical normalisation of relative paths. Blocking
//! code, run on tokio's blocking pool.

use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::nofollow::archive::append_tree;
use crate::nofollow::Dir;

pub mod gzip;

use gzip::Sink;

/// Lexically normalises a relative path; `None` if it is absolute or climbs above its start.
pub fn normalize_relative(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::Normal(p) => out.push(p),
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Glob patterns in GNU tar's `--exclude` sense: a pattern matches a path if it matches the whole
/// relative path or any trailing run of its components (so `*.log` excludes `a/b.log`).
pub struct Excludes(Vec<glob::Pattern>);

impl Excludes {
    pub fn new(patterns: &[String]) -> Self {
        Excludes(
            patterns
                .iter()
                .filter_map(|p| {
                    let p = p.trim_start_matches("./");
                    glob::Pattern::new(p)
                        .map_err(|e| tracing::warn!("ignoring bad exclude pattern {p:?}: {e}"))
                        .ok()
                })
                .collect(),
        )
    }

    pub fn matches(&self, rel: &Path) -> bool {
        if self.0.is_empty() {
            return false;
        }
        let comps: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        (0..comps.len()).any(|i| {
            let tail = comps[i..].join("/");
            self.0.iter().any(|p| p.matches(&tail))
        })
    }
}

/// Writes a gzipped tar of the tree at `root` (entries named by their path relative to it,
/// links stored as links and never followed, any depth), leaving out excluded paths, gzipped
/// on `threads` threads ([`gzip`]): one gzip stream, which any gunzip, and the server's, reads
/// as one. `out` gets the blocks in order. A
/// failing `out` stops the archive at the next write and is reported as the error; an archive
/// that fails sends no gzip trailer.
pub fn write_tar_gz_par<W: Sink + Send + 'static>(
    root: &Dir,
    excludes: &Excludes,
    out: W,
    threads: usize,
) -> io::Result<W> {
    let mut tar = tar::Builder::new(gzip::GzWriter::new(out, threads)?);
    append_tree(&mut tar, root, |rel| excludes.matches(rel))?;
    tar.into_inner()?.finish()
}

/// A `Write` that hands chunks of at least 256 KiB to an async receiver (a streamed HTTP body),
/// counting the bytes sent; a whole buffer of 64 KiB or more ([`Sink::write_owned`]) goes as it
/// is. Writing fails once the receiver is gone, which stops the archiver.
pub struct ChannelWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
    sent: Arc<AtomicU64>,
}

const CHUNK: usize = 256 * 1024;
/// A buffer handed over whole at least this big goes out as it is; a smaller one joins the next
/// chunk.
const OWNED_MIN: usize = 64 * 1024;

impl ChannelWriter {
    pub fn new(tx: mpsc::Sender<io::Result<Bytes>>, sent: Arc<AtomicU64>) -> Self {
        ChannelWriter {
            tx,
            buf: Vec::with_capacity(CHUNK),
            sent,
        }
    }

    fn push(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::take(&mut self.buf));
        self.send(chunk)
    }

    fn send(&mut self, chunk: Bytes) -> io::Result<()> {
        let n = chunk.len() as u64;
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "upload stopped"))?;
        self.sent.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    /// A writer of the same stream to hand to another thread, after what this one holds.
    pub fn hand_off(&mut self) -> io::Result<ChannelWriter> {
        self.push()?;
        Ok(ChannelWriter::new(self.tx.clone(), self.sent.clone()))
    }

    /// What reports an archiving error once the writer itself has been handed on.
    pub fn failer(&self) -> Failer {
        Failer(self.tx.clone())
    }
}

/// Reports an archiving error to a [`ChannelWriter`]'s receiver (the HTTP body then fails).
pub struct Failer(mpsc::Sender<io::Result<Bytes>>);

impl Failer {
    pub fn fail(self, e: io::Error) {
        let _ = self.0.blocking_send(Err(e));
    }
}

impl Sink for ChannelWriter {
    fn write_owned(&mut self, buf: Vec<u8>) -> io::Result<()> {
        if buf.len() < OWNED_MIN {
            return self.write_all(&buf);
        }
        self.push()?;
        self.send(Bytes::from(buf))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.capacity() == 0 {
            self.buf.reserve(CHUNK);
        }
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.push()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.push()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_round_trip_with_links_and_excludes() {
        use std::fs;
        let src = tempfile::tempdir().unwrap();
        fs::create_dir_all(src.path().join("sub/logs")).unwrap();
        fs::write(src.path().join("stdout"), "hello\n").unwrap();
        fs::write(src.path().join("sub/data.bin"), vec![7u8; 200_000]).unwrap();
        fs::write(src.path().join("sub/logs/x.log"), "x").unwrap();
        std::os::unix::fs::symlink("stdout", src.path().join("link")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", src.path().join("abs")).unwrap();
        let ex = Excludes::new(&["*.log".into()]);
        let bytes = write_tar_gz_par(&Dir::open(src.path()).unwrap(), &ex, Vec::new(), 1).unwrap();
        let dst = tempfile::tempdir().unwrap();
        crate::nofollow::extract::extract_tar_gz(
            &bytes[..],
            &Dir::open(dst.path()).unwrap(),
            1 << 30,
        )
        .unwrap();
        assert_eq!(
            fs::read_to_string(dst.path().join("stdout")).unwrap(),
            "hello\n"
        );
        assert_eq!(
            fs::read(dst.path().join("sub/data.bin")).unwrap().len(),
            200_000
        );
        assert!(!dst.path().join("sub/logs/x.log").exists());
        assert!(dst.path().join("sub/logs").is_dir());
        assert_eq!(
            fs::read_link(dst.path().join("link")).unwrap(),
            PathBuf::from("stdout")
        );
        assert_eq!(
            fs::read_link(dst.path().join("abs")).unwrap(),
            PathBuf::from("/etc/passwd")
        );
    }

    #[test]
    fn a_parallel_archive_is_one_gzip_stream_with_the_same_tar() {
        use std::fs;
        use std::io::Read;
        let src = tempfile::tempdir().unwrap();
        // Incompressible and compressible data over many 128 KiB blocks.
        let mut noise = vec![0u8; 3 << 20];
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for b in noise.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        fs::write(src.path().join("noise.bin"), &noise).unwrap();
        fs::write(src.path().join("text"), "line\n".repeat(200_000)).unwrap();
        std::os::unix::fs::symlink("/nowhere", src.path().join("dangling")).unwrap();
        let dir = Dir::open(src.path()).unwrap();
        let ex = Excludes::new(&[]);
        let one = write_tar_gz_par(&dir, &ex, Vec::new(), 1).unwrap();
        let par = write_tar_gz_par(&dir, &ex, Vec::new(), 3).unwrap();
        let gunzip = |b: &[u8]| {
            // One member: a single-member decoder reads all of it.
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(b)
                .read_to_end(&mut out)
                .unwrap();
            out
        };
        assert_eq!(gunzip(&par), gunzip(&one));
        assert!(par.len() < 3 * (3 << 20) / 2, "{} bytes", par.len());
    }

    #[test]
    fn a_failing_writer_stops_the_parallel_archive_with_its_error() {
        #[derive(Debug)]
        struct Broken(usize);
        impl Write for Broken {
            fn write(&mut self, d: &[u8]) -> io::Result<usize> {
                if self.0 > 100_000 {
                    return Err(io::Error::new(io::ErrorKind::BrokenPipe, "gone"));
                }
                self.0 += d.len();
                Ok(d.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        impl Sink for Broken {}
        let src = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..8u32 << 20)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        std::fs::write(src.path().join("big"), data).unwrap();
        let e = write_tar_gz_par(
            &Dir::open(src.path()).unwrap(),
            &Excludes::new(&[]),
            Broken(0),
            2,
        )
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{e}");
    }

    #[test]
    fn excludes_like_gnu_tar() {
        let ex = Excludes::new(&["*.log".into(), "cache".into(), "./top/only".into()]);
        assert!(ex.matches(Path::new("a.log")));
        assert!(ex.matches(Path::new("x/y/a.log")));
        assert!(ex.matches(Path::new("x/cache")));
        assert!(ex.matches(Path::new("top/only")));
        assert!(!ex.matches(Path::new("x/cached")));
        assert!(!Excludes::new(&[]).matches(Path::new("anything")));
    }
}
