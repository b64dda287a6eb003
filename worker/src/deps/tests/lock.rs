//! The cache lock: threads, processes, hard links or none, dead and expired holders.

use super::*;

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
                    "deps::tests::lock::lock_child_helper",
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
