//! The lock: threads, hard links or none, dead and expired holders, a lease renewed. (Other
//! processes: the worker's `deps::tests::lock`, which re-runs its test binary.)

use super::*;
use std::sync::Arc;

const NAME: &str = "state.lock";
const LEASE: Duration = Duration::from_secs(60);

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
            Arc::new(
                LinkLock::new(&dir.path().join("l"), NAME, &format!("inst{i}"), LEASE).unwrap(),
            )
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
            let lock = LinkLock::new(&dir.path().join("l"), NAME, &format!("x{i}"), LEASE).unwrap();
            lock.no_links.store(true, Ordering::Relaxed);
            let c = counter.clone();
            std::thread::spawn(move || bump(&lock, &c, 50))
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(read_counter(&counter), 150);
    assert!(!dir.path().join("l").join(NAME).exists());
}

fn write_foreign_lock(lock_dir: &Path, token: &str, age: Duration) {
    fs::create_dir_all(lock_dir).unwrap();
    let p = lock_dir.join(NAME);
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
    let lock = LinkLock::new(&dir.path().join("l"), NAME, "me", LEASE).unwrap();
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
    let lock = LinkLock::new(&ld, NAME, "me", Duration::from_secs(3)).unwrap();
    let err = lock.acquire(Duration::from_millis(300)).err().unwrap();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    assert!(err.to_string().contains("host=elsewhere"), "{err}");
    // Older than the lease: broken.
    write_foreign_lock(&ld, token, Duration::from_secs(10));
    let g = lock.acquire(Duration::from_secs(2)).unwrap();
    assert!(g.still_held());
    // Our own lock, broken while we were frozen: we notice before writing.
    let other = LinkLock::new(&ld, NAME, "other", Duration::from_secs(3)).unwrap();
    let f = fs::File::options().write(true).open(ld.join(NAME)).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(10))
        .unwrap();
    let g2 = other.acquire(Duration::from_secs(2)).unwrap();
    assert!(!g.still_held());
    drop(g); // must not remove the other's lock
    assert!(g2.still_held());
}

#[test]
fn the_token_and_the_claim_names_are_those_of_the_name_given() {
    let dir = tempfile::tempdir().unwrap();
    let lock = LinkLock::new(dir.path(), "leader.lease", "inst", LEASE).unwrap();
    assert_eq!(lock.path(), dir.path().join("leader.lease"));
    let g = lock.acquire(Duration::from_secs(1)).unwrap();
    let id = HostIdent::current();
    assert_eq!(
        fs::read_to_string(lock.path()).unwrap(),
        format!(
            "host={}\nboot={}\npidns={}\npid={}\ninstance=inst\n",
            id.host,
            id.boot,
            id.pidns,
            std::process::id()
        )
    );
    let claims: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "leader.lease")
        .collect();
    assert_eq!(claims, ["leader.lease.claim.inst.0"]);
    assert_eq!(
        lock.sibling("broken").file_name().unwrap(),
        "leader.lease.broken.inst.1"
    );
    drop(g);
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn a_renewed_lease_is_not_broken_and_a_lost_one_is_not_renewed() {
    let dir = tempfile::tempdir().unwrap();
    let lease = Duration::from_secs(3);
    let lock = LinkLock::new(dir.path(), NAME, "holder", lease).unwrap();
    let g = lock.acquire(Duration::from_secs(1)).unwrap();
    let old = SystemTime::now() - Duration::from_secs(10);
    fs::File::options()
        .write(true)
        .open(lock.path())
        .unwrap()
        .set_modified(old)
        .unwrap();
    assert!(g.renew().unwrap());
    // Fresh again: another instance waits instead of breaking it.
    let other = LinkLock::new(dir.path(), NAME, "other", lease).unwrap();
    let (ino, why) = other.inspect().unwrap();
    assert!(why.is_none(), "{why:?}");
    assert!(other.acquire(Duration::from_millis(100)).is_err());
    // Expired and taken over: the old holder's renewal fails and leaves the new lock alone.
    fs::File::options()
        .write(true)
        .open(lock.path())
        .unwrap()
        .set_modified(old)
        .unwrap();
    let g2 = other.acquire(Duration::from_secs(2)).unwrap();
    let new_ino = fs::metadata(lock.path()).unwrap().ino();
    assert_ne!(new_ino, ino);
    assert!(!g.renew().unwrap());
    assert!(!g.still_held());
    drop(g);
    assert!(g2.still_held());
    assert!(g2.renew().unwrap());
}

#[tokio::test]
async fn the_lock_can_be_held_in_a_blocking_task() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<LinkLock>();
    let dir = tempfile::tempdir().unwrap();
    let lock = Arc::new(LinkLock::new(dir.path(), NAME, "blocking", LEASE).unwrap());
    let l = lock.clone();
    let held = tokio::task::spawn_blocking(move || {
        let g = l.acquire(Duration::from_secs(1))?;
        let held = g.still_held() && g.renew()?;
        drop(g);
        io::Result::Ok(held)
    })
    .await
    .unwrap()
    .unwrap();
    assert!(held);
    assert!(lock.inspect().is_none());
}
