//! Which mounts and bundle-dir links make a dependency visible in a run (without a shared file
//! system), built from the entries' bytes. Every path handed to the engine names exactly the
//! entry that was checked: a name the engine's API cannot carry byte for byte
//! ([`carried_exactly`]) is reached through a mount of the whole dependency (its cache
//! directory, named by the worker) at an alias, never through an approximation of the name.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::nofollow::{kind, Dir, Kind};
use crate::runtime::{carried_exactly, Mount};

/// The links to make in the bundle dir (path relative to it, target bytes) for the dependency
/// at `host` (its cache directory, checked not to be a link) mounted at `child` (normalised;
/// empty for the bundle root, when `dep` is the dependency opened); the mounts they need are
/// pushed onto `binds`.
///
/// - At a child path: `/<uuid>_dependencies/<child>`, the dependency mounted there, and the link
///   `<child>` to it.
/// - At the bundle root, per top-level entry: an entry that is a link is the same link in the
///   bundle dir (never a mount source: the engine would follow it on the host); any other entry
///   is mounted at `/<uuid>_dependencies/<entry>`, as CodaLab does, and linked there.
/// - A child path or an entry name that cannot be carried exactly: the whole dependency is
///   mounted once at `/<uuid>_dependency_aliases/<n>` and the link reaches the entry through
///   it, so the run still sees it under its own name.
pub(crate) fn plan(
    uuid: &str,
    child: &Path,
    host: &Path,
    dep: Option<&Dir>,
    binds: &mut Vec<Mount>,
) -> std::io::Result<Vec<(PathBuf, OsString)>> {
    let mut m = Mounts {
        uuid,
        host,
        binds,
        alias: None,
    };
    if !child.as_os_str().is_empty() {
        let target = m.at(child, host.to_owned());
        return Ok(vec![(child.to_owned(), target.into_os_string())]);
    }
    let Some(dep) = dep else {
        return Err(std::io::Error::other("no dependency directory to list"));
    };
    let mut links = Vec::new();
    for entry in dep.list()? {
        let Some(st) = dep.entry(&entry)? else {
            continue;
        };
        let target = if kind(&st) == Kind::Link {
            dep.readlink(&entry)?
        } else {
            m.at(Path::new(&entry), host.join(&entry)).into_os_string()
        };
        links.push((PathBuf::from(&entry), target));
    }
    Ok(links)
}

/// The target in the container of a dependency at an absolute path (`cl run /data:<bundle>`):
/// CodaLab mounts it there, read-only, and makes nothing in the bundle dir. Refused: a path
/// that is not normal (`..`, nothing but `/`), one that cannot be carried exactly, and those
/// that the engine or the run's own mounts hold (`/proc`, `/sys`, `/dev`, the bundle's
/// `/<uuid>` and the worker's `/<uuid>_…` mounts).
pub(crate) fn absolute_target(uuid: &str, child: &str) -> Result<String, String> {
    let refuse = |why: &str| Err(format!("cannot mount a dependency at {child:?}: {why}"));
    let names: Vec<&str> = child.split('/').filter(|n| !n.is_empty()).collect();
    if names.iter().any(|n| *n == "." || *n == "..") {
        return refuse("the path must be normal (no `.` or `..`)");
    }
    let Some(first) = names.first().copied() else {
        return refuse("a dependency cannot replace the container's root");
    };
    let target = format!("/{}", names.join("/"));
    if !mountable_at(Path::new(&target)) {
        return refuse("its name cannot be passed to the engine exactly");
    }
    if ["proc", "sys", "dev"].contains(&first) {
        return refuse("the container's engine holds that path");
    }
    if first == uuid || first.starts_with(&format!("{uuid}_")) {
        return refuse("the run's own bundle and dependencies are mounted there");
    }
    Ok(target)
}

/// Longest component of a mount target made from a user's name: the engine makes the target as
/// a directory in the container's file system, and some storage drivers take less than 255
/// bytes there (fuse-overlayfs refused a 254-byte name: "file name too long").
const MAX_TARGET_COMPONENT: usize = 200;

/// Whether `name` can be part of a mount target: carried exactly, every component short enough.
fn mountable_at(name: &Path) -> bool {
    carried_exactly(name.as_os_str())
        && name
            .components()
            .all(|c| c.as_os_str().len() <= MAX_TARGET_COMPONENT)
}

/// The mounts of one dependency as they are planned.
struct Mounts<'a> {
    uuid: &'a str,
    /// The dependency's cache directory.
    host: &'a Path,
    binds: &'a mut Vec<Mount>,
    /// Where the whole dependency is mounted, once it is.
    alias: Option<PathBuf>,
}

impl Mounts<'_> {
    /// Where the run reaches `source`, the dependency's part named `name` (a child path, or a
    /// top-level entry): CodaLab's `/<uuid>_dependencies/<name>` when `name` can be carried
    /// exactly, else through the whole dependency's alias (`name` is then relative to the
    /// dependency only for an entry; a child path names the dependency itself).
    fn at(&mut self, name: &Path, source: PathBuf) -> PathBuf {
        if let Some(n) = name.to_str().filter(|_| mountable_at(name)) {
            let target = format!("/{}_dependencies/{n}", self.uuid);
            self.binds.push(Mount {
                host: source,
                container: target.clone(),
                read_only: true,
            });
            return PathBuf::from(target);
        }
        let whole = self.whole();
        if source == self.host {
            whole
        } else {
            whole.join(name)
        }
    }

    /// The whole dependency's alias, mounted on first use.
    fn whole(&mut self) -> PathBuf {
        if let Some(a) = &self.alias {
            return a.clone();
        }
        let target = format!("/{}_dependency_aliases/{}", self.uuid, self.binds.len());
        self.binds.push(Mount {
            host: self.host.to_owned(),
            container: target.clone(),
            read_only: true,
        });
        self.alias = Some(PathBuf::from(&target));
        PathBuf::from(target)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::symlink;

    use proptest::prelude::*;

    use super::*;
    use crate::runtime::exact;

    /// Names a user can give the top-level entries of a dependency: plain ones, names that are
    /// not UTF-8 and their lossy twins (the replacement character's bytes), Unicode
    /// normalisation and case twins, and the characters that mean something to an engine's
    /// mount syntax or a shell.
    fn name() -> impl Strategy<Value = Vec<u8>> {
        let fixed: Vec<&[u8]> = vec![
            b"x\xff",
            b"x\xef\xbf\xbd",
            b"\xc3\xa9",
            b"e\xcc\x81",
            b"Ab",
            b"ab",
            b"a\nb",
            b"a:b",
            b"a,b",
            b"a,source=.",
            b"a=b",
            b"-rf",
            b".hidden",
            b"\x01",
            b"\xef\xbf\xbd",
        ];
        prop_oneof![
            proptest::sample::select(fixed).prop_map(<[u8]>::to_vec),
            proptest::collection::vec(1u8..=255, 1..12)
                .prop_map(|v| v.into_iter().filter(|b| *b != b'/').collect::<Vec<_>>())
                .prop_filter("a usable name", |v| !v.is_empty()
                    && v.as_slice() != b"."
                    && v.as_slice() != b".."),
            Just(vec![b'n'; 255]),
        ]
    }

    #[derive(Debug, Clone)]
    enum Entry {
        Dir,
        File,
        Link(Vec<u8>),
    }

    fn entry() -> impl Strategy<Value = Entry> {
        prop_oneof![
            Just(Entry::Dir),
            Just(Entry::File),
            prop_oneof![
                Just(b"/".to_vec()),
                Just(b"..".to_vec()),
                Just(b"../..".to_vec()),
                name()
            ]
            .prop_map(Entry::Link),
        ]
    }

    /// Resolves a link target the worker made through the planned mounts, as the engine will:
    /// the host path the run reaches, or `None` if no mount holds it.
    fn through_mounts(target: &Path, binds: &[Mount]) -> Option<PathBuf> {
        binds.iter().find_map(|m| {
            let rest = target.strip_prefix(&m.container).ok()?;
            Some(if rest.as_os_str().is_empty() {
                m.host.clone()
            } else {
                m.host.join(rest)
            })
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever a dependency's top-level entries are named: every path handed to the
        /// engine is exact, every mount source is the dependency or one of its entries that
        /// is not a link, and each entry the run sees under its own name is exactly that
        /// entry (a link stays the link it was).
        #[test]
        fn every_entry_is_reached_exactly(
            entries in proptest::collection::btree_map(name(), entry(), 1..10),
            child in prop_oneof![Just(String::new()), Just("d".to_string()),
                                  Just("a,b/c".to_string()), Just("x\ny".to_string())],
        ) {
            let tmp = tempfile::tempdir().unwrap();
            let host = tmp.path().join("0xdep");
            std::fs::create_dir(&host).unwrap();
            for (n, e) in &entries {
                let p = host.join(OsStr::from_bytes(n));
                match e {
                    Entry::Dir => std::fs::create_dir(&p).unwrap(),
                    Entry::File => std::fs::write(&p, n).unwrap(),
                    Entry::Link(t) => symlink(OsStr::from_bytes(t), &p).unwrap(),
                }
            }
            let dep = Dir::open(&host).unwrap();
            let child = PathBuf::from(child);
            let mut binds = vec![];
            let links = plan("0xrun", &child, &host, Some(&dep), &mut binds).unwrap();
            for m in &binds {
                prop_assert!(exact(&m.host).is_ok(), "{:?}", m.host);
                prop_assert!(exact(Path::new(&m.container)).is_ok(), "{:?}", m.container);
                prop_assert!(mountable_at(Path::new(&m.container)), "{:?}", m.container);
                prop_assert!(m.read_only);
                // The source is the dependency itself or one of its entries, never a link.
                prop_assert!(m.host == host || m.host.parent() == Some(host.as_path()));
                let st = std::fs::symlink_metadata(&m.host).unwrap();
                prop_assert!(!st.file_type().is_symlink(), "{:?} is a link", m.host);
            }
            if !child.as_os_str().is_empty() {
                prop_assert_eq!(links.len(), 1);
                let (rel, target) = &links[0];
                prop_assert_eq!(rel, &child);
                prop_assert_eq!(through_mounts(Path::new(target), &binds), Some(host.clone()));
                return Ok(());
            }
            let seen: BTreeSet<Vec<u8>> =
                links.iter().map(|(r, _)| r.as_os_str().as_bytes().to_vec()).collect();
            let want: BTreeSet<Vec<u8>> = entries.keys().cloned().collect();
            prop_assert_eq!(seen, want);
            for (rel, target) in &links {
                let name = rel.as_os_str().as_bytes();
                match &entries[name] {
                    Entry::Link(t) => prop_assert_eq!(target.as_bytes(), t.as_slice()),
                    _ => prop_assert_eq!(
                        through_mounts(Path::new(target), &binds),
                        Some(host.join(rel))
                    ),
                }
            }
        }
    }

    #[test]
    fn absolute_dependencies_are_mounted_where_asked_unless_reserved() {
        let u = "0xabc";
        assert_eq!(absolute_target(u, "/foo/bar").unwrap(), "/foo/bar");
        assert_eq!(absolute_target(u, "//data//set/").unwrap(), "/data/set");
        assert_eq!(absolute_target(u, "/0xabcd").unwrap(), "/0xabcd");
        for bad in [
            "/",
            "//",
            "/a/../b",
            "/a/./b",
            "/..",
            "/proc",
            "/proc/x",
            "/sys",
            "/dev/shm",
            "/0xabc",
            "/0xabc/x",
            "/0xabc_dependencies/x",
            "/0xabc_dependency_aliases",
            "/a,b",
            "/a:b",
            "/a\nb",
        ] {
            assert!(absolute_target(u, bad).is_err(), "{bad:?}");
        }
        assert!(absolute_target(u, &format!("/{}", "x".repeat(201))).is_err());
    }

    /// The escape of a dependency at the bundle root holding a directory `x\xff` and a link
    /// `x\u{FFFD}` to `/`: the directory is reached through the alias, never by its lossy name.
    #[test]
    fn a_lossy_twin_is_never_a_mount_source() {
        let tmp = tempfile::tempdir().unwrap();
        let host = tmp.path().join("0xdep");
        std::fs::create_dir_all(host.join(OsStr::from_bytes(b"x\xff"))).unwrap();
        symlink("/", host.join("x\u{FFFD}")).unwrap();
        let dep = Dir::open(&host).unwrap();
        let mut binds = vec![];
        let mut links = plan("0xrun", Path::new(""), &host, Some(&dep), &mut binds).unwrap();
        links.sort();
        assert_eq!(
            binds,
            [Mount {
                host: host.clone(),
                container: "/0xrun_dependency_aliases/0".into(),
                read_only: true,
            }]
        );
        assert_eq!(
            links,
            [
                (
                    PathBuf::from(OsStr::from_bytes(b"x\xef\xbf\xbd")),
                    "/".into()
                ),
                (
                    PathBuf::from(OsStr::from_bytes(b"x\xff")),
                    OsStr::from_bytes(b"/0xrun_dependency_aliases/0/x\xff").into()
                ),
            ]
        );
    }
}
