//! Directory streams: a tar.gz of a directory, read from descriptors.

use std::collections::HashSet;
use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use nix::sys::stat::fstat;

use crate::archive::gzip::{GzWriter, Sink};
use crate::archive::Excludes;
use crate::nofollow::archive::{append_tree, header};
use crate::nofollow::Dir;

use super::ALWAYS_IGNORE;

/// A gzipped tar of directory `dir`, like `tar czf - -C dir .` with CodaLab's excludes:
/// `.git`, `._*` and `__MACOSX` anywhere, and the relative paths in `top_excludes`. Links are
/// stored as links; FIFOs, sockets and devices are left out.
pub(super) fn write_tar_gz<W: Sink + Send + 'static>(
    dir: OwnedFd,
    top_excludes: &HashSet<PathBuf>,
    out: W,
) -> io::Result<W> {
    let ignore = Excludes::new(&ALWAYS_IGNORE.map(String::from));
    let gz = GzWriter::new(out, 1)?;
    let mut builder = tar::Builder::new(gz);
    let st = fstat(&dir)?;
    let mut h = header(&st, tar::EntryType::Directory, 0);
    builder.append_data(&mut h, "./", io::empty())?;
    let dir = Dir::from(dir);
    append_tree(&mut builder, &dir, |rel| {
        ignore.matches(rel) || top_excludes.contains(rel)
    })?;
    builder.into_inner()?.finish()
}
