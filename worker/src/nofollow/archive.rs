//! Tar archives of a tree, read through descriptors: links stored as links, never followed;
//! FIFOs, sockets and devices left out; any depth.

use std::io::{self, Read, Write};
use std::path::Path;

use nix::sys::stat::{fstat, FileStat};

use super::walk::{walk, Step};
use super::{Dir, Kind};

/// A reader of exactly `size` bytes: the file's first bytes, then zeros if it shrank (a running
/// bundle's files change while they are archived; tar headers carry the size up front).
pub struct ExactSize<R> {
    pub inner: R,
    pub left: u64,
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

/// A writer that takes a file's bytes from its reader itself: [`append_tree`] hands it each
/// file's reader, so that a writer with buffers of its own reads straight into them.
pub trait ReadInto: Write {
    /// Writes what `r` gives until its end; returns how many bytes that was.
    fn read_into(&mut self, r: &mut dyn Read) -> io::Result<u64>
    where
        Self: Sized,
    {
        io::copy(r, self)
    }
}

impl ReadInto for Vec<u8> {}

/// A GNU tar header for a file of this `stat`.
pub fn header(st: &FileStat, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(st.st_mode & 0o7777);
    h.set_uid(st.st_uid as u64);
    h.set_gid(st.st_gid as u64);
    h.set_mtime(st.st_mtime.max(0) as u64);
    h.set_size(size);
    h
}

/// Appends every entry below `root` (not `root` itself), named by its path relative to `root`,
/// parents first and names sorted. An entry for which `skip` holds is left out with everything
/// below it.
pub fn append_tree<W: ReadInto>(
    builder: &mut tar::Builder<W>,
    root: &Dir,
    skip: impl Fn(&Path) -> bool,
) -> io::Result<()> {
    walk(root, |e| {
        if skip(e.rel) {
            return Ok(Step::Skip);
        }
        match e.kind() {
            Kind::Dir => {
                let mut h = header(e.stat, tar::EntryType::Directory, 0);
                builder.append_data(&mut h, e.rel, io::empty())?;
                Ok(Step::Descend)
            }
            Kind::File => {
                let file = match e.parent.open_file(e.name) {
                    Ok(Some(f)) => f,
                    // Replaced by something else, or gone, since it was listed.
                    Ok(None) => return Ok(Step::Skip),
                    Err(err)
                        if matches!(
                            err.raw_os_error(),
                            Some(nix::libc::ENOENT | nix::libc::ELOOP)
                        ) =>
                    {
                        return Ok(Step::Skip)
                    }
                    Err(err) => return Err(err),
                };
                let st = fstat(&file)?;
                let size = st.st_size.max(0) as u64;
                let mut h = header(&st, tar::EntryType::Regular, size);
                // The header (behind a long name's own entry if need be) through `tar`, which
                // pads nothing after no data; the bytes and their padding to 512 here.
                builder.append_data(&mut h, e.rel, io::empty())?;
                let out = builder.get_mut();
                let n = out.read_into(&mut ExactSize {
                    inner: file,
                    left: size,
                })?;
                let pad = (512 - n % 512) % 512;
                out.write_all(&[0; 512][..pad as usize])?;
                Ok(Step::Skip)
            }
            Kind::Link => {
                let target = match e.parent.readlink(e.name) {
                    Ok(t) => t,
                    Err(err)
                        if matches!(
                            err.raw_os_error(),
                            Some(nix::libc::ENOENT | nix::libc::EINVAL)
                        ) =>
                    {
                        return Ok(Step::Skip)
                    }
                    Err(err) => return Err(err),
                };
                let mut h = header(e.stat, tar::EntryType::Symlink, 0);
                builder.append_link(&mut h, e.rel, Path::new(&target))?;
                Ok(Step::Skip)
            }
            Kind::Special => {
                tracing::debug!("not archiving special file {}", e.rel.display());
                Ok(Step::Skip)
            }
        }
    })
}
