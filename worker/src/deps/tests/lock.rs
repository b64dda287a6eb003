//! The cache lock across processes (its other tests: `common/src/lock/tests.rs`).

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

/// Run by `lock_excludes_other_processes` in child processes.
#[test]
fn lock_child_helper() {
    let Ok(dir) = std::env::var("CLW_DEPS_LOCK_CHILD_DIR") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let lock = LinkLock::new(&dir.join("l"), LOCK_NAME, &random_hex(), LOCK_LEASE).unwrap();
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
