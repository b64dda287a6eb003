//! Paths inside a bundle: lexical normalisation and component-by-component resolution that
//! never leaves the bundle.

use std::collections::{HashSet, VecDeque};
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use nix::errno::Errno;
use nix::fcntl::{openat, readlinkat, AtFlags, OFlag};
use nix::libc;
use nix::sys::stat::{fstat, fstatat, FileStat, Mode};

use super::{Failure, Target};

/// Lexically normalises a subpath like `os.path.normpath` on `bundle + "/" + subpath`: empty and
/// `.` components go, `..` removes the previous one. A leading `/` does not make the path
/// absolute (it stays inside the bundle). `None` if `..` climbs above the bundle.
pub fn normalize(subpath: &str) -> Option<Vec<OsString>> {
    let mut out: Vec<OsString> = Vec::new();
    for c in subpath.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            c => out.push(OsString::from(c)),
        }
    }
    Some(out)
}

pub(super) fn join(comps: &[OsString]) -> PathBuf {
    comps.iter().collect()
}

/// Where a resolved path ends.
pub(super) enum Node {
    /// The path names a directory reached through the walk itself (the bundle root, or a path
    /// whose last step came from a link target's `..`).
    Dir(OwnedFd),
    /// Entry `name` of directory `parent` (not looked at: it may not exist, or be a link).
    Entry { parent: OwnedFd, name: OsString },
}

#[derive(Debug, PartialEq)]
pub(super) enum Resolve {
    /// Leaves the bundle (through `..` or a link).
    Escapes,
    /// A component is missing or is not a directory.
    Missing,
    Io(Errno),
}

pub(super) const MAX_LINKS: usize = 40;

pub(super) fn dir_path_flags() -> OFlag {
    OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

pub(super) fn is_type(st: &FileStat, kind: libc::mode_t) -> bool {
    st.st_mode & libc::S_IFMT == kind
}

/// Walks `comps` from the directory `root`, never leaving it. Links on the way are followed
/// when relative and staying inside; the last component is followed only with `follow_last`.
pub(super) fn resolve(
    root: &OwnedFd,
    comps: &[OsString],
    follow_last: bool,
) -> Result<Node, Resolve> {
    let mut stack: Vec<OwnedFd> = vec![root.try_clone().map_err(io_errno)?];
    let mut queue: VecDeque<OsString> = comps.iter().cloned().collect();
    let mut links = 0;
    while let Some(name) = queue.pop_front() {
        let b = name.as_bytes();
        if b.is_empty() || b == b"." {
            continue;
        }
        if b == b".." {
            if stack.len() == 1 {
                return Err(Resolve::Escapes);
            }
            stack.pop();
            continue;
        }
        let top = stack.last().unwrap();
        let last = queue.is_empty();
        if last && !follow_last {
            return Ok(Node::Entry {
                parent: top.try_clone().map_err(io_errno)?,
                name,
            });
        }
        let st = match fstatat(top, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) if last => {
                return Ok(Node::Entry {
                    parent: top.try_clone().map_err(io_errno)?,
                    name,
                })
            }
            Err(Errno::ENOENT | Errno::ENOTDIR) => return Err(Resolve::Missing),
            Err(e) => return Err(Resolve::Io(e)),
        };
        if is_type(&st, libc::S_IFLNK) {
            links += 1;
            if links > MAX_LINKS {
                return Err(Resolve::Io(Errno::ELOOP));
            }
            let target = readlinkat(top, name.as_os_str()).map_err(Resolve::Io)?;
            let tb = target.as_bytes();
            if tb.starts_with(b"/") {
                return Err(Resolve::Escapes);
            }
            for part in tb.split(|&c| c == b'/').rev() {
                queue.push_front(OsString::from_vec(part.to_vec()));
            }
            continue;
        }
        if last {
            return Ok(Node::Entry {
                parent: top.try_clone().map_err(io_errno)?,
                name,
            });
        }
        if !is_type(&st, libc::S_IFDIR) {
            return Err(Resolve::Missing);
        }
        match openat(top, name.as_os_str(), dir_path_flags(), Mode::empty()) {
            Ok(fd) => stack.push(fd),
            // Replaced meanwhile (by a link, say): treat as absent.
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => return Err(Resolve::Missing),
            Err(e) => return Err(Resolve::Io(e)),
        }
    }
    Ok(Node::Dir(stack.pop().unwrap()))
}

pub(super) fn io_errno(e: io::Error) -> Resolve {
    Resolve::Io(Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
}

pub(super) use crate::nofollow::open_file_at as open_regular_at;

/// The bundle directory of a run, opened.
pub(super) struct Bundle<'a> {
    pub(super) t: &'a Target,
    root: OwnedFd,
    pub(super) deps: Vec<Vec<OsString>>,
}

impl<'a> Bundle<'a> {
    pub(super) fn open(t: &'a Target) -> Result<Self, Failure> {
        let root = openat(
            nix::fcntl::AT_FDCWD,
            t.bundle_path.as_path(),
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::ENOENT => Failure::not_found(format!("Path '' in bundle {} not found", t.uuid)),
            e => Failure::internal(format!("cannot open the bundle directory: {e}")),
        })?;
        let deps = t
            .dependency_paths
            .iter()
            .filter_map(|p| normalize(p))
            .filter(|p| !p.is_empty())
            .collect();
        Ok(Bundle { t, root, deps })
    }

    pub(super) fn name(&self) -> String {
        std::fs::canonicalize(&self.t.bundle_path)
            .unwrap_or_else(|_| self.t.bundle_path.clone())
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    pub(super) fn error_path(&self, subpath: &str) -> String {
        if subpath.is_empty() {
            self.t.uuid.clone()
        } else {
            format!("{}/{}", self.t.uuid, subpath)
        }
    }

    pub(super) fn not_found(&self, subpath: &str) -> Failure {
        Failure::not_found(format!(
            "Path '{subpath}' in bundle {} not found",
            self.t.uuid
        ))
    }

    pub(super) fn dependency_set(&self) -> HashSet<PathBuf> {
        self.deps.iter().map(|d| join(d)).collect()
    }

    pub(super) fn is_dependency(&self, comps: &[OsString]) -> bool {
        self.deps.iter().any(|d| d == comps)
    }

    /// Normalised components of `subpath`, or the "not inside the bundle" 404.
    pub(super) fn components(&self, subpath: &str) -> Result<Vec<OsString>, Failure> {
        normalize(subpath).ok_or_else(|| {
            Failure::not_found(format!(
                "{} is not inside the bundle.",
                self.error_path(subpath)
            ))
        })
    }

    pub(super) fn resolve(&self, subpath: &str, follow_last: bool) -> Result<Node, Failure> {
        let comps = self.components(subpath)?;
        resolve(&self.root, &comps, follow_last).map_err(|e| match e {
            Resolve::Escapes | Resolve::Missing => self.not_found(subpath),
            Resolve::Io(e) => Failure::internal(format!("{}: {e}", self.error_path(subpath))),
        })
    }

    /// `lstat` of what a path names, or its 404.
    pub(super) fn stat(&self, subpath: &str, node: &Node) -> Result<FileStat, Failure> {
        let r = match node {
            Node::Dir(fd) => fstat(fd),
            Node::Entry { parent, name } => {
                fstatat(parent, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            }
        };
        r.map_err(|e| match e {
            Errno::ENOENT | Errno::ENOTDIR => self.not_found(subpath),
            e => Failure::internal(format!("{}: {e}", self.error_path(subpath))),
        })
    }

    pub(super) fn symlink_refused(&self, subpath: &str) -> Failure {
        Failure::not_found(format!(
            "{} is a symlink and following symlinks is not allowed.",
            self.error_path(subpath)
        ))
    }

    /// The directory a path names (not a link), and whether it is the bundle root.
    pub(super) fn open_directory(&self, subpath: &str) -> Result<(OwnedFd, bool), Failure> {
        let at_root = self.components(subpath)?.is_empty();
        let node = self.resolve(subpath, false)?;
        let st = self.stat(subpath, &node)?;
        if is_type(&st, libc::S_IFLNK) {
            return Err(self.symlink_refused(subpath));
        }
        if !is_type(&st, libc::S_IFDIR) {
            return Err(Failure::bad_request(format!(
                "{} is not a directory",
                self.error_path(subpath)
            )));
        }
        let fd = match node {
            Node::Dir(fd) => fd,
            Node::Entry { parent, name } => {
                openat(&parent, name.as_os_str(), dir_path_flags(), Mode::empty()).map_err(|e| {
                    match e {
                        Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP => self.not_found(subpath),
                        e => Failure::internal(format!("{}: {e}", self.error_path(subpath))),
                    }
                })?
            }
        };
        Ok((fd, at_root))
    }

    /// The regular file a path names (not a link), opened for reading.
    pub(super) fn open_file(&self, subpath: &str) -> Result<File, Failure> {
        self.open_file_if_present(subpath)?
            .ok_or_else(|| self.not_found(subpath))
    }

    /// Like `open_file`, but `None` when nothing is at the path (also when a link on the way
    /// leads nowhere or out of the bundle). A path that leaves the bundle through `..` is still
    /// an error.
    pub(super) fn open_file_if_present(&self, subpath: &str) -> Result<Option<File>, Failure> {
        let comps = self.components(subpath)?;
        let node = match resolve(&self.root, &comps, false) {
            Ok(node) => node,
            Err(Resolve::Escapes | Resolve::Missing) => return Ok(None),
            Err(Resolve::Io(e)) => {
                return Err(Failure::internal(format!(
                    "{}: {e}",
                    self.error_path(subpath)
                )))
            }
        };
        let st = match self.stat(subpath, &node) {
            Ok(st) => st,
            Err(f) if f.code == 404 => return Ok(None),
            Err(f) => return Err(f),
        };
        if is_type(&st, libc::S_IFLNK) {
            return Err(self.symlink_refused(subpath));
        }
        let not_file = || {
            Failure::bad_request(format!(
                "{} is not a regular file",
                self.error_path(subpath)
            ))
        };
        let Node::Entry { parent, name } = node else {
            return Err(not_file());
        };
        if !is_type(&st, libc::S_IFREG) {
            return Err(not_file());
        }
        match open_regular_at(&parent, &name) {
            Ok(Some(f)) => Ok(Some(f)),
            Ok(None) => Err(not_file()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Err(self.symlink_refused(subpath)),
            Err(e) => Err(Failure::internal(format!(
                "{}: {e}",
                self.error_path(subpath)
            ))),
        }
    }
}
