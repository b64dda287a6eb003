//! The generated hostile suite: dependency trees built from a seed (`testkit::trees`: every shape
//! of entry and name a user can upload), uploaded with `cl upload` to the real CodaLab server
//! and mounted by `cl run` at the bundle root, whole and by sub-path, on Docker, Podman and the
//! Kubernetes runtime. Each run lists, from inside, everything it sees of its dependencies
//! without following a link; the listing must be exactly the trees' entries (no entry the
//! dependency does not hold: a mount that escaped shows the host's files). From the host: the
//! marker the trees' links point at is untouched, and the worker keeps serving.
//!
//! Each run of the suite tries a fresh sample for a fixed time (`CLW_HOSTILE_BUDGET_SECS`,
//! default 120 s per runtime) and prints its seed; `CLW_HOSTILE_SEED=<seed>` repeats one. The
//! seed and the number of trees tried go to `target/hostile-generated.txt`, which
//! `scripts/test.sh` prints at the end. A seed that failed becomes a case of
//! `REGRESSION_SEEDS`, tried first on every run.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use testkit::hostile::{upload_dir, worker, Marker, Rt};
use testkit::trees::{Tree, View};
use testkit::{cl::*, peers::*};

/// Batch seeds that failed before their fix, tried first on every run: 1, a 254-byte entry name
/// mounted at `/<uuid>_dependencies/<name>` (the engine could not make the mount point: "file
/// name too long"); 2, a dependency path whose cache name passed 255 bytes; 5, the lossy-twin
/// escape (a directory `…\xff` mounted from its twin's link to the host's `/`; the listing was
/// the host's whole file system). The escape found by hand is also `hostile.rs`'s
/// `a_lossy_twin_never_names_a_mount_source_*`.
const REGRESSION_SEEDS: &[u64] = &[1, 2, 5];

/// Trees per run: one at the bundle root, the others whole or by sub-path.
const TREES_PER_RUN: usize = 6;

/// Lists, from inside the run, every entry of the bundle dir's top level and, below each link
/// the worker made to a dependency, everything there without following a link: NUL-separated
/// records (`T name type target`, then `M name` and `E path type size target` or `F size`),
/// ended by `END`, at most 8 MB (a mount of the host's `/` would list it all).
const LISTING: &str = r#"shopt -s dotglob nullglob; u=${HOME#/}
{ find -P . -mindepth 1 -maxdepth 1 ! -name stdout ! -name stderr ! -name listing -printf 'T\0%P\0%y\0%l\0'
  for e in *; do
    case "$e" in stdout|stderr|listing) continue;; esac
    case "$(readlink -- "$e")" in "/${u}_dependenc"*) ;; *) continue;; esac
    printf 'M\0%s\0' "$e"
    if [ -d "./$e/" ]; then find -P "./$e/" -mindepth 1 -printf 'E\0%P\0%y\0%s\0%l\0'
    else printf 'F\0%s\0' "$(stat -L -c %s -- "./$e")"; fi
  done; printf 'END\0'; } 2>/dev/null | head -c 8000000 > listing"#;

/// What a run saw: its top-level entries (type, link target) and, for each mount link, the
/// view below it or the size of the file it is.
#[derive(Debug, Default)]
struct Seen {
    top: BTreeMap<Vec<u8>, (char, Vec<u8>)>,
    below: BTreeMap<Vec<u8>, Result<View, u64>>,
}

fn parse(listing: &[u8]) -> Seen {
    let mut fields = listing.split(|b| *b == 0);
    let mut next = || fields.next().map(<[u8]>::to_vec).unwrap_or_default();
    let text = |v: Vec<u8>| String::from_utf8_lossy(&v).into_owned();
    let mut seen = Seen::default();
    let mut current: Option<Vec<u8>> = None;
    loop {
        let tag = next();
        match tag.as_slice() {
            b"T" => {
                let name = next();
                let typ = text(next()).chars().next().unwrap_or('?');
                seen.top.insert(name, (typ, next()));
            }
            b"M" => {
                let name = next();
                seen.below.insert(name.clone(), Ok(View::new()));
                current = Some(name);
            }
            b"E" => {
                let (path, typ, size, target) = (next(), text(next()), text(next()), next());
                let typ = typ.chars().next().unwrap_or('?');
                let size = if typ == 'f' {
                    size.parse().unwrap_or(u64::MAX)
                } else {
                    0
                };
                let target = if typ == 'l' { target } else { vec![] };
                let m = current.as_ref().expect("E after M");
                if let Some(Ok(v)) = seen.below.get_mut(m) {
                    v.insert((path, typ, size, target));
                }
            }
            b"F" => {
                let size = text(next()).parse().unwrap_or(u64::MAX);
                let m = current.clone().expect("F after M");
                seen.below.insert(m, Err(size));
            }
            b"END" => return seen,
            other => panic!(
                "the listing ({} bytes) is cut or malformed at {:?} (a mount showing far more \
                 than its dependency?)",
                listing.len(),
                String::from_utf8_lossy(other)
            ),
        }
    }
}

/// One mount of a run: where (`.`, or a child name), which tree, and which of its directories
/// (empty: the tree's root).
struct Planned {
    child: String,
    tree: usize,
    at: String,
}

fn esc(b: &[u8]) -> String {
    b.escape_ascii().to_string()
}

/// Checks what the run saw against the trees; returns a description of each difference.
fn differences(seen: &Seen, trees: &[Tree], plan: &[Planned], uuid: &str) -> Vec<String> {
    let mut diffs = Vec::new();
    let made = format!("/{uuid}_dependenc");
    let mut want_top: BTreeSet<Vec<u8>> = BTreeSet::new();
    // Each mount: the links the worker made, and what must be below each.
    let mut want_below: Vec<(Vec<u8>, Result<View, u64>)> = Vec::new();
    for p in plan {
        let tree = &trees[p.tree];
        if p.child == "." {
            for (name, link) in tree.top(p.at.as_bytes()) {
                want_top.insert(name.clone());
                match (&link, seen.top.get(&name)) {
                    (Some(t), Some(('l', got))) if got == t => {}
                    (Some(t), got) => diffs.push(format!(
                        "{}: the dependency's link to {} is {got:?}",
                        esc(&name),
                        esc(t)
                    )),
                    (None, _) => {
                        let full = if p.at.is_empty() {
                            name.clone()
                        } else {
                            [p.at.as_bytes(), b"/", &name].concat()
                        };
                        let view = tree.view(&full);
                        let is_dir = tree
                            .entries
                            .iter()
                            .any(|(r, e)| *r == full && *e == testkit::trees::Entry::Dir);
                        let file_size = tree
                            .view(p.at.as_bytes())
                            .into_iter()
                            .find_map(|(r, t, s, _)| (r == name && t == 'f').then_some(s));
                        want_below.push((
                            name,
                            if is_dir {
                                Ok(view)
                            } else {
                                Err(file_size.unwrap_or(0))
                            },
                        ));
                    }
                }
            }
        } else {
            let name = p.child.clone().into_bytes();
            want_top.insert(name.clone());
            want_below.push((name, Ok(tree.view(p.at.as_bytes()))));
        }
    }
    let got_top: BTreeSet<Vec<u8>> = seen.top.keys().cloned().collect();
    for extra in got_top.difference(&want_top) {
        diffs.push(format!("{} is in the run but in no dependency", esc(extra)));
    }
    for missing in want_top.difference(&got_top) {
        diffs.push(format!("{} is missing from the run", esc(missing)));
    }
    for (name, want) in want_below {
        match seen.top.get(&name) {
            Some(('l', t)) if t.starts_with(made.as_bytes()) => {}
            other => diffs.push(format!("{} is not a mount link: {other:?}", esc(&name))),
        }
        match (seen.below.get(&name), &want) {
            (Some(got), want) if got == want => {}
            (Some(Ok(got)), Ok(want)) => {
                for e in got.difference(want).take(5) {
                    diffs.push(format!(
                        "below {}: {} ({}) is not the dependency's",
                        esc(&name),
                        esc(&e.0),
                        e.1
                    ));
                }
                for e in want.difference(got).take(5) {
                    diffs.push(format!("below {}: {} is missing", esc(&name), esc(&e.0)));
                }
            }
            (got, want) => diffs.push(format!(
                "below {}: saw {got:?}, the dependency holds {want:?}",
                esc(&name)
            )),
        }
    }
    diffs
}

fn budget() -> Duration {
    Duration::from_secs(
        std::env::var("CLW_HOSTILE_BUDGET_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(120),
    )
}

fn fresh_seed() -> u64 {
    if let Some(s) = std::env::var("CLW_HOSTILE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return s;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    now.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32)
}

/// The mounts of one run: tree 0 at the bundle root, then whole trees and, where a tree has a
/// directory a dependency can name, that directory.
fn plan_for(trees: &[Tree], seed: u64) -> Vec<Planned> {
    let mut plan = vec![Planned {
        child: ".".into(),
        tree: 0,
        at: String::new(),
    }];
    for (i, t) in trees.iter().enumerate().skip(1) {
        let dirs = t.named_dirs();
        let at = if i % 2 == 0 && !dirs.is_empty() {
            dirs[(seed as usize ^ i) % dirs.len()].clone()
        } else {
            String::new()
        };
        plan.push(Planned {
            child: format!("{}{i}", if at.is_empty() { "w" } else { "s" }),
            tree: i,
            at,
        });
    }
    plan
}

fn generated_trees_stay_contained(rt: Rt) {
    let seed = fresh_seed();
    let budget = budget();
    eprintln!("generated hostile suite on {rt:?}: seed {seed} (CLW_HOSTILE_SEED={seed} repeats it), budget {budget:?}");
    let marker = Marker::plant(&format!("generated-{rt:?}"));
    let cl = Cl::new(&format!("hostile-gen-{rt:?}"));
    let w = worker(rt, &format!("hostile-gen-{rt:?}"), &[]);
    let client = peer().client();
    let started = Instant::now();
    let (mut trees_tried, mut runs) = (0usize, 0usize);
    let batches = REGRESSION_SEEDS
        .iter()
        .copied()
        .chain((0u64..).map(|b| seed.wrapping_add(b.wrapping_mul(0x9e37_79b9_7f4a_7c15))));
    for (n, batch_seed) in batches.enumerate() {
        if n >= REGRESSION_SEEDS.len() && started.elapsed() > budget && runs > 0 {
            break;
        }
        let trees: Vec<Tree> = (0..TREES_PER_RUN as u64)
            .map(|i| Tree::generate(batch_seed.wrapping_add(i), &marker.dir))
            .collect();
        let d = tempfile::tempdir().unwrap();
        let batch = d.path().join("batch");
        std::fs::create_dir(&batch).unwrap();
        for (i, t) in trees.iter().enumerate() {
            t.write(&batch.join(format!("t{i}")));
        }
        let bundle = upload_dir(&cl, &batch);
        let plan = plan_for(&trees, batch_seed);
        let deps: Vec<String> = plan
            .iter()
            .map(|p| {
                let at = if p.at.is_empty() {
                    String::new()
                } else {
                    format!("/{}", p.at)
                };
                format!("{}:{bundle}/t{}{at}", p.child, p.tree)
            })
            .collect();
        let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
        let run = cl.run_bundle(&w.tag, &deps, LISTING);
        let b = wait_for(&client, &run, T, is_final);
        assert_eq!(
            b.state(),
            Some("ready"),
            "batch seed {batch_seed} (suite seed {seed}): {:?}, {}\n{}",
            b.state(),
            meta_str(&b, "failure_message"),
            w.log_text()
        );
        let listing = cl.cat(&format!("{run}/listing"));
        let diffs = differences(&parse(&listing), &trees, &plan, &run);
        assert!(
            diffs.is_empty(),
            "batch seed {batch_seed} (suite seed {seed}; CLW_HOSTILE_SEED={seed} repeats the \
             suite): the run saw what its dependencies do not hold:\n{}\ntrees: {trees:#?}",
            diffs.join("\n")
        );
        marker.assert_untouched(&[&String::from_utf8_lossy(&listing)]);
        trees_tried += trees.len();
        runs += 1;
    }
    let ok = cl.run_bundle(&w.tag, &[], "echo still fine");
    let b = wait_for(&client, &ok, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    testkit::report(
        "hostile-generated.txt",
        &format!(
            "GENERATED {rt:?}: seed {seed}, {trees_tried} trees in {runs} runs, {:.0} s",
            started.elapsed().as_secs_f64()
        ),
    );
}

#[test]
fn generated_trees_stay_contained_docker() {
    generated_trees_stay_contained(Rt::Docker);
}

#[test]
fn generated_trees_stay_contained_podman() {
    generated_trees_stay_contained(Rt::Podman);
}

#[test]
fn generated_trees_stay_contained_kubernetes() {
    generated_trees_stay_contained(Rt::Kubernetes);
}

#[test]
fn a_listing_with_an_escaped_mount_is_caught() {
    // The check itself: a run that saw the host's root below a directory of the dependency.
    let t = Tree {
        entries: vec![(b"x\xff".to_vec(), testkit::trees::Entry::Dir)],
    };
    let listing =
        b"T\0x\xff\0l\0/0xr_dependency_aliases/0/x\xff\0M\0x\xff\0E\0etc\0d\x000\0\0END\0";
    let plan = [Planned {
        child: ".".into(),
        tree: 0,
        at: String::new(),
    }];
    let diffs = differences(&parse(listing), &[t], &plan, "0xr");
    assert_eq!(diffs.len(), 1, "{diffs:?}");
    assert!(diffs[0].contains("etc"), "{diffs:?}");
}
