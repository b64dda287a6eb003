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

use super::resolve::{dir_path_flags, is_type, join, Bundle, Node};
use super::Failure;
use crate::nofollow::list_at_most;

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

/// The most levels a listing descends, whatever depth is asked: one descriptor is open per
/// level, and the answer is nested that deep (a tree 3,000 levels deep once overflowed the
/// worker's stack when it was walked, and then serialised, recursively). Deeper directories
/// are described without their contents.
pub const MAX_INFO_DEPTH: u64 = 32;
/// The most entries one listing describes; past it the read fails with a clear error rather
/// than hold them (500,000 links in one directory took 850 MB).
pub const MAX_INFO_ENTRIES: usize = 100_000;
/// The most bytes of names and link targets one listing holds.
pub const MAX_INFO_BYTES: usize = 16 << 20;

/// What is left of a listing's caps.
struct Caps {
    entries: usize,
    bytes: usize,
}

impl Caps {
    fn take(&mut self, bytes: usize) -> io::Result<()> {
        match (
            self.entries.checked_sub(1),
            self.bytes.checked_sub(bytes + 64),
        ) {
            (Some(e), Some(b)) => {
                self.entries = e;
                self.bytes = b;
                Ok(())
            }
            _ => Err(too_large()),
        }
    }
}

fn too_large() -> io::Error {
    io::Error::other(format!(
        "the listing is too large: the worker describes at most {MAX_INFO_ENTRIES} entries \
         ({} MiB of names) in one answer; ask for a smaller depth or a subdirectory",
        MAX_INFO_BYTES >> 20
    ))
}

/// One directory being described: its descriptor, the children still to describe, and the
/// descriptions so far.
struct Frame {
    fd: OwnedFd,
    value: Value,
    children: std::vec::IntoIter<OsString>,
    contents: Vec<Value>,
    depth: u64,
}

fn frame(fd: OwnedFd, value: Value, depth: u64, caps: &Caps) -> io::Result<Frame> {
    let children = list_at_most(&fd, caps.entries)?.ok_or_else(too_large)?;
    Ok(Frame {
        fd,
        value,
        children: children.into_iter(),
        contents: Vec::new(),
        depth,
    })
}

/// Describes directory `fd` with its children to `depth` levels (at most [`MAX_INFO_DEPTH`]):
/// iteratively, one descriptor per level, within [`MAX_INFO_ENTRIES`] and [`MAX_INFO_BYTES`].
pub(super) fn describe_dir(
    fd: &OwnedFd,
    name: String,
    st: &FileStat,
    depth: u64,
) -> io::Result<Value> {
    let value = base_info(name, st, "directory");
    let depth = depth.min(MAX_INFO_DEPTH);
    if depth == 0 {
        return Ok(value);
    }
    let mut caps = Caps {
        entries: MAX_INFO_ENTRIES,
        bytes: MAX_INFO_BYTES,
    };
    let mut stack = vec![frame(fd.try_clone()?, value, depth, &caps)?];
    loop {
        let top = stack.last_mut().expect("a frame");
        let Some(child) = top.children.next() else {
            let done = stack.pop().expect("a frame");
            let mut v = done.value;
            v["contents"] = Value::Array(done.contents);
            match stack.last_mut() {
                Some(parent) => parent.contents.push(v),
                None => return Ok(v),
            }
            continue;
        };
        // Entries of a running bundle come and go; skip the ones gone since the listing.
        let cst = match fstatat(&top.fd, child.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(s) => s,
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(e.into()),
        };
        caps.take(child.len())?;
        let cname = child.to_string_lossy().into_owned();
        if is_type(&cst, libc::S_IFDIR) && top.depth > 1 {
            let fd = match openat(&top.fd, child.as_os_str(), dir_path_flags(), Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => continue,
                Err(e) => return Err(e.into()),
            };
            let d = top.depth - 1;
            let f = frame(fd, base_info(cname, &cst, "directory"), d, &caps)?;
            stack.push(f);
            continue;
        }
        // A leaf here: a directory at the last level is described without its contents.
        match describe(&top.fd, &child, cname, &cst, 0) {
            Ok(c) => {
                if let Some(l) = c.get("link").and_then(Value::as_str) {
                    caps.take(l.len())?;
                }
                top.contents.push(c)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)) => continue,
            Err(e) => return Err(e),
        }
    }
}
