//! `write`: a string written to a file of a running bundle.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::libc;
use nix::sys::stat::{fstat, fstatat, Mode};

use super::resolve::{is_type, normalize, resolve, Node, Resolve};

/// Writes `data` to `subpath` in the bundle (created or truncated). Refuses dependency paths,
/// paths leaving the bundle (also through links), and anything but regular files.
pub fn write_string(
    bundle_path: &Path,
    dependency_paths: &[String],
    subpath: &str,
    data: &[u8],
) -> Result<(), String> {
    if subpath.starts_with('/') {
        return Err("absolute paths are not allowed".into());
    }
    let comps = normalize(subpath).ok_or("the path leaves the bundle")?;
    if comps.is_empty() {
        return Err("no file name".into());
    }
    if dependency_paths
        .iter()
        .filter_map(|d| normalize(d))
        .any(|d| d == comps)
    {
        return Err("it is a dependency".into());
    }
    let root = openat(
        nix::fcntl::AT_FDCWD,
        bundle_path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot open the bundle directory: {e}"))?;
    let (parent, name) = match resolve(&root, &comps, true) {
        Ok(Node::Entry { parent, name }) => (parent, name),
        Ok(Node::Dir(_)) => return Err("it is a directory".into()),
        Err(Resolve::Escapes) => return Err("the path leaves the bundle".into()),
        Err(Resolve::Missing) => return Err("its directory does not exist".into()),
        Err(Resolve::Io(e)) => return Err(e.to_string()),
    };
    match fstatat(&parent, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) if !is_type(&st, libc::S_IFREG) => return Err("not a regular file".into()),
        Ok(_) | Err(Errno::ENOENT) => {}
        Err(e) => return Err(e.to_string()),
    }
    let fd = openat(
        &parent,
        name.as_os_str(),
        OFlag::O_WRONLY
            | OFlag::O_CREAT
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o666),
    )
    .map_err(|e| e.to_string())?;
    if !is_type(&fstat(&fd).map_err(|e| e.to_string())?, libc::S_IFREG) {
        return Err("not a regular file".into());
    }
    let mut f = File::from(fd);
    f.set_len(0).map_err(|e| e.to_string())?;
    f.write_all(data).map_err(|e| e.to_string())
}
