//! tar.gz in and out: safe extraction of downloaded dependencies and streamed archives of run
//! results. Blocking code, run on tokio's blocking pool.

use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use tokio::sync::mpsc;

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

/// Extracts a gzipped tar stream into `dest` (created). Refuses, with a clear message, any entry
/// whose path is absolute or climbs out with `..`, and any link whose target is absolute or
/// resolves outside `dest`. Device files and FIFOs are skipped. Nothing is written outside
/// `dest`.
pub fn extract_tar_gz<R: Read>(reader: R, dest: &Path) -> Result<(), String> {
    extract_tar(GzDecoder::new(reader), dest)
}

pub fn extract_tar<R: Read>(reader: R, dest: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dest).map_err(|e| format!("cannot create {}: {e}", dest.display()))?;
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_unpack_xattrs(false);
    let entries = archive
        .entries()
        .map_err(|e| format!("not a tar archive: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("corrupt archive: {e}"))?;
        let raw = entry
            .path()
            .map_err(|e| format!("bad entry name: {e}"))?
            .into_owned();
        let rel = normalize_relative(&raw).filter(|_| {
            !raw.components()
                .any(|c| matches!(c, Component::ParentDir | Component::RootDir))
        });
        let Some(rel) = rel else {
            return Err(format!(
                "refusing archive entry {}: its path leaves the bundle",
                raw.display()
            ));
        };
        if rel.as_os_str().is_empty() {
            continue; // "./" itself
        }
        let kind = entry.header().entry_type();
        if kind.is_symlink() || kind.is_hard_link() {
            let target = entry
                .link_name()
                .map_err(|e| format!("bad link in {}: {e}", raw.display()))?
                .map(|t| t.into_owned())
                .unwrap_or_default();
            let resolved = if kind.is_symlink() {
                if target.is_absolute() {
                    None
                } else {
                    let parent = rel.parent().unwrap_or(Path::new(""));
                    normalize_relative(&parent.join(&target))
                }
            } else {
                normalize_relative(&target)
            };
            if resolved.is_none() {
                return Err(format!(
                    "refusing archive entry {}: link to {} points outside the bundle",
                    raw.display(),
                    target.display()
                ));
            }
        } else if !(kind.is_file() || kind.is_dir() || kind == tar::EntryType::Continuous) {
            tracing::debug!("skipping special archive entry {}", raw.display());
            continue;
        }
        let ok = entry
            .unpack_in(dest)
            .map_err(|e| format!("cannot extract {}: {e}", raw.display()))?;
        if !ok {
            return Err(format!(
                "refusing archive entry {}: its path leaves the bundle",
                raw.display()
            ));
        }
    }
    Ok(())
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

/// Writes a gzipped tar of `root` (entries named `./…`, symlinks stored as links, never
/// followed), skipping excluded paths. Returns the writer.
pub fn write_tar_gz<W: Write>(root: &Path, excludes: &Excludes, out: W) -> io::Result<W> {
    let gz = GzEncoder::new(out, Compression::fast());
    let mut builder = tar::Builder::new(gz);
    builder.follow_symlinks(false);
    builder.mode(tar::HeaderMode::Complete);
    append_dir(&mut builder, root, Path::new(""), excludes)?;
    let gz = builder.into_inner()?;
    gz.finish()
}

fn append_dir<W: Write>(
    builder: &mut tar::Builder<W>,
    root: &Path,
    rel: &Path,
    excludes: &Excludes,
) -> io::Result<()> {
    let dir = root.join(rel);
    let mut names: Vec<_> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    names.sort();
    for name in names {
        let child_rel = rel.join(&name);
        if excludes.matches(&child_rel) {
            continue;
        }
        let full = root.join(&child_rel);
        let meta = match std::fs::symlink_metadata(&full) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let name_in_tar = Path::new(".").join(&child_rel);
        builder.append_path_with_name(&full, &name_in_tar)?;
        if meta.is_dir() {
            append_dir(builder, root, &child_rel, excludes)?;
        }
    }
    Ok(())
}

/// Size of a tree in bytes, symlinks not followed (their own size counts).
pub fn path_size(path: &Path) -> io::Result<u64> {
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.is_dir() {
        return Ok(meta.len());
    }
    let mut total = meta.len();
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        match path_size(&entry.path()) {
            Ok(n) => total += n,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(total)
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
    use std::fs;

    fn tar_gz(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        let raw = b.into_inner().unwrap();
        let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
        gz.write_all(&raw).unwrap();
        gz.finish().unwrap()
    }

    fn file_header(size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_size(size);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        h
    }

    /// Writes a raw name into the header, bypassing the builder's own checks.
    fn raw_name(h: &mut tar::Header, name: &str) {
        let gnu = h.as_gnu_mut().unwrap();
        gnu.name = [0; 100];
        gnu.name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_cksum();
    }

    fn symlink(b: &mut tar::Builder<Vec<u8>>, name: &str, target: &str) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_mode(0o777);
        b.append_link(&mut h, name, target).unwrap();
    }

    #[test]
    fn round_trip_with_symlink_and_excludes() {
        let src = tempfile::tempdir().unwrap();
        fs::create_dir_all(src.path().join("sub/logs")).unwrap();
        fs::write(src.path().join("stdout"), "hello\n").unwrap();
        fs::write(src.path().join("sub/data.bin"), vec![7u8; 200_000]).unwrap();
        fs::write(src.path().join("sub/logs/x.log"), "x").unwrap();
        std::os::unix::fs::symlink("stdout", src.path().join("link")).unwrap();
        let ex = Excludes::new(&["*.log".into()]);
        let bytes = write_tar_gz(src.path(), &ex, Vec::new()).unwrap();
        let dst = tempfile::tempdir().unwrap();
        extract_tar_gz(&bytes[..], dst.path()).unwrap();
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
    }

    #[test]
    fn refuses_parent_dir_entries() {
        let data = tar_gz(|b| {
            let mut h = file_header(4);
            raw_name(&mut h, "../evil");
            b.append(&h, &b"evil"[..]).unwrap();
        });
        let root = tempfile::tempdir().unwrap();
        let dst = root.path().join("bundle");
        let e = extract_tar_gz(&data[..], &dst).unwrap_err();
        assert!(e.contains("leaves the bundle"), "{e}");
        assert!(!root.path().join("evil").exists());
    }

    #[test]
    fn refuses_absolute_entries() {
        let data = tar_gz(|b| {
            let mut h = file_header(4);
            raw_name(&mut h, "/tmp/clw-abs-evil");
            b.append(&h, &b"evil"[..]).unwrap();
        });
        let dst = tempfile::tempdir().unwrap();
        let e = extract_tar_gz(&data[..], dst.path()).unwrap_err();
        assert!(e.contains("leaves the bundle"), "{e}");
        assert!(!Path::new("/tmp/clw-abs-evil").exists());
    }

    #[test]
    fn refuses_links_pointing_outside() {
        for target in ["/etc/passwd", "../../etc", "a/../../x"] {
            let data = tar_gz(|b| symlink(b, "l", target));
            let dst = tempfile::tempdir().unwrap();
            let e = extract_tar_gz(&data[..], dst.path()).unwrap_err();
            assert!(e.contains("points outside the bundle"), "{target}: {e}");
            assert!(fs::symlink_metadata(dst.path().join("l")).is_err());
        }
        // A link that stays inside is fine.
        let data = tar_gz(|b| symlink(b, "d/l", "../f"));
        let dst = tempfile::tempdir().unwrap();
        extract_tar_gz(&data[..], dst.path()).unwrap();
    }

    #[test]
    fn refuses_writing_through_a_symlinked_dir() {
        // "d" -> "." is inside; writing "d/../../x" is refused by the path check, and a file
        // under a link to outside can't exist because such links are refused first.
        let data = tar_gz(|b| {
            symlink(b, "d", ".");
            let mut h = file_header(1);
            raw_name(&mut h, "d/../../x");
            b.append(&h, &b"x"[..]).unwrap();
        });
        let root = tempfile::tempdir().unwrap();
        let dst = root.path().join("b");
        assert!(extract_tar_gz(&data[..], &dst).is_err());
        assert!(!root.path().join("x").exists());
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

    #[test]
    fn sizes_do_not_follow_symlinks() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("f"), vec![0u8; 5000]).unwrap();
        std::os::unix::fs::symlink("/usr", d.path().join("l")).unwrap();
        let n = path_size(d.path()).unwrap();
        assert!((5000..5000 + 4096 * 4).contains(&n), "{n}");
    }
}
