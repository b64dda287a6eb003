//! Host-side file operations on bundle contents that never follow a link.
//!
//! A bundle's files come from its user: a link in them may point anywhere (absolute, dangling,
//! or climbing through another link), and a running container can change its bundle dir while
//! the worker looks at it. Inside the run's container a link resolves in the container's own
//! file system, which is harmless; on the host it must never be resolved. So everything the
//! worker does to bundle contents goes through directory descriptors: each path component is
//! opened with `O_NOFOLLOW` relative to its parent, no path of more than one component reaches
//! the kernel, and trees deeper than `PATH_MAX` work like any other.
//!
//! - [`Dir`]: a directory descriptor and the one-component operations on it;
//! - [`walk`]: a pre-order walk of a tree that holds one descriptor whatever the depth;
//! - [`tree`]: sizes, removal, permissions (built on the walk);
//! - [`extract`]: tar extraction (dependencies);
//! - [`archive`]: tar writing (results upload, directory reads).

pub mod archive;
pub mod extract;
pub mod tree;
pub mod walk;

use std::ffi::{CStr, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Component, Path};

use nix::errno::Errno;
use nix::fcntl::{openat, readlinkat, AtFlags, OFlag, AT_FDCWD};
use nix::libc;
use nix::sys::stat::{fstat, fstatat, mkdirat, FileStat, Mode};
use nix::unistd::{symlinkat, unlinkat, UnlinkatFlags};

/// The kind of a file, from its `lstat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Link,
    /// FIFOs, sockets, devices: never opened.
    Special,
}

pub fn kind(st: &FileStat) -> Kind {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => Kind::Dir,
        libc::S_IFREG => Kind::File,
        libc::S_IFLNK => Kind::Link,
        _ => Kind::Special,
    }
}

/// An identity of a file: (device, inode).
pub fn identity(st: &FileStat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

/// `ELOOP` or `ENOTDIR`: a link (or a file) where a directory was expected.
fn is_not_dir(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR))
}

/// A link met where a directory was expected: never followed.
pub fn link_error(what: &Path) -> io::Error {
    io::Error::other(format!(
        "{} is a link, which the worker does not follow on the host",
        what.display()
    ))
}

/// An open directory (an `O_PATH` descriptor).
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
}

fn dir_flags() -> OFlag {
    OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Dir {
    /// Opens a directory the worker itself names (its work dir, a run's bundle dir, the
    /// dependency cache): links in the operator's part of the path are the kernel's business,
    /// but the directory itself must not be a link.
    pub fn open(path: &Path) -> io::Result<Dir> {
        let fd = openat(AT_FDCWD, path, dir_flags(), Mode::empty()).map_err(|e| match e {
            Errno::ELOOP | Errno::ENOTDIR if is_link_at(AT_FDCWD, path) => link_error(path),
            e => io::Error::from(e),
        })?;
        Ok(Dir { fd })
    }

    pub fn try_clone(&self) -> io::Result<Dir> {
        Ok(Dir {
            fd: self.fd.try_clone()?,
        })
    }

    pub fn stat(&self) -> io::Result<FileStat> {
        Ok(fstat(&self.fd)?)
    }

    /// Gives this directory (not what a path to it may name by then) to `uid:gid`.
    pub fn chown(&self, uid: u32, gid: u32) -> io::Result<()> {
        // (`AT_EMPTY_PATH`: the descriptor itself, which may be an `O_PATH` one.)
        nix::unistd::fchownat(
            &self.fd,
            "",
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
            AtFlags::AT_EMPTY_PATH,
        )?;
        Ok(())
    }

    /// `lstat` of entry `name`; `None` when there is none.
    pub fn entry(&self, name: &OsStr) -> io::Result<Option<FileStat>> {
        match fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Sub-directory `name`; a link there is an error (`ELOOP` or `ENOTDIR`), never followed.
    pub fn open_dir(&self, name: &OsStr) -> io::Result<Dir> {
        let fd = openat(&self.fd, name, dir_flags(), Mode::empty())?;
        Ok(Dir { fd })
    }

    /// The parent directory (`..`), for walks that climb back up.
    fn parent(&self) -> io::Result<Dir> {
        let fd = openat(
            &self.fd,
            "..",
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Dir { fd })
    }

    /// The directory at relative path `rel` (normal components only), reached without
    /// following any link.
    pub fn beneath(&self, rel: &Path) -> io::Result<Dir> {
        self.walk_down(rel, None)
    }

    /// Like [`Dir::beneath`], creating missing directories (mode `mode`) on the way; an
    /// existing link on the way is an error.
    pub fn create_dirs(&self, rel: &Path, mode: u32) -> io::Result<Dir> {
        self.walk_down(rel, Some(mode))
    }

    /// Opens `rel` one component at a time, each with `O_NOFOLLOW`; with `create`, missing
    /// directories are made with that mode first. A link or a file on the way is an error
    /// naming it.
    fn walk_down(&self, rel: &Path, create: Option<u32>) -> io::Result<Dir> {
        let mut cur = self.try_clone()?;
        let mut walked = std::path::PathBuf::new();
        for c in normal_components(rel)? {
            walked.push(c);
            if let Some(mode) = create {
                match mkdirat(&cur.fd, c, Mode::from_bits_truncate(mode)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            cur = match cur.open_dir(c) {
                Ok(d) => d,
                Err(e) if is_not_dir(&e) => {
                    return Err(match cur.entry(c)? {
                        Some(st) if kind(&st) == Kind::Link => link_error(&walked),
                        _ => io::Error::other(format!("{} is not a directory", walked.display())),
                    })
                }
                Err(e) => return Err(e),
            };
        }
        Ok(cur)
    }

    /// Creates directory `name` (mode `mode`); one that exists (not a link) is fine.
    pub fn create_dir(&self, name: &OsStr, mode: u32) -> io::Result<Dir> {
        self.create_dirs(Path::new(name), mode)
    }

    /// Entry names (without `.` and `..`), sorted.
    pub fn list(&self) -> io::Result<Vec<OsString>> {
        list(&self.fd)
    }

    /// Opens regular file `name` for reading; `None` for anything else (not opened).
    pub fn open_file(&self, name: &OsStr) -> io::Result<Option<File>> {
        open_file_at(&self.fd, name)
    }

    /// Creates regular file `name` for writing, replacing a file or link there (never writing
    /// through it); a directory there is an error.
    pub fn create_file(&self, name: &OsStr, mode: u32) -> io::Result<File> {
        let open = || {
            openat(
                &self.fd,
                name,
                OFlag::O_WRONLY
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(mode),
            )
        };
        let fd = match open() {
            Err(Errno::EEXIST) => {
                self.remove_non_dir(name)?;
                open()?
            }
            r => r?,
        };
        Ok(File::from(fd))
    }

    /// Creates link `name` -> `target` (the target kept exactly), replacing a file or link.
    pub fn symlink(&self, target: &OsStr, name: &OsStr) -> io::Result<()> {
        match symlinkat(target, &self.fd, name) {
            Err(Errno::EEXIST) => {
                self.remove_non_dir(name)?;
                Ok(symlinkat(target, &self.fd, name)?)
            }
            r => Ok(r?),
        }
    }

    pub fn readlink(&self, name: &OsStr) -> io::Result<OsString> {
        Ok(readlinkat(&self.fd, name)?)
    }

    pub fn remove_non_dir(&self, name: &OsStr) -> io::Result<()> {
        match self.entry(name)? {
            Some(st) if kind(&st) == Kind::Dir => Err(io::Error::other(format!(
                "{} is a directory",
                Path::new(name).display()
            ))),
            Some(_) => match unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => Ok(()),
                Err(e) => Err(e.into()),
            },
            None => Ok(()),
        }
    }

    /// Removes entry `name` whatever it is (a tree is removed without following any link);
    /// one that is gone is fine.
    pub fn remove(&self, name: &OsStr) -> io::Result<()> {
        match self.entry(name)? {
            None => Ok(()),
            Some(st) if kind(&st) == Kind::Dir => tree::remove_dir(self, name),
            Some(_) => match unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => Ok(()),
                Err(e) => Err(e.into()),
            },
        }
    }

    /// Renames entry `name` to `to`/`to_name` (the entry itself, never what a link names).
    pub fn rename(&self, name: &OsStr, to: &Dir, to_name: &OsStr) -> io::Result<()> {
        Ok(nix::fcntl::renameat(&self.fd, name, &to.fd, to_name)?)
    }

    /// Sets the mode of this directory (through its descriptor, never a path).
    pub fn chmod(&self, mode: u32) -> io::Result<()> {
        chmod_fd(self.fd.as_fd(), mode)
    }
}

impl From<OwnedFd> for Dir {
    /// A directory descriptor opened elsewhere (with `O_PATH | O_DIRECTORY`).
    fn from(fd: OwnedFd) -> Dir {
        Dir { fd }
    }
}

/// Entry names of directory `fd` (an `O_PATH` descriptor will do), without `.` and `..`,
/// sorted.
pub fn list(fd: impl AsFd) -> io::Result<Vec<OsString>> {
    Ok(list_at_most(fd, usize::MAX)?.unwrap_or_default())
}

/// The names in directory `fd` (sorted), or `None` as soon as it holds more than `max`: a
/// directory of millions of entries is never held whole.
pub fn list_at_most(fd: impl AsFd, max: usize) -> io::Result<Option<Vec<OsString>>> {
    list_within(fd, max, usize::MAX)
}

/// As [`list_at_most`], and `None` as well as soon as the names take more than `max_bytes`.
pub fn list_within(
    fd: impl AsFd,
    max: usize,
    max_bytes: usize,
) -> io::Result<Option<Vec<OsString>>> {
    let dir = openat(
        fd,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let raw = dir.into_raw_fd();
    // SAFETY: `raw` is an open directory descriptor whose ownership passes to the DIR stream,
    // which closedir releases; each entry's name is copied out before the next readdir call.
    unsafe {
        let dp = libc::fdopendir(raw);
        if dp.is_null() {
            let e = io::Error::last_os_error();
            libc::close(raw);
            return Err(e);
        }
        let mut names = Vec::new();
        let mut bytes = 0usize;
        let result = loop {
            Errno::clear();
            let ent = libc::readdir(dp);
            if ent.is_null() {
                match Errno::last_raw() {
                    0 => break Ok(true),
                    e => break Err(io::Error::from_raw_os_error(e)),
                }
            }
            let name = CStr::from_ptr((*ent).d_name.as_ptr()).to_bytes();
            if name != b"." && name != b".." {
                bytes = bytes.saturating_add(name.len());
                if names.len() == max || bytes > max_bytes {
                    break Ok(false);
                }
                names.push(OsString::from_vec(name.to_vec()));
            }
        };
        libc::closedir(dp);
        result.map(|whole| {
            names.sort();
            whole.then_some(names)
        })
    }
}

/// Opens regular file `name` of directory `dir` for reading; `None` for anything else, which is
/// not opened (`O_NOFOLLOW`; `O_NONBLOCK` so that a FIFO does not block the open).
pub fn open_file_at(dir: impl AsFd, name: &OsStr) -> io::Result<Option<File>> {
    let fd = openat(
        dir,
        name,
        OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    if kind(&fstat(&fd)?) != Kind::File {
        return Ok(None);
    }
    Ok(Some(File::from(fd)))
}

/// Sets the mode of an `O_PATH` (or any) descriptor's file through `/proc/self/fd`, which names
/// the open file itself: no path is resolved again.
pub fn chmod_fd(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    Ok(nix::sys::stat::fchmodat(
        AT_FDCWD,
        path.as_str(),
        Mode::from_bits_truncate(mode),
        nix::sys::stat::FchmodatFlags::FollowSymlink,
    )?)
}

fn is_link_at(dir: impl AsFd, path: &Path) -> bool {
    fstatat(dir, path, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok_and(|st| kind(&st) == Kind::Link)
}

/// The components of a relative path that must not climb (`..`) nor be absolute.
pub fn normal_components(rel: &Path) -> io::Result<Vec<&OsStr>> {
    let mut out = Vec::new();
    for c in rel.components() {
        match c {
            Component::CurDir => {}
            Component::Normal(n) => out.push(n),
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(io::Error::other(format!(
                    "{} leaves its directory",
                    rel.display()
                )))
            }
        }
    }
    Ok(out)
}

/// One path component that names an entry (not empty, `.`, `..`, nor with a `/`).
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

#[cfg(test)]
mod tests;
