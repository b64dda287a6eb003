//! Downloads against a CodaLab stand-in: shared between workers, limits, eviction, takeovers,
//! start-up.

use super::*;
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
