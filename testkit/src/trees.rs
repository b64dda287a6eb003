//! Dependency trees a hostile user could upload, generated from a seed (proptest's strategies
//! on a seeded runner, so that a seed names one sample exactly): names that are not UTF-8 with
//! their lossy twins beside them, Unicode normalisation and case twins, newlines, `:`, `,`,
//! `=`, a leading `-`, 255-byte names; links to `/`, to a marker on the host, to `..`, chains
//! through deep directories, links at every level; hard links, FIFOs, sockets, empty
//! directories. [`Tree::write`] makes one on disk for `cl upload`; [`Tree::view`] is what a run
//! that mounts it must see, and nothing more.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// One entry of a tree, by its path (bytes, `/`-separated) relative to the tree's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Dir,
    File(Vec<u8>),
    Link(Vec<u8>),
    /// A hard link to the tree's first file (a plain file when there is none yet).
    HardLink,
    Fifo,
    Socket,
}

#[derive(Debug, Clone)]
enum Node {
    Dir(Vec<(Vec<u8>, Node)>),
    Leaf(Entry),
}

/// A generated tree: its entries, parents before children.
#[derive(Debug, Clone)]
pub struct Tree {
    pub entries: Vec<(Vec<u8>, Entry)>,
}

/// What a run sees of a mounted part of a tree, one line per entry: the path relative to the
/// mount, `find`'s type letter, the size for a file, the target for a link.
pub type View = BTreeSet<(Vec<u8>, char, u64, Vec<u8>)>;

/// The lossy twin of a name that is not UTF-8: its lossy conversion's bytes.
pub fn lossy_twin(name: &[u8]) -> Option<Vec<u8>> {
    std::str::from_utf8(name)
        .is_err()
        .then(|| String::from_utf8_lossy(name).into_owned().into_bytes())
}

fn name() -> impl Strategy<Value = Vec<u8>> {
    let fixed: Vec<&'static [u8]> = vec![
        b"x\xff",
        b"\xfe\xff",
        b"a\xc3",
        b"\xc3\xa9",
        b"e\xcc\x81",
        b"Data",
        b"data",
        b"new\nline",
        b"a:b",
        b"a,b",
        b"a,source=.",
        b"k=v",
        b"-rf",
        b"--",
        b".hidden",
        b"tab\there",
        b"sp ace",
        b"*",
    ];
    prop_oneof![
        4 => proptest::sample::select(fixed).prop_map(<[u8]>::to_vec),
        2 => "[a-z]{1,6}".prop_map(String::into_bytes),
        1 => proptest::collection::vec(1u8..=255, 1..10).prop_map(|v| {
            v.into_iter().filter(|b| *b != b'/').collect::<Vec<_>>()
        }),
        1 => Just(vec![b'n'; 255]),
        1 => Just("é".repeat(127).into_bytes()),
    ]
    .prop_filter(
        "a name an entry can have (and not the run's own files)",
        |v| {
            !matches!(
                v.as_slice(),
                b"" | b"." | b".." | b"stdout" | b"stderr" | b"listing"
            )
        },
    )
}

/// Link targets: the host's root and the marker (which a host that follows the link would
/// reach), climbs, chains through the tree, names of siblings, dangling paths.
fn target(marker: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"/".to_vec()),
        Just(marker.clone()),
        Just([marker, b"/secret".to_vec()].concat()),
        Just(b"..".to_vec()),
        Just(b"../..".to_vec()),
        Just(b"../../../../../../..".to_vec()),
        Just(b"/etc".to_vec()),
        Just(b"/nonexistent/dangling".to_vec()),
        Just(b"d1/d2/../../..".to_vec()),
        name(),
    ]
}

fn leaf(marker: Vec<u8>) -> impl Strategy<Value = Node> {
    prop_oneof![
        3 => proptest::collection::vec(any::<u8>(), 0..64).prop_map(|c| Node::Leaf(Entry::File(c))),
        4 => target(marker).prop_map(|t| Node::Leaf(Entry::Link(t))),
        1 => Just(Node::Leaf(Entry::HardLink)),
        1 => Just(Node::Leaf(Entry::Fifo)),
        1 => Just(Node::Leaf(Entry::Socket)),
        1 => Just(Node::Dir(vec![])),
    ]
}

fn tree(marker: Vec<u8>) -> impl Strategy<Value = Node> {
    let node = leaf(marker.clone()).prop_recursive(5, 40, 5, |inner| {
        proptest::collection::vec((name(), inner), 0..5).prop_map(Node::Dir)
    });
    proptest::collection::vec((name(), node), 1..8).prop_map(Node::Dir)
}

impl Tree {
    /// The tree of `seed`, with links that point at `marker` (a path on the host).
    pub fn generate(seed: u64, marker: &Path) -> Tree {
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
        let mut runner = TestRunner::new_with_rng(Config::default(), rng);
        let root = tree(marker.as_os_str().as_bytes().to_vec())
            .new_tree(&mut runner)
            .expect("a tree")
            .current();
        let mut entries = Vec::new();
        flatten(&root, &[], &mut entries);
        Tree { entries }
    }

    /// Makes the tree at `root` (which must not exist).
    pub fn write(&self, root: &Path) {
        std::fs::create_dir(root).unwrap();
        let mut first_file: Option<std::path::PathBuf> = None;
        for (rel, e) in &self.entries {
            let p = root.join(OsStr::from_bytes(rel));
            match e {
                Entry::Dir => std::fs::create_dir(&p).unwrap(),
                Entry::File(c) => {
                    std::fs::write(&p, c).unwrap();
                    first_file.get_or_insert(p);
                }
                Entry::Link(t) => std::os::unix::fs::symlink(OsStr::from_bytes(t), &p).unwrap(),
                Entry::HardLink => match &first_file {
                    Some(f) => std::fs::hard_link(f, &p).unwrap(),
                    None => {
                        std::fs::write(&p, b"").unwrap();
                        first_file = Some(p);
                    }
                },
                Entry::Fifo => {
                    nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o644))
                        .unwrap()
                }
                Entry::Socket => {
                    // Bound at a short path (a socket's path is at most 107 bytes), then moved
                    // into place; the listener's file stays when it is dropped.
                    let short = root.with_file_name(format!(".sock-{}", self.entries.len()));
                    std::os::unix::net::UnixListener::bind(&short).unwrap();
                    std::fs::rename(&short, &p).unwrap();
                }
            }
        }
    }

    /// The directories of the tree (paths from its root) reached without a link on the way,
    /// whose paths a `cl run` dependency can name: ASCII (CodaLab 1.7.5's REST server answers
    /// "Invalid path string. Expected UTF-8" to any other path), no `:` or control character.
    pub fn named_dirs(&self) -> Vec<String> {
        self.entries
            .iter()
            .filter(|(_, e)| *e == Entry::Dir)
            .filter_map(|(rel, _)| std::str::from_utf8(rel).ok())
            .filter(|r| r.is_ascii() && !r.chars().any(|c| c == ':' || c.is_control()))
            .map(str::to_owned)
            .collect()
    }

    /// What a run sees below `at` (a directory of the tree, `""` for its root): every entry
    /// but FIFOs and sockets (which the worker never extracts), a hard link as the file it
    /// shares, paths relative to `at`.
    pub fn view(&self, at: &[u8]) -> View {
        let prefix = if at.is_empty() {
            Vec::new()
        } else {
            [at, b"/"].concat()
        };
        let mut first_file: Option<u64> = None;
        let mut out = View::new();
        for (rel, e) in &self.entries {
            let size = match e {
                Entry::File(c) => {
                    first_file.get_or_insert(c.len() as u64);
                    c.len() as u64
                }
                Entry::HardLink => *first_file.get_or_insert(0),
                _ => 0,
            };
            let Some(r) = rel.strip_prefix(prefix.as_slice()) else {
                continue;
            };
            if r.is_empty() {
                continue;
            }
            match e {
                Entry::Dir => out.insert((r.to_vec(), 'd', 0, vec![])),
                Entry::File(_) | Entry::HardLink => out.insert((r.to_vec(), 'f', size, vec![])),
                Entry::Link(t) => out.insert((r.to_vec(), 'l', 0, t.clone())),
                Entry::Fifo | Entry::Socket => false,
            };
        }
        out
    }

    /// The top-level entries below `at`: (name, the link target when it is a link), FIFOs and
    /// sockets left out.
    pub fn top(&self, at: &[u8]) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        self.view(at)
            .into_iter()
            .filter(|(p, ..)| !p.contains(&b'/'))
            .map(|(p, t, _, target)| (p, (t == 'l').then_some(target)))
            .collect()
    }
}

/// Depth-first, parents first; names unique per directory; a name that is not UTF-8 gets its
/// lossy twin beside it, a link to the host's root (what a mount source built from the lossy name
/// would name), unless the twin is already there.
fn flatten(node: &Node, at: &[u8], out: &mut Vec<(Vec<u8>, Entry)>) {
    let Node::Dir(children) = node else {
        return;
    };
    let mut names = BTreeSet::new();
    let path = |n: &[u8]| {
        if at.is_empty() {
            n.to_vec()
        } else {
            [at, b"/", n].concat()
        }
    };
    let mut twins = Vec::new();
    for (n, child) in children {
        if !names.insert(n.clone()) {
            continue;
        }
        let p = path(n);
        match child {
            Node::Dir(_) => {
                out.push((p.clone(), Entry::Dir));
                flatten(child, &p, out);
            }
            Node::Leaf(e) => out.push((p, e.clone())),
        }
        if let Some(t) = lossy_twin(n) {
            twins.push(t);
        }
    }
    for t in twins {
        if names.insert(t.clone()) {
            out.push((path(&t), Entry::Link(b"/".to_vec())));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_names_one_tree_and_twins_stand_beside_their_names() {
        let m = Path::new("/tmp/marker");
        let a = Tree::generate(7, m);
        assert_eq!(a.entries, Tree::generate(7, m).entries);
        let mut twins = 0;
        for seed in 0..200 {
            let t = Tree::generate(seed, m);
            let names: BTreeSet<_> = t.entries.iter().map(|(p, _)| p.clone()).collect();
            assert_eq!(names.len(), t.entries.len(), "unique paths");
            for (p, _) in &t.entries {
                let (dir, name) = match p.iter().rposition(|b| *b == b'/') {
                    Some(i) => (&p[..i + 1], &p[i + 1..]),
                    None => (&p[..0], &p[..]),
                };
                if let Some(tw) = lossy_twin(name) {
                    assert!(names.contains(&[dir, &tw].concat()));
                    twins += 1;
                }
            }
        }
        assert!(twins > 50, "{twins} twins in 200 trees");
    }

    #[test]
    fn the_view_leaves_out_special_files_and_follows_hard_links() {
        let t = Tree {
            entries: vec![
                (b"d".to_vec(), Entry::Dir),
                (b"d/f".to_vec(), Entry::File(b"abc".to_vec())),
                (b"d/h".to_vec(), Entry::HardLink),
                (b"d/p".to_vec(), Entry::Fifo),
                (b"l".to_vec(), Entry::Link(b"/".to_vec())),
            ],
        };
        let v: Vec<_> = t.view(b"d").into_iter().collect();
        assert_eq!(
            v,
            [
                (b"f".to_vec(), 'f', 3, vec![]),
                (b"h".to_vec(), 'f', 3, vec![])
            ]
        );
        assert_eq!(
            t.top(b""),
            [(b"d".to_vec(), None), (b"l".to_vec(), Some(b"/".to_vec()))]
        );
    }
}
