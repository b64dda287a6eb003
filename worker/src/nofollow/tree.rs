//! Whole trees: their size and their removal, without following links and with one directory
//! descriptor whatever the depth.

use std::ffi::{OsStr, OsString};
use std::io;

use nix::errno::Errno;
use nix::sys::stat::FileStat;
use nix::unistd::{unlinkat, UnlinkatFlags};

use super::walk::{walk_within, Budget, Step};
use super::{identity, kind, Dir, Kind};

/// Apparent size in bytes of the tree at `root` (as `lstat` reports each entry, the root's own
/// included; links count as themselves, never as what they name).
pub fn size(root: &Dir) -> io::Result<u64> {
    size_within(root, Budget::unlimited()).map(|s| s.unwrap_or(u64::MAX))
}

/// As [`size`], listing within `budget` (names, and the bytes of their names): `None` when the
/// tree holds more (the walk stops there, so that its time and memory are bounded whatever the
/// tree holds).
pub fn size_within(root: &Dir, mut budget: Budget) -> io::Result<Option<u64>> {
    let mut total = root.stat()?.st_size.max(0) as u64;
    let whole = walk_within(root, &mut budget, |e| {
        total = total.saturating_add(e.stat.st_size.max(0) as u64);
        Ok(Step::Descend)
    })?;
    Ok(whole.then_some(total))
}

/// Gives the owner read, write and search permission on a directory that lacks it (extracted
/// read-only directories, a run's `chmod 000`), so that its entries can be listed and removed.
fn make_accessible(dir: &Dir, st: &FileStat) {
    if st.st_mode & 0o700 != 0o700 {
        let _ = dir.chmod((st.st_mode & 0o7777) | 0o700);
    }
}

struct Frame {
    names: Vec<OsString>,
    next: usize,
    id: (u64, u64),
    name: OsString,
}

fn open_frame(parent: &Dir, name: &OsStr) -> io::Result<Option<(Dir, Frame)>> {
    let Some(st) = parent.entry(name)? else {
        return Ok(None);
    };
    if kind(&st) != Kind::Dir {
        return match unlinkat(parent, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e.into()),
        };
    }
    let dir = match parent.open_dir(name) {
        Ok(d) => d,
        Err(e) if e.raw_os_error() == Some(nix::libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    let st = dir.stat()?;
    make_accessible(&dir, &st);
    let frame = Frame {
        names: dir.list()?,
        next: 0,
        id: identity(&st),
        name: name.to_owned(),
    };
    Ok(Some((dir, frame)))
}

/// Removes directory `name` of `parent` and everything in it. Links are removed, never
/// followed; a directory moved away while it is removed ends the removal with an error.
pub fn remove_dir(parent: &Dir, name: &OsStr) -> io::Result<()> {
    let parent_id = identity(&parent.stat()?);
    let Some((mut cur, frame)) = open_frame(parent, name)? else {
        return Ok(());
    };
    let mut stack = vec![frame];
    loop {
        let top = stack.last_mut().expect("popped last");
        if top.next == top.names.len() {
            let done = stack.pop().expect("just seen");
            let up = cur.parent()?;
            let expected = stack.last().map_or(parent_id, |f| f.id);
            if identity(&up.stat()?) != expected {
                return Err(super::walk::changed());
            }
            match unlinkat(&up, done.name.as_os_str(), UnlinkatFlags::RemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(e.into()),
            }
            if stack.is_empty() {
                return Ok(());
            }
            cur = up;
            continue;
        }
        let name = std::mem::take(&mut top.names[top.next]);
        top.next += 1;
        if let Some((sub, frame)) = open_frame(&cur, &name)? {
            stack.push(frame);
            cur = sub;
        }
    }
}

/// Removes whatever is at `path`'s last component (file, link or tree) without following a
/// link in it; the parent directory is the worker's own. One that is gone is fine.
pub fn remove_path(path: &std::path::Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::other(format!(
            "{}: nothing to remove",
            path.display()
        )));
    };
    let parent = match Dir::open(if parent.as_os_str().is_empty() {
        std::path::Path::new(".")
    } else {
        parent
    }) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    parent.remove(name)
}
