//! A pre-order walk of a directory tree that never follows a link and holds one directory
//! descriptor whatever the depth.
//!
//! Going down opens each directory with `O_NOFOLLOW` relative to its parent; going back up
//! opens `..` and checks that it is the directory the walk came from (device and inode), so a
//! directory moved elsewhere while it is walked (a running container can do that) ends the walk
//! with [`changed`] instead of leading it out of the tree. Each directory's names are read when
//! it is entered, so no listing stays open across levels either.

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};

use nix::sys::stat::FileStat;

use super::{identity, kind, Dir, Kind};

/// One entry met by the walk.
pub struct Entry<'a> {
    /// Its path relative to the walk's root.
    pub rel: &'a Path,
    /// The directory that holds it.
    pub parent: &'a Dir,
    pub name: &'a OsStr,
    /// Its `lstat`.
    pub stat: &'a FileStat,
}

impl Entry<'_> {
    pub fn kind(&self) -> Kind {
        kind(self.stat)
    }
}

/// What to do with a directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Descend,
    Skip,
}

/// The error of a walk whose tree moved under it.
pub fn changed() -> io::Error {
    io::Error::other("the tree changed while it was walked (a directory was moved)")
}

struct Frame {
    names: Vec<OsString>,
    next: usize,
    id: (u64, u64),
}

/// Calls `visit` for every entry below `root` (not `root` itself), parents before children,
/// names sorted. A directory is entered when `visit` returns [`Step::Descend`]. Entries that
/// vanish or turn into something else while the walk looks at them are skipped.
pub fn walk(root: &Dir, visit: impl FnMut(Entry<'_>) -> io::Result<Step>) -> io::Result<()> {
    walk_within(root, &mut Budget::unlimited(), visit).map(drop)
}

/// What a bounded walk may list: names, and the bytes they take. A walk holds at most this
/// (each directory's names are read once), so its memory and time are bounded whatever the
/// tree holds.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub names: usize,
    pub bytes: usize,
}

impl Budget {
    pub fn unlimited() -> Budget {
        Budget {
            names: usize::MAX,
            bytes: usize::MAX,
        }
    }

    /// Lists directory `dir` within what is left; `None` when it holds more.
    fn list(&mut self, dir: &Dir) -> io::Result<Option<Vec<OsString>>> {
        let Some(names) = super::list_within(dir, self.names, self.bytes)? else {
            return Ok(None);
        };
        self.names -= names.len();
        self.bytes -= names.iter().map(|n| n.len()).sum::<usize>();
        Ok(Some(names))
    }
}

/// As [`walk`], listing within `budget`: `Ok(false)` (the walk stopped) as soon as the tree
/// holds more than it allows.
pub fn walk_within(
    root: &Dir,
    budget: &mut Budget,
    mut visit: impl FnMut(Entry<'_>) -> io::Result<Step>,
) -> io::Result<bool> {
    let mut cur = root.try_clone()?;
    let st = cur.stat()?;
    let Some(names) = budget.list(&cur)? else {
        return Ok(false);
    };
    let mut stack = vec![Frame {
        names,
        next: 0,
        id: identity(&st),
    }];
    let mut rel = PathBuf::new();
    loop {
        let top = stack.last_mut().expect("the root frame is popped last");
        if top.next == top.names.len() {
            stack.pop();
            let Some(parent) = stack.last() else {
                return Ok(true);
            };
            let up = cur.parent()?;
            if identity(&up.stat()?) != parent.id {
                return Err(changed());
            }
            cur = up;
            rel.pop();
            continue;
        }
        let name = std::mem::take(&mut top.names[top.next]);
        top.next += 1;
        let Some(st) = cur.entry(&name)? else {
            continue;
        };
        rel.push(&name);
        let step = visit(Entry {
            rel: &rel,
            parent: &cur,
            name: &name,
            stat: &st,
        })?;
        if kind(&st) == Kind::Dir && step == Step::Descend {
            match enter(&cur, &name, &st, budget)? {
                Entered::Dir(sub, frame) => {
                    stack.push(frame);
                    cur = sub;
                    continue;
                }
                Entered::Gone => {}
                Entered::OverBudget => return Ok(false),
            }
        }
        rel.pop();
    }
}

enum Entered {
    Dir(Dir, Frame),
    Gone,
    OverBudget,
}

/// Opens sub-directory `name` if it is still the directory `st` describes, with its names.
fn enter(cur: &Dir, name: &OsStr, st: &FileStat, budget: &mut Budget) -> io::Result<Entered> {
    let sub = match cur.open_dir(name) {
        Ok(d) => d,
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(nix::libc::ENOENT | nix::libc::ENOTDIR | nix::libc::ELOOP)
            ) =>
        {
            return Ok(Entered::Gone)
        }
        Err(e) => return Err(e),
    };
    let id = identity(&sub.stat()?);
    if id != identity(st) {
        return Ok(Entered::Gone);
    }
    let Some(names) = budget.list(&sub)? else {
        return Ok(Entered::OverBudget);
    };
    Ok(Entered::Dir(sub, Frame { names, next: 0, id }))
}
