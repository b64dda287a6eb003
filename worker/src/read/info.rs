//! Target info (`get_target_info`): what a path is, with its children to a depth.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::OwnedFd;

use nix::errno::Errno;
use nix::fcntl::{openat, readlinkat, AtFlags};
use nix::libc;
use nix::sys::stat::{fstatat, FileStat, Mode};
use serde_json::{json, Value};

use super::resolve::{dir_path_flags, is_type, join, list_dir, Bundle, Node};
use super::Failure;

pub(super) fn get_target_info(b: &Bundle, subpath: &str, depth: u64) -> Result<Value, Failure> {
    let comps = b.components(subpath)?;
    // The server resolves dependency paths in the parent bundle itself when it gets this 404.
    if !subpath.is_empty() && b.is_dependency(&comps) {
        return Err(Failure::not_found(format!(
            "{subpath} not found in bundle {}",
            b.t.uuid
        )));
    }
    let node = b.resolve(subpath, false)?;
    let st = b.stat(subpath, &node)?;
    let name = match comps.last() {
        Some(n) => n.to_string_lossy().into_owned(),
        None => b.name(),
    };
    let mut info = match &node {
        Node::Dir(fd) => describe_dir(fd, name, &st, depth),
        Node::Entry { parent, name: n } => describe(parent, n, name, &st, depth),
    }
    .map_err(|e| Failure::internal(format!("{}: {e}", b.error_path(subpath))))?;
    if comps.is_empty() && depth > 0 {
        let hidden: HashSet<OsString> = b.deps.iter().map(|d| join(d).into_os_string()).collect();
        if let Some(Value::Array(items)) = info.get_mut("contents") {
            items.retain(|c| {
                !c.get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| hidden.contains(OsStr::new(n)))
            });
        }
    }
    info["resolved_target"] = json!({"bundle_uuid": b.t.uuid, "subpath": subpath});
    Ok(info)
}

pub(super) fn base_info(name: String, st: &FileStat, kind: &str) -> Value {
    json!({
        "name": name,
        "size": st.st_size,
        "perm": st.st_mode & 0o777,
        "type": kind,
    })
}

/// Target info of entry `name` of `parent` (links are described, not followed).
pub(super) fn describe(
    parent: &OwnedFd,
    entry: &OsStr,
    name: String,
    st: &FileStat,
    depth: u64,
) -> io::Result<Value> {
    if is_type(st, libc::S_IFLNK) {
        let mut v = base_info(name, st, "link");
        let target = readlinkat(parent, entry)?;
        v["link"] = Value::from(target.to_string_lossy().into_owned());
        return Ok(v);
    }
    if is_type(st, libc::S_IFREG) {
        return Ok(base_info(name, st, "file"));
    }
    if is_type(st, libc::S_IFDIR) {
        if depth == 0 {
            return Ok(base_info(name, st, "directory"));
        }
        let fd = openat(parent, entry, dir_path_flags(), Mode::empty())?;
        return describe_dir(&fd, name, st, depth);
    }
    // FIFOs, sockets, devices: CodaLab leaves the type empty.
    Ok(base_info(name, st, ""))
}

pub(super) fn describe_dir(
    fd: &OwnedFd,
    name: String,
    st: &FileStat,
    depth: u64,
) -> io::Result<Value> {
    let mut v = base_info(name, st, "directory");
    if depth > 0 {
        let mut contents = Vec::new();
        for child in list_dir(fd)? {
            // Entries of a running bundle come and go; skip the ones gone since the listing.
            let cst = match fstatat(fd, child.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(s) => s,
                Err(Errno::ENOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            let cname = child.to_string_lossy().into_owned();
            match describe(fd, &child, cname, &cst, depth - 1) {
                Ok(c) => contents.push(c),
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)) => continue,
                Err(e) => return Err(e),
            }
        }
        v["contents"] = Value::Array(contents);
    }
    Ok(v)
}
