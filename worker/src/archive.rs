//! Streamed archives of run results (the tar itself is written by [`crate::nofollow::archive`]),
//! GNU-tar-like exclude patterns, and the lexical normalisation of relative paths. Blocking
//! code, run on tokio's blocking pool.

use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use flate2::write::GzEncoder;
use flate2::Compression;
use tokio::sync::mpsc;

use crate::nofollow::archive::append_tree;
use crate::nofollow::Dir;

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
/// links stored as links and never followed, any depth), leaving out excluded paths. Returns the
/// writer.
pub fn write_tar_gz<W: Write>(root: &Dir, excludes: &Excludes, out: W) -> io::Result<W> {
    let gz = GzEncoder::new(out, Compression::fast());
    let mut builder = tar::Builder::new(gz);
    append_tree(&mut builder, root, |rel| excludes.matches(rel))?;
    builder.into_inner()?.finish()
}

/// A `Write` that hands 64 KiB chunks to an async receiver (a streamed HTTP body), counting the
/// bytes sent. Writing fails once the receiver is gone, which stops the archiver.
pub struct ChannelWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
    sent: Arc<AtomicU64>,
}

const CHUNK: usize = 64 * 1024;

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
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        let n = chunk.len() as u64;
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "upload stopped"))?;
        self.sent.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    /// Reports an archiving error to the receiver (the HTTP body then fails).
    pub fn fail(self, e: io::Error) {
        let _ = self.tx.blocking_send(Err(e));
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
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
        let bytes = write_tar_gz(&Dir::open(src.path()).unwrap(), &ex, Vec::new()).unwrap();
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
