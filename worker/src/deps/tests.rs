//! Tests of the dependency cache: the state rules, the lock, and the cache on disk.

use super::*;
use crate::nofollow::{tree, Dir};
use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::time::SystemTime;

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
fn names() {
    assert_eq!(cache_name(&k("0x1", "")), "0x1");
    assert_eq!(cache_name(&k("0x1", "a/b")), "0x1_a_b");
    assert_eq!(cache_name(&k("0x1", "/a/b/")), "0x1_a_b");
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
        Poll::Ready("0x1".into())
    );
    // A run that never joined must join.
    assert_eq!(st.poll(&key, &a, "r9", 654.0, false), Poll::Rejoin);
    assert_eq!(
        st.join(&key, &a, "r9", 655.0, false, &everything_on_disk),
        Join::Ready("0x1".into())
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

fn read_counter(p: &Path) -> u64 {
    fs::read_to_string(p)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Increments a counter file `n` times under the lock, with a non-atomic read-modify-write.
fn bump(lock: &LinkLock, counter: &Path, n: usize) {
    for _ in 0..n {
        let g = lock.acquire(Duration::from_secs(60)).unwrap();
        let v = read_counter(counter);
        std::thread::yield_now();
        fs::write(counter, format!("{}", v + 1)).unwrap();
        assert!(g.still_held());
        drop(g);
    }
}

#[test]
fn lock_excludes_threads_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("counter");
    let locks: Vec<_> = (0..4)
        .map(|i| {
            Arc::new(LinkLock::new(&dir.path().join("l"), &format!("inst{i}"), LOCK_LEASE).unwrap())
        })
        .collect();
    let threads: Vec<_> = locks
        .iter()
        .map(|l| {
            let (l, c) = (l.clone(), counter.clone());
            std::thread::spawn(move || bump(&l, &c, 50))
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(read_counter(&counter), 200);
    // No lock file and no claim file left.
    let left: Vec<_> = fs::read_dir(dir.path().join("l")).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn lock_without_hard_links_excludes_threads() {
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("counter");
    let threads: Vec<_> = (0..3)
        .map(|i| {
            let lock = LinkLock::new(&dir.path().join("l"), &format!("x{i}"), LOCK_LEASE).unwrap();
            lock.no_links.store(true, Ordering::Relaxed);
            let c = counter.clone();
            std::thread::spawn(move || bump(&lock, &c, 50))
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(read_counter(&counter), 150);
    assert!(!dir.path().join("l").join(LOCK_NAME).exists());
}

fn write_foreign_lock(lock_dir: &Path, token: &str, age: Duration) {
    fs::create_dir_all(lock_dir).unwrap();
    let p = lock_dir.join(LOCK_NAME);
    fs::write(&p, token).unwrap();
    let f = fs::File::options().write(true).open(&p).unwrap();
    f.set_modified(SystemTime::now() - age).unwrap();
}

#[test]
fn lock_of_a_dead_local_process_is_taken_over_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    let id = HostIdent::current();
    let token = format!(
        "host={}\nboot={}\npidns={}\npid={dead_pid}\ninstance=dead\n",
        id.host, id.boot, id.pidns
    );
    write_foreign_lock(&dir.path().join("l"), &token, Duration::ZERO);
    let lock = LinkLock::new(&dir.path().join("l"), "me", LOCK_LEASE).unwrap();
    let t0 = Instant::now();
    let g = lock.acquire(Duration::from_secs(5)).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2));
    assert!(g.still_held());
}

#[test]
fn expired_lock_is_broken_and_a_fresh_foreign_one_is_respected() {
    let dir = tempfile::tempdir().unwrap();
    let ld = dir.path().join("l");
    let token = "host=elsewhere\nboot=other-boot\npidns=pid:[1]\npid=1\ninstance=x\n";
    // Held by a live process on another host: wait, then time out.
    write_foreign_lock(&ld, token, Duration::ZERO);
    let lock = LinkLock::new(&ld, "me", Duration::from_secs(3)).unwrap();
    let err = lock.acquire(Duration::from_millis(300)).err().unwrap();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    assert!(err.to_string().contains("host=elsewhere"), "{err}");
    // Older than the lease: broken.
    write_foreign_lock(&ld, token, Duration::from_secs(10));
    let g = lock.acquire(Duration::from_secs(2)).unwrap();
    assert!(g.still_held());
    // Our own lock, broken while we were frozen: we notice before writing.
    let other = LinkLock::new(&ld, "other", Duration::from_secs(3)).unwrap();
    let f = fs::File::options()
        .write(true)
        .open(ld.join(LOCK_NAME))
        .unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(10))
        .unwrap();
    let g2 = other.acquire(Duration::from_secs(2)).unwrap();
    assert!(!g.still_held());
    drop(g); // must not remove the other's lock
    assert!(g2.still_held());
}

/// Run by `lock_excludes_other_processes` in child processes.
#[test]
fn lock_child_helper() {
    let Ok(dir) = std::env::var("CLW_DEPS_LOCK_CHILD_DIR") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let lock = LinkLock::new(&dir.join("l"), &random_hex(), LOCK_LEASE).unwrap();
    bump(&lock, &dir.join("counter"), 100);
}

#[test]
fn lock_excludes_other_processes() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..3)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([
                    "deps::tests::lock_child_helper",
                    "--exact",
                    "--test-threads=1",
                ])
                .env("CLW_DEPS_LOCK_CHILD_DIR", dir.path())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    assert_eq!(read_counter(&dir.path().join("counter")), 300);
}

// ----- the cache against a scripted server -----

use wiremock::matchers::{method, path, path_regex};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// A mock CodaLab server that grants tokens.
async fn token_server() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/rest/oauth2/token"))
        .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!(
            {"access_token": "t", "token_type": "Bearer", "expires_in": 3600}
        )))
        .mount(&server)
        .await;
    server
}

async fn server(files: &[(&str, &[u8])], delay: Duration) -> MockServer {
    let server = token_server().await;
    for (uuid, data) in files {
        Mock::given(method("GET"))
            .and(path_regex(format!(
                "^/rest/bundles/{uuid}/contents/info/?$"
            )))
            .respond_with(ResponseTemplate::new(200).set_body_json(
                serde_json::json!({"data": {"name": uuid, "type": "file", "size": data.len()}}),
            ))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path_regex(format!(
                "^/rest/bundles/{uuid}/contents/blob/?$"
            )))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_bytes(data.to_vec())
                    .set_delay(delay),
            )
            .mount(&server)
            .await;
    }
    server
}

async fn blob_requests(server: &MockServer, uuid: &str) -> usize {
    server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| {
            r.url
                .path()
                .starts_with(&format!("/rest/bundles/{uuid}/contents/blob"))
        })
        .count()
}

fn open(server: &MockServer, work: &Path, worker: &str, max: u64) -> Arc<Dependencies> {
    let client = RestClient::new(
        protocol::ClientConfig::new(server.uri()),
        protocol::Credentials {
            username: "u".into(),
            password: "p".into(),
        },
    )
    .unwrap();
    Dependencies::new(
        client,
        work.join("dependencies"),
        2,
        worker.into(),
        max,
        Default::default(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_sharing_a_dir_download_once() {
    let data = vec![7u8; 300_000];
    let srv = server(&[("0xaa", &data)], Duration::from_millis(800)).await;
    let work = tempfile::tempdir().unwrap();
    let w1 = open(&srv, work.path(), "w1", u64::MAX);
    let w2 = open(&srv, work.path(), "w2", u64::MAX);
    let key = k("0xaa", "");
    let mut tasks = Vec::new();
    for (i, w) in [&w1, &w2, &w1, &w2].into_iter().enumerate() {
        let (w, key) = (w.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            w.acquire(&format!("run{i}"), &key, |_| {}).await
        }));
    }
    let mut paths = HashSet::new();
    for t in tasks {
        paths.insert(t.await.unwrap().unwrap());
    }
    assert_eq!(paths.len(), 1);
    let p = paths.into_iter().next().unwrap();
    assert_eq!(fs::read(&p).unwrap(), data);
    assert_eq!(blob_requests(&srv, "0xaa").await, 1);
    // Both report it; the state records the size on disk and four dependents.
    assert_eq!(w1.keys(), vec![key.clone()]);
    let st = Inner::read_state(&w2.inner.state_path).unwrap().unwrap();
    assert_eq!(st.entries[0].size_bytes, 300_000);
    assert_eq!(st.entries[0].dependents.len(), 4);
    for (i, w) in [&w1, &w2, &w1, &w2].into_iter().enumerate() {
        w.release(&format!("run{i}"), &key);
    }
    // Releases are written in the background: wait for them (5 s at most, for a loaded
    // machine) rather than for a fixed time.
    let t0 = std::time::Instant::now();
    loop {
        let st = Inner::read_state(&w2.inner.state_path).unwrap().unwrap();
        if st.entries[0].dependents.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "dependents left: {:?}",
            st.entries[0].dependents
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // No temp file, trash or lock left behind.
    let names: Vec<_> = fs::read_dir(work.path().join("dependencies"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("0xaa")]);
    let lock = work.path().join(LOCK_DIR).join(LOCK_NAME);
    while lock.exists() {
        assert!(t0.elapsed() < Duration::from_secs(5), "lock left behind");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_stop_at_the_recorded_size_and_the_work_dir_limit() {
    // Within both limits: downloaded whole.
    let data = vec![3u8; 300_000];
    let srv = server(&[("0xok", &data)], Duration::ZERO).await;
    let work = tempfile::tempdir().unwrap();
    let w = open(&srv, work.path(), "w1", 1 << 30);
    let p = w.acquire("r1", &k("0xok", ""), |_| {}).await.unwrap();
    assert_eq!(fs::read(&p).unwrap().len(), 300_000);

    // More than --max-work-dir-size: cut, refused at once (not retried), nothing kept.
    let work = tempfile::tempdir().unwrap();
    let w = open(&srv, work.path(), "w1", 100_000);
    let e = w.acquire("r1", &k("0xok", ""), |_| {}).await.unwrap_err();
    assert!(e.contains("larger than its limit of 97.7k"), "{e}");
    let left: Vec<_> = fs::read_dir(work.path().join("dependencies"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // A server that sends far more than the size it records (a bomb): cut near that size.
    let srv = token_server().await;
    Mock::given(method("GET"))
        .and(path_regex("^/rest/bundles/0xbomb/contents/info/?$"))
        .respond_with(ResponseTemplate::new(200).set_body_json(
            serde_json::json!({"data": {"name": "0xbomb", "type": "file", "size": 1000}}),
        ))
        .mount(&srv)
        .await;
    Mock::given(method("GET"))
        .and(path_regex("^/rest/bundles/0xbomb/contents/blob/?$"))
        .respond_with(ResponseTemplate::new(200).set_body_bytes(vec![0u8; 8 << 20]))
        .mount(&srv)
        .await;
    let work = tempfile::tempdir().unwrap();
    let w = open(&srv, work.path(), "w1", 1 << 30);
    let e = w.acquire("r1", &k("0xbomb", ""), |_| {}).await.unwrap_err();
    assert!(e.contains("larger than its limit"), "{e}");
    assert_eq!(blob_requests(&srv, "0xbomb").await, 1);
}

#[test]
fn download_limits() {
    assert_eq!(fetch::download_limit(10 << 30, None), 10 << 30);
    assert_eq!(fetch::download_limit(100, Some(1 << 30)), 100);
    let l = fetch::download_limit(10 << 30, Some(8 << 20));
    assert_eq!(l, (8 << 20) + (1 << 20) + (1 << 20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_deletes_files_and_spares_entries_in_use() {
    let a = vec![1u8; 20_000];
    let b = vec![2u8; 20_000];
    let c = vec![3u8; 20_000];
    let srv = server(&[("0xa", &a), ("0xb", &b), ("0xc", &c)], Duration::ZERO).await;
    let work = tempfile::tempdir().unwrap();
    let deps = open(&srv, work.path(), "w", 30_000);
    let dir = work.path().join("dependencies");
    let pa = deps.acquire("r1", &k("0xa", ""), |_| {}).await.unwrap();
    // A is in use while B arrives: 40 kB > 30 kB, but A stays; B is in use too.
    let pb = deps.acquire("r2", &k("0xb", ""), |_| {}).await.unwrap();
    assert!(pa.exists() && pb.exists());
    deps.release("r2", &k("0xb", ""));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // B was the only evictable entry.
    assert!(pa.exists());
    assert!(!pb.exists());
    deps.release("r1", &k("0xa", ""));
    // A unused, C arrives: A is evicted, on disk too.
    let pc = deps.acquire("r3", &k("0xc", ""), |_| {}).await.unwrap();
    assert!(!pa.exists());
    assert_eq!(fs::read(&pc).unwrap(), c);
    assert_eq!(
        tree::size(&Dir::open(&dir).unwrap()).unwrap() - fs::metadata(&dir).unwrap().len(),
        20_000
    );
    assert_eq!(deps.keys(), vec![k("0xc", "")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_foreign_download_is_taken_over() {
    let data = b"payload".to_vec();
    let srv = server(&[("0xs", &data)], Duration::ZERO).await;
    let work = tempfile::tempdir().unwrap();
    // A worker of another host claimed it 400 s ago and died; its temp file remains.
    let t = now();
    let mut st = State::default();
    let dead = me("dead", "elsewhere-1-deadbeef");
    st.touch_worker(&dead, t);
    st.join(
        &k("0xs", ""),
        &dead,
        "r0",
        t - 400.0,
        false,
        &nothing_on_disk,
    );
    fs::create_dir_all(work.path().join("dependencies")).unwrap();
    let partial = work
        .path()
        .join("dependencies")
        .join(".partial.0xs.elsewhere-1-deadbeef");
    fs::write(&partial, "half").unwrap();
    fs::write(
        work.path().join(STATE_FILE),
        serde_json::to_vec(&st).unwrap(),
    )
    .unwrap();
    let deps = open(&srv, work.path(), "w", u64::MAX);
    // Startup removed the dead download's temp file.
    assert!(!partial.exists());
    let p = tokio::time::timeout(
        Duration::from_secs(20),
        deps.acquire("r1", &k("0xs", ""), |_| {}),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(fs::read(p).unwrap(), data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_foreign_download_is_waited_for() {
    let srv = server(&[("0xw", b"x")], Duration::ZERO).await;
    let work = tempfile::tempdir().unwrap();
    let other = open(&srv, work.path(), "other", u64::MAX);
    // `other` claims the download in the state but its task never starts.
    let mut st = Inner::read_state(&other.inner.state_path).unwrap().unwrap();
    st.join(
        &k("0xw", ""),
        &me("other", "other-host-1-x"),
        "r0",
        now(),
        false,
        &nothing_on_disk,
    );
    fs::write(&other.inner.state_path, serde_json::to_vec(&st).unwrap()).unwrap();
    let deps = open(&srv, work.path(), "w", u64::MAX);
    let r = tokio::time::timeout(
        Duration::from_secs(2),
        deps.acquire("r1", &k("0xw", ""), |_| {}),
    )
    .await;
    assert!(r.is_err(), "must wait: {r:?}");
    assert_eq!(blob_requests(&srv, "0xw").await, 0);
}

#[test]
fn startup_keeps_known_files_and_deletes_the_rest() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("dependencies");
    fs::create_dir_all(dir.join("0xkeep/sub")).unwrap();
    fs::write(dir.join("0xkeep/sub/f"), "k").unwrap();
    fs::create_dir_all(dir.join("0xjunk/ro")).unwrap();
    fs::write(dir.join("0xjunk/ro/f"), "j").unwrap();
    fs::set_permissions(dir.join("0xjunk/ro"), fs::Permissions::from_mode(0o555)).unwrap();
    fs::write(dir.join(".trash.0xold.x.1"), "t").unwrap();
    let t = now();
    let mut st = State::default();
    let live = me("live", "live-host-1-abcd");
    st.touch_worker(&live, t);
    ready(&mut st, &k("0xkeep", ""), 1, t);
    ready(&mut st, &k("0xgone", ""), 1, t);
    // A live download by another worker: its temp file stays.
    st.join(&k("0xdl", ""), &live, "r", t, false, &nothing_on_disk);
    fs::write(dir.join(".partial.0xdl.live-host-1-abcd"), "p").unwrap();
    fs::write(
        work.path().join(STATE_FILE),
        serde_json::to_vec(&st).unwrap(),
    )
    .unwrap();

    let srv_uri = "http://127.0.0.1:9";
    let client = RestClient::new(
        protocol::ClientConfig::new(srv_uri),
        protocol::Credentials {
            username: "u".into(),
            password: "p".into(),
        },
    )
    .unwrap();
    let deps = Dependencies::new(
        client,
        dir.clone(),
        1,
        "me".into(),
        u64::MAX,
        Default::default(),
    )
    .unwrap();
    let mut names: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, vec![".partial.0xdl.live-host-1-abcd", "0xkeep"]);
    let st = Inner::read_state(&deps.inner.state_path).unwrap().unwrap();
    let mut known: Vec<_> = st.entries.iter().map(|e| e.name.as_str()).collect();
    known.sort();
    assert_eq!(known, vec!["0xdl", "0xkeep"]);
    let mut keys = deps.keys();
    keys.sort();
    assert_eq!(keys, vec![k("0xdl", ""), k("0xkeep", "")]);
}

#[test]
fn an_unreadable_state_is_set_aside_and_its_files_adopted() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("dependencies");
    fs::create_dir_all(dir.join("0xused")).unwrap();
    fs::write(work.path().join(STATE_FILE), "{not json").unwrap();
    let client = RestClient::new(
        protocol::ClientConfig::new("http://127.0.0.1:9"),
        protocol::Credentials {
            username: "u".into(),
            password: "p".into(),
        },
    )
    .unwrap();
    let deps =
        Dependencies::new(client, dir.clone(), 1, "me".into(), 0, Default::default()).unwrap();
    // Nothing deleted; the bad file kept for inspection.
    assert!(dir.join("0xused").exists());
    let aside: Vec<_> = fs::read_dir(work.path())
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().ok())
        .filter(|n| n.starts_with("dependencies-state.json.unreadable-"))
        .collect();
    assert_eq!(aside.len(), 1);
    let st = Inner::read_state(&deps.inner.state_path).unwrap().unwrap();
    assert_eq!(st.orphans.len(), 1);
    assert_eq!(st.orphans[0].name, "0xused");
    // A run of this process that holds it claims it back (e.g. after a state loss mid-run).
    deps.inner
        .local()
        .active
        .insert(("run".into(), k("0xused", "")), Some("0xused".into()));
    deps.inner.maintain().unwrap();
    let st = Inner::read_state(&deps.inner.state_path).unwrap().unwrap();
    assert!(st.orphans.is_empty());
    assert!(st.entries[0].has_dependent("me", "run"));
    // With the backup intact, a broken main file loses nothing.
    fs::write(&deps.inner.state_path, "garbage").unwrap();
    deps.inner.maintain().unwrap();
    let st = Inner::read_state(&deps.inner.state_path).unwrap().unwrap();
    assert_eq!(st.entries.len(), 1);
    assert!(st.orphans.is_empty());
    assert!(dir.join("0xused").exists());
}
