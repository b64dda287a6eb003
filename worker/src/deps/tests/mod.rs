//! Tests of the dependency cache: the state rules, the lock, and the cache on disk.

use super::*;
use crate::nofollow::{tree, Dir};
use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;

fn me(worker: &str, instance: &str) -> Me {
    Me {
        worker_id: worker.into(),
        instance: instance.into(),
    }
}

fn k(uuid: &str, path: &str) -> DepKey {
    (uuid.into(), path.into())
}

fn nothing_on_disk(_: &str) -> bool {
    false
}

fn everything_on_disk(_: &str) -> bool {
    true
}

/// A ready entry of `size` bytes last used at `t`.
fn ready(st: &mut State, key: &DepKey, size: u64, t: f64) {
    let m = me("w", "i");
    st.join(key, &m, "r", t, false, &nothing_on_disk);
    assert!(st.complete(key, &m, Ok(size), t));
    st.release(key, "w", "r", t);
}

#[test]
fn keys_are_normalised_paths() {
    let d = |p: &str| protocol::DependencyInfo {
        child_uuid: Some("0xc".into()),
        child_path: "d".into(),
        parent_uuid: "0x1".into(),
        parent_path: p.into(),
        parent_name: None,
        location: None,
    };
    for same in ["big", "big/.", "big/./", "./big", "big//", "a/../big"] {
        assert_eq!(dep_key(&d(same)), k("0x1", "big"), "{same}");
    }
    assert_eq!(dep_key(&d("")), k("0x1", ""));
    assert_eq!(dep_key(&d(".")), k("0x1", ""));
    assert_eq!(dep_key(&d("../x")), k("0x1", "../x"));
}

#[test]
fn names() {
    assert_eq!(cache_name(&k("0x1", "")), "0x1");
    assert_eq!(cache_name(&k("0x1", "a/b")), "0x1_a_b");
    assert_eq!(cache_name(&k("0x1", "/a/b/")), "0x1_a_b");
    // Long components (found by the generated hostile suite: a 254-byte name failed the run
    // with "File name too long"): cut, with a checksum of the whole path, on a char boundary.
    let long = format!("{}/kujs", "é".repeat(127));
    let n = cache_name(&k("0x1", &long));
    assert!(n.len() <= 128 && n.starts_with("0x1_éé"), "{n}");
    assert_ne!(
        n,
        cache_name(&k("0x1", &format!("{}/kujt", "é".repeat(127))))
    );
    // A mount source reaches the engine exactly: no comma, no control character.
    let n = cache_name(&k("0x1", "a,source=./b\nc"));
    assert!(n.starts_with("0x1_a_source=._b_c-"), "{n}");
    assert!(crate::runtime::carried_exactly(n.as_ref()), "{n}");
}

#[test]
fn name_allocation_avoids_state_and_disk() {
    let mut st = State::default();
    let m = me("w", "i");
    assert_eq!(
        st.join(&k("0x1", "a/b"), &m, "r1", 1.0, false, &nothing_on_disk),
        Join::Download("0x1_a_b".into())
    );
    // Same name from another key: `_` appended.
    assert_eq!(
        st.join(&k("0x1", "a_b"), &m, "r1", 1.0, false, &nothing_on_disk),
        Join::Download("0x1_a_b_".into())
    );
    // A file on disk with the name (e.g. being deleted) is avoided too.
    let on_disk = |n: &str| n == "0x2";
    assert_eq!(st.allocate_name(&k("0x2", ""), &on_disk), "0x2_");
    // Orphans keep their names.
    st.orphans.push(Orphan {
        name: "0x3".into(),
        since: 0.0,
    });
    assert_eq!(st.allocate_name(&k("0x3", ""), &nothing_on_disk), "0x3_");
}

#[test]
fn join_claims_waits_and_takes_over() {
    let key = k("0x1", "");
    let a = me("wa", "ia");
    let b = me("wb", "ib");
    let mut st = State::default();
    assert_eq!(
        st.join(&key, &a, "r1", 100.0, false, &nothing_on_disk),
        Join::Download("0x1".into())
    );
    // Same process, another run: waits for the running task.
    assert_eq!(
        st.join(&key, &a, "r2", 101.0, true, &nothing_on_disk),
        Join::Wait("0x1".into())
    );
    // Another worker waits while the download makes progress.
    assert_eq!(
        st.join(&key, &b, "r3", 102.0, false, &nothing_on_disk),
        Join::Wait("0x1".into())
    );
    assert!(st.heartbeat(&key, &a, 5, 350.0));
    assert!(!st.heartbeat(&key, &b, 5, 350.0), "b does not own it");
    assert_eq!(
        st.poll(&key, &b, "r3", 600.0, false),
        Poll::Downloading {
            bytes: 5,
            stalled: false
        }
    );
    // 300 s without progress: b takes it over.
    assert_eq!(
        st.poll(&key, &b, "r3", 651.0, false),
        Poll::Downloading {
            bytes: 5,
            stalled: true
        }
    );
    assert_eq!(
        st.join(&key, &b, "r3", 651.0, false, &nothing_on_disk),
        Join::Download("0x1".into())
    );
    // a's late completion is refused; b's is recorded.
    assert!(!st.complete(&key, &a, Ok(10), 652.0));
    assert!(st.complete(&key, &b, Ok(1234), 653.0));
    let e = &st.entries[0];
    assert_eq!((e.stage, e.size_bytes), (Stage::Ready, 1234));
    assert_eq!(e.dependents.len(), 3);
    assert_eq!(
        st.poll(&key, &a, "r1", 654.0, false),
        Poll::Ready("0x1".into(), 1234)
    );
    // A run that never joined must join.
    assert_eq!(st.poll(&key, &a, "r9", 654.0, false), Poll::Rejoin);
    assert_eq!(
        st.join(&key, &a, "r9", 655.0, false, &everything_on_disk),
        Join::Ready("0x1".into(), 1234)
    );
}

#[test]
fn own_download_without_task_is_claimed_again() {
    let key = k("0x1", "");
    let a = me("wa", "ia");
    let mut st = State::default();
    st.join(&key, &a, "r1", 1.0, false, &nothing_on_disk);
    // The task is gone (e.g. its final write failed): waiters rejoin, and the join claims.
    assert_eq!(st.poll(&key, &a, "r1", 2.0, false), Poll::Rejoin);
    assert_eq!(
        st.join(&key, &a, "r1", 2.0, false, &nothing_on_disk),
        Join::Download("0x1".into())
    );
    // A predecessor's download (same worker id) is stalled at once after a restart.
    let a2 = me("wa", "ia2");
    let t = 1.7e9;
    st.entries[0].heartbeat = t;
    st.forget_predecessor_downloads(&a2);
    assert!(st.entries[0].stalled(t + 1.0));
    assert_eq!(
        st.join(&key, &a2, "r1", t + 1.0, false, &nothing_on_disk),
        Join::Download("0x1".into())
    );
}

#[test]
fn ready_entry_missing_on_disk_is_downloaded_again() {
    let key = k("0x1", "d");
    let mut st = State::default();
    ready(&mut st, &key, 10, 1.0);
    let b = me("wb", "ib");
    assert_eq!(
        st.join(&key, &b, "r", 2.0, false, &nothing_on_disk),
        Join::Download("0x1_d".into())
    );
    assert_eq!(st.entries[0].stage, Stage::Downloading);
}

#[test]
fn failure_reaches_waiters_and_the_next_join_retries() {
    let key = k("0x1", "");
    let a = me("wa", "ia");
    let b = me("wb", "ib");
    let mut st = State::default();
    st.join(&key, &a, "r1", 1.0, false, &nothing_on_disk);
    st.join(&key, &b, "r2", 1.0, false, &nothing_on_disk);
    assert!(st.complete(&key, &a, Err("boom".into()), 2.0));
    assert_eq!(
        st.poll(&key, &b, "r2", 2.5, false),
        Poll::Failed("boom".into())
    );
    assert_eq!(st.total_size(), 0);
    // Kept for the cooldown, then dropped.
    assert!(st.cleanup(5.0, 0).is_empty());
    assert_eq!(st.entries.len(), 1);
    // A new run retries at once.
    assert_eq!(
        st.join(&key, &b, "r3", 6.0, false, &nothing_on_disk),
        Join::Download("0x1".into())
    );
    assert!(st.complete(&key, &b, Err("again".into()), 7.0));
    st.touch_worker(&a, 20.0);
    st.touch_worker(&b, 20.0);
    assert_eq!(st.cleanup(20.0, 0), vec!["0x1".to_owned()]);
    assert!(st.entries.is_empty());
}

#[test]
fn eviction_is_lru_and_spares_used_and_downloading_entries() {
    let mut st = State::default();
    let w = me("w", "i");
    st.touch_worker(&w, 100.0);
    ready(&mut st, &k("0xa", ""), 20, 10.0);
    ready(&mut st, &k("0xb", ""), 20, 20.0);
    ready(&mut st, &k("0xc", ""), 20, 30.0);
    // 0xa is used by a run: the oldest unused (0xb) goes first.
    st.join(&k("0xa", ""), &w, "run", 40.0, false, &everything_on_disk);
    // Under the limit: nothing happens.
    assert!(st.cleanup(41.0, 60).is_empty());
    assert_eq!(st.cleanup(41.0, 45), vec!["0xb".to_owned()]);
    // 0xa (used, 20) + 0xc (20) = 40 > 25: 0xc goes, 0xa stays although over the limit.
    assert_eq!(st.cleanup(42.0, 25), vec!["0xc".to_owned()]);
    assert_eq!(st.cleanup(43.0, 0), Vec::<String>::new());
    assert_eq!(st.entries.len(), 1);
    // A download counts its bytes so far and is never evicted.
    let d = me("w", "i");
    st.join(&k("0xd", ""), &d, "run2", 44.0, false, &nothing_on_disk);
    st.release(&k("0xd", ""), "w", "run2", 44.0);
    assert!(st.heartbeat(&k("0xd", ""), &d, 30, 45.0));
    assert_eq!(st.total_size(), 50);
    st.release(&k("0xa", ""), "w", "run", 46.0);
    assert_eq!(st.cleanup(46.0, 40), vec!["0xa".to_owned()]);
    assert_eq!(st.cleanup(47.0, 0), Vec::<String>::new());
    assert_eq!(st.entries[0].name, "0xd");
}

#[test]
fn dependents_of_dead_workers_and_stalled_downloads_are_dropped() {
    let mut st = State::default();
    let gone = me("gone", "g1");
    let live = me("live", "l1");
    st.touch_worker(&gone, 0.0);
    st.join(&k("0xa", ""), &gone, "r", 0.0, false, &nothing_on_disk);
    assert!(st.complete(&k("0xa", ""), &gone, Ok(10), 1.0));
    st.join(&k("0xb", ""), &gone, "r", 1.0, false, &nothing_on_disk);
    st.touch_worker(&live, 700.0);
    // `gone` was last seen 700 s ago: its dependents go, and so does its stalled download
    // that nobody else waits for; its ready entry is then evictable.
    let doomed = st.cleanup(700.0, 0);
    assert_eq!(doomed, vec!["0xb".to_owned(), "0xa".to_owned()]);
    assert!(st.entries.is_empty());
    assert!(!st.workers.contains_key("gone"));
    assert!(st.workers.contains_key("live"));
}

#[test]
fn reconcile_drops_unclaimed_dependents_after_the_grace_and_claims_orphans() {
    let mut st = State::default();
    let old = me("w", "old");
    let new = me("w", "new");
    st.join(&k("0xa", ""), &old, "resumed", 0.0, false, &nothing_on_disk);
    assert!(st.complete(&k("0xa", ""), &old, Ok(1), 0.0));
    st.join(
        &k("0xa", ""),
        &old,
        "gone-run",
        0.0,
        false,
        &nothing_on_disk,
    );
    st.join(
        &k("0xa", ""),
        &me("other", "o"),
        "x",
        0.0,
        false,
        &nothing_on_disk,
    );
    // During the grace, nothing is dropped.
    st.reconcile(&new, &[], 10.0, true);
    assert_eq!(st.entries[0].dependents.len(), 3);
    let active = vec![
        Active {
            run: "resumed".into(),
            key: k("0xa", ""),
            name: Some("0xa".into()),
        },
        Active {
            run: "orphan-user".into(),
            key: k("0xz", "p"),
            name: Some("0xz_p_".into()),
        },
    ];
    st.orphans.push(Orphan {
        name: "0xz_p_".into(),
        since: 0.0,
    });
    st.reconcile(&new, &active, 70.0, false);
    let deps: Vec<_> = st.entries[0]
        .dependents
        .iter()
        .map(|d| (d.worker_id.as_str(), d.run_uuid.as_str()))
        .collect();
    assert_eq!(deps, vec![("w", "resumed"), ("other", "x")]);
    // The orphan is a ready entry again, with the right key, in use.
    assert!(st.orphans.is_empty());
    let e = &st.entries[1];
    assert_eq!(
        (e.key(), e.name.as_str(), e.stage),
        (k("0xz", "p"), "0xz_p_", Stage::Ready)
    );
    assert!(e.has_dependent("w", "orphan-user"));
    // Unclaimed orphans are deleted after the grace.
    st.orphans.push(Orphan {
        name: "0xq".into(),
        since: 0.0,
    });
    st.touch_worker(&new, 700.0);
    st.touch_worker(&me("other", "o"), 700.0);
    assert!(st.cleanup(700.0, u64::MAX).contains(&"0xq".to_owned()));
}

#[test]
fn reported_keys_fit_the_server_column() {
    let mut st = State::default();
    for i in 0..2000 {
        let key = k(&format!("0x{i:032x}"), "some/path");
        ready(&mut st, &key, 1, i as f64);
    }
    let keys = st.reported_keys();
    let json = serde_json::to_string(&keys).unwrap();
    assert!(json.len() <= MAX_REPORTED_JSON, "{}", json.len());
    assert!(keys.len() > 1000);
    // Most recently used first.
    assert_eq!(keys[0].0, format!("0x{:032x}", 1999));
    // Failed entries are not reported.
    let mut st = State::default();
    let m = me("w", "i");
    st.join(&k("0x1", ""), &m, "r", 0.0, false, &nothing_on_disk);
    st.complete(&k("0x1", ""), &m, Err("x".into()), 0.0);
    assert!(st.reported_keys().is_empty());
}

#[test]
fn state_round_trips_and_foreign_formats_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s.json");
    let mut st = State::default();
    ready(&mut st, &k("0x1", "a"), 7, 1.0);
    fs::write(&p, serde_json::to_vec(&st).unwrap()).unwrap();
    let back = Inner::read_state(&p).unwrap().unwrap();
    assert_eq!(back.entries[0].name, "0x1_a");
    assert_eq!(back.entries[0].size_bytes, 7);
    // The Python worker's pyjson state, or garbage: InvalidData.
    fs::write(&p, r#"{"dependencies": {}, "paths": []}"#).unwrap();
    assert_eq!(
        Inner::read_state(&p).unwrap_err().kind(),
        io::ErrorKind::InvalidData
    );
    fs::write(&p, "{trunc").unwrap();
    assert!(Inner::read_state(&p).is_err());
    assert!(Inner::read_state(&dir.path().join("none"))
        .unwrap()
        .is_none());
}

// ----- the lock -----

// The cache lock (hard links over NFS), and downloads against a server stand-in.
mod downloads;
mod lock;
