//! The harness of the end-to-end tests (a dev-dependency only): the peers started by the scripts
//! in `tests/peers/` ([`peers`]), the `cl` CLI and its bundles ([`cl`]), and `cl-worker` and
//! `cl-worker-manager` processes ([`worker`], [`manager`]).

use std::path::PathBuf;
use std::time::{Duration, Instant};

pub mod cl;
pub mod images;
pub mod k8s;
pub mod manager;
pub mod peers;
pub mod podman;
pub mod worker;

/// Polls `cond` every 500 ms until it holds; fails the test after `timeout`.
pub fn wait_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < timeout, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The path of a binary of this workspace, built by Cargo for the running test: next to the
/// directory of the test executable (`target/<profile>/deps/…` → `target/<profile>/<name>`).
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a test executable in target/<profile>/deps");
    profile_dir.join(name)
}
