//! Directory streams: a tar.gz of a directory, read from descriptors.

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;
use flate2::Compression;
use nix::errno::Errno;
use nix::fcntl::{openat, readlinkat, AtFlags};
use nix::libc;
use nix::sys::stat::{fstat, fstatat, FileStat, Mode};

use crate::archive::Excludes;

use super::resolve::{dir_path_flags, is_type, list_dir, open_regular_at};
use super::ALWAYS_IGNORE;

/// A reader of exactly `size` bytes: the file's first bytes, then zeros if it shrank (a running
/// bundle's files change while they are archived; tar headers carry the size up front).
pub(super) struct ExactSize<R> {
    pub(super) inner: R,
    pub(super) left: u64,
}

impl<R: Read> Read for ExactSize<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        let mut n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            buf[..want].fill(0);
            n = want;
        }
        self.left -= n as u64;
        Ok(n)
    }
}

pub(super) fn tar_header(st: &FileStat, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(st.st_mode & 0o7777);
    h.set_uid(st.st_uid as u64);
    h.set_gid(st.st_gid as u64);
    h.set_mtime(st.st_mtime.max(0) as u64);
    h.set_size(size);
    h
}

/// A gzipped tar of directory `dir`, like `tar czf - -C dir .` with CodaLab's excludes:
/// `.git`, `._*` and `__MACOSX` anywhere, and the relative paths in `top_excludes`. Links are
/// stored as links; FIFOs, sockets and devices are left out.
pub(super) fn write_tar_gz<W: Write>(
    dir: OwnedFd,
    top_excludes: &HashSet<PathBuf>,
    out: W,
) -> io::Result<W> {
    let ignore = Excludes::new(&ALWAYS_IGNORE.map(String::from));
    let gz = GzEncoder::new(out, Compression::fast());
    let mut builder = tar::Builder::new(gz);
    let st = fstat(&dir)?;
    let mut h = tar_header(&st, tar::EntryType::Directory, 0);
    builder.append_data(&mut h, "./", io::empty())?;
    tar_dir(&mut builder, &dir, Path::new(""), &ignore, top_excludes)?;
    builder.into_inner()?.finish()
}

pub(super) fn tar_dir<W: Write>(
    builder: &mut tar::Builder<W>,
    dir: &OwnedFd,
    rel: &Path,
    ignore: &Excludes,
    top_excludes: &HashSet<PathBuf>,
) -> io::Result<()> {
    for name in list_dir(dir)? {
        let child = rel.join(&name);
        if ignore.matches(&child) || top_excludes.contains(&child) {
            continue;
        }
        let st = match fstatat(dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(e.into()),
        };
        if is_type(&st, libc::S_IFDIR) {
            let sub = match openat(dir, name.as_os_str(), dir_path_flags(), Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => continue,
                Err(e) => return Err(e.into()),
            };
            let mut h = tar_header(&st, tar::EntryType::Directory, 0);
            builder.append_data(&mut h, &child, io::empty())?;
            tar_dir(builder, &sub, &child, ignore, top_excludes)?;
        } else if is_type(&st, libc::S_IFREG) {
            let file = match open_regular_at(dir, &name) {
                Ok(Some(f)) => f,
                Ok(None) => continue,
                Err(e)
                    if e.kind() == io::ErrorKind::NotFound
                        || e.raw_os_error() == Some(libc::ELOOP) =>
                {
                    continue
                }
                Err(e) => return Err(e),
            };
            let fst = fstat(&file)?;
            let size = fst.st_size.max(0) as u64;
            let mut h = tar_header(&fst, tar::EntryType::Regular, size);
            let data = ExactSize {
                inner: file,
                left: size,
            };
            builder.append_data(&mut h, &child, data)?;
        } else if is_type(&st, libc::S_IFLNK) {
            let target = match readlinkat(dir, name.as_os_str()) {
                Ok(t) => t,
                Err(Errno::ENOENT | Errno::EINVAL) => continue,
                Err(e) => return Err(e.into()),
            };
            let mut h = tar_header(&st, tar::EntryType::Symlink, 0);
            builder.append_link(&mut h, &child, Path::new(&target))?;
        } else {
            tracing::debug!("not archiving special file {}", child.display());
        }
    }
    Ok(())
}
