//! Extraction of a tar stream into a directory through descriptors.
//!
//! Links are created exactly as the archive has them (absolute, relative, dangling: inside a
//! run's container they resolve in the container's own file system), and nothing is ever
//! written through one: every entry's parent is reached component by component with
//! `O_NOFOLLOW`, files are created with `O_EXCL | O_NOFOLLOW`, and an entry whose path leaves
//! the directory (`..`, absolute) is refused. Set-user-id, set-group-id and sticky bits are
//! dropped; owners are not restored. The bytes of file contents are capped.

use std::ffi::OsStr;
use std::fmt;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use flate2::read::GzDecoder;
use nix::sys::stat::{utimensat, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::linkat;

use super::{chmod_fd, Dir};

/// Why an extraction stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtractError {
    /// The stream is not a complete (gzipped) tar archive: a broken transfer may be the cause.
    Corrupt(String),
    /// An entry the worker will not create (its path leaves the directory, or a link is in
    /// its way).
    Refused(String),
    /// More file content than the limit allows.
    TooLarge(String),
    /// Writing failed (e.g. a full disk).
    Io(String),
}

impl fmt::Display for ExtractError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExtractError::Corrupt(m)
            | ExtractError::Refused(m)
            | ExtractError::TooLarge(m)
            | ExtractError::Io(m) => f.write_str(m),
        }
    }
}

/// Extracts a gzipped tar stream into `dest`; returns the bytes of file contents written.
pub fn extract_tar_gz<R: Read>(reader: R, dest: &Dir, limit: u64) -> Result<u64, ExtractError> {
    extract_tar(GzDecoder::new(reader), dest, limit, u64::MAX)
}

/// How many bytes of the work dir one entry stands for when a dependency's entries are capped
/// ([`extract_tar_gz_capped`] with `--max-work-dir-size / ENTRY_COST`): an inode, a directory's
/// block. Millions of empty files or links hold no bytes but fill a file system's inodes.
pub const ENTRY_COST: u64 = 512;

/// [`extract_tar_gz`] that also stops past `max_entries` entries.
pub fn extract_tar_gz_capped<R: Read>(
    reader: R,
    dest: &Dir,
    limit: u64,
    max_entries: u64,
) -> Result<u64, ExtractError> {
    extract_tar(GzDecoder::new(reader), dest, limit, max_entries)
}

/// The components of an entry's path, or `None` if it is absolute or climbs with `..`.
fn entry_components(raw: &Path) -> Option<Vec<&OsStr>> {
    let mut out = Vec::new();
    for c in raw.components() {
        match c {
            Component::CurDir => {}
            Component::Normal(n) => out.push(n),
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

fn mtime(secs: u64) -> TimeSpec {
    TimeSpec::new(secs.min(i64::MAX as u64) as i64, 0)
}

/// Sets the times of what `fd` names (a directory's `O_PATH` descriptor) without a path walk.
fn set_mtime_fd(dir: &Dir, secs: u64) {
    let path = format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&std::os::fd::AsFd::as_fd(dir))
    );
    let t = mtime(secs);
    let _ = utimensat(
        nix::fcntl::AT_FDCWD,
        path.as_str(),
        &t,
        &t,
        UtimensatFlags::FollowSymlink,
    );
}

struct Parents {
    last: Option<(PathBuf, Dir)>,
}

impl Parents {
    /// The directory `rel` of `dest` (created when missing), never through a link.
    fn get(&mut self, dest: &Dir, rel: &Path) -> io::Result<Dir> {
        if let Some((p, d)) = &self.last {
            if p == rel {
                return d.try_clone();
            }
        }
        let d = dest.create_dirs(rel, 0o700)?;
        self.last = Some((rel.to_owned(), d.try_clone()?));
        Ok(d)
    }
}

/// Extracts a tar stream into `dest`; returns the bytes of file contents written. FIFOs and
/// devices are skipped. Directory modes and times are applied at the end, deepest first, so
/// that a read-only directory does not stop its own contents.
pub fn extract_tar<R: Read>(
    reader: R,
    dest: &Dir,
    limit: u64,
    max_entries: u64,
) -> Result<u64, ExtractError> {
    let mut archive = tar::Archive::new(reader);
    let entries = archive
        .entries()
        .map_err(|e| ExtractError::Corrupt(format!("not a tar archive: {e}")))?;
    let mut written: u64 = 0;
    let mut count: u64 = 0;
    let mut parents = Parents { last: None };
    let mut dirs: Vec<(PathBuf, u32, u64)> = Vec::new();
    for entry in entries {
        let mut entry =
            entry.map_err(|e| ExtractError::Corrupt(format!("corrupt archive: {e}")))?;
        let raw = PathBuf::from(OsStr::from_bytes(&entry.path_bytes()));
        let refuse = |why: String| {
            ExtractError::Refused(format!("refusing archive entry {}: {why}", raw.display()))
        };
        let Some(comps) = entry_components(&raw) else {
            return Err(refuse("its path leaves the bundle".into()));
        };
        let Some((name, dir)) = comps.split_last() else {
            continue; // "./" itself
        };
        let dir_rel: PathBuf = dir.iter().collect();
        let rel: PathBuf = comps.iter().collect();
        count += 1;
        if count > max_entries {
            return Err(ExtractError::Refused(format!(
                "it holds more than {max_entries} entries (one per {ENTRY_COST} bytes of \
                 --max-work-dir-size)"
            )));
        }
        let header = entry.header();
        let kind = header.entry_type();
        // Readable (and, where the owner may, executable) by every user: a run under
        // `--run-as-user` is not the owner of the dependencies it must read. Set-id and sticky
        // bits are dropped.
        let mode = header.mode().unwrap_or(0o644) & 0o777;
        let mode = match kind.is_dir() {
            true => mode | 0o555,
            false if mode & 0o100 != 0 => mode | 0o555,
            false => mode | 0o444,
        };
        let secs = header.mtime().unwrap_or(0);
        let io_err = |e: io::Error| {
            if e.kind() == io::ErrorKind::Other {
                refuse(e.to_string())
            } else {
                ExtractError::Io(format!("cannot extract {}: {e}", raw.display()))
            }
        };
        let parent = parents.get(dest, &dir_rel).map_err(io_err)?;
        if kind.is_dir() {
            parent.create_dir(name, 0o700).map_err(io_err)?;
            dirs.push((rel, mode, secs));
        } else if kind.is_file()
            || kind == tar::EntryType::Continuous
            || kind == tar::EntryType::GNUSparse
        {
            let left = limit.saturating_sub(written);
            let mut file = parent.create_file(name, 0o600).map_err(io_err)?;
            let n = io::copy(&mut (&mut entry).take(left.saturating_add(1)), &mut file).map_err(
                |e| match e.kind() {
                    io::ErrorKind::UnexpectedEof | io::ErrorKind::InvalidData => {
                        ExtractError::Corrupt(format!("corrupt archive: {e}"))
                    }
                    _ => ExtractError::Io(format!("cannot extract {}: {e}", raw.display())),
                },
            )?;
            if n > left {
                return Err(ExtractError::TooLarge(format!(
                    "its contents are larger than the limit of {limit} bytes"
                )));
            }
            written += n;
            let _ = file.set_permissions(std::fs::Permissions::from_mode(mode));
            let t = mtime(secs);
            let _ = nix::sys::stat::futimens(&file, &t, &t);
        } else if kind.is_symlink() {
            let target = entry.link_name_bytes().ok_or_else(|| {
                ExtractError::Corrupt(format!("link {} has no target", raw.display()))
            })?;
            parent
                .symlink(OsStr::from_bytes(&target), name)
                .map_err(io_err)?;
            let t = mtime(secs);
            let _ = utimensat(&parent, *name, &t, &t, UtimensatFlags::NoFollowSymlink);
        } else if kind.is_hard_link() {
            let target = entry.link_name_bytes().ok_or_else(|| {
                ExtractError::Corrupt(format!("link {} has no target", raw.display()))
            })?;
            let target = PathBuf::from(OsStr::from_bytes(&target));
            let Some(tcomps) = entry_components(&target) else {
                return Err(refuse(format!(
                    "its link to {} leaves the bundle",
                    target.display()
                )));
            };
            let Some((tname, tdir)) = tcomps.split_last() else {
                return Err(refuse("a hard link to the root".into()));
            };
            let tparent = dest
                .beneath(&tdir.iter().collect::<PathBuf>())
                .map_err(io_err)?;
            let link = || {
                linkat(
                    &tparent,
                    *tname,
                    &parent,
                    *name,
                    nix::fcntl::AtFlags::empty(),
                )
            };
            match link() {
                Err(nix::errno::Errno::EEXIST) => {
                    parent.remove_non_dir(name).map_err(io_err)?;
                    link()
                }
                r => r,
            }
            .map_err(|e| io_err(e.into()))?;
        } else {
            tracing::debug!("skipping special archive entry {}", raw.display());
        }
    }
    // Deepest first: a directory's own mode cannot stop what is below it any more.
    dirs.sort_by_key(|(rel, _, _)| std::cmp::Reverse(rel.components().count()));
    for (rel, mode, secs) in dirs {
        let d = dest
            .beneath(&rel)
            .map_err(|e| ExtractError::Io(format!("cannot finish {}: {e}", rel.display())))?;
        let _ = chmod_fd(std::os::fd::AsFd::as_fd(&d), mode);
        set_mtime_fd(&d, secs);
    }
    Ok(written)
}
