//! The harness of the end-to-end tests (a dev-dependency only): the peers started by the scripts
//! in `tests/peers/` ([`peers`]), the `cl` CLI and its bundles ([`cl`]), and `cl-worker` and
//! `cl-worker-manager` processes ([`worker`], [`manager`]).

use std::path::PathBuf;
use std::time::{Duration, Instant};

pub mod cl;
pub mod failover;
pub mod hostile;
pub mod images;
pub mod k8s;
pub mod manager;
pub mod moto;
pub mod peers;
pub mod podman;
pub mod reclaim;
pub mod secrets;
pub mod slurm;
pub mod stub;
pub mod trees;
pub mod worker;

/// Polls `cond` every 500 ms until it holds; fails the test after `timeout`.
pub fn wait_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < timeout, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Runs `cmd`; fails the test with its stderr unless it succeeds; its stdout as JSON.
pub fn json_stdout(cmd: &mut std::process::Command) -> serde_json::Value {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Where the logs of our processes are kept after their tests (`target/test-logs/`), for the
/// credentials scan that runs after the whole suite ([`secrets`]).
pub fn kept_logs_dir() -> PathBuf {
    profile_dir()
        .parent()
        .expect("target/<profile>")
        .join("test-logs")
}

/// Copies a log of one of our processes into [`kept_logs_dir`] as `<name>` (best effort).
pub fn keep_log(path: &std::path::Path, name: &str) {
    let to = kept_logs_dir().join(name);
    if to
        .parent()
        .is_some_and(|d| std::fs::create_dir_all(d).is_ok())
    {
        let _ = std::fs::copy(path, to);
    }
}

/// Keeps every `*.log`, `*.out` and `*.err` file under `dir` (the logs of the workers a manager
/// launched, its own log and output) as `<name>/<path under dir>`.
pub fn keep_logs_under(dir: &std::path::Path, name: &str) {
    for path in files_under(dir) {
        if path
            .extension()
            .is_some_and(|x| x == "log" || x == "out" || x == "err")
        {
            if let Ok(rel) = path.strip_prefix(dir) {
                keep_log(&path, &format!("{name}/{}", rel.display()));
            }
        }
    }
}

/// The regular files under `dir`, recursively (symbolic links are not followed).
pub fn files_under(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => files.push(e.path()),
                _ => {}
            }
        }
    }
    files
}

/// Records one line of the fault suite's report (`target/fault-report.txt`, printed by
/// scripts/test.sh at the end) and prints it, with what the fault cost (`lost`: what the test
/// counted as lost, each item said; "nothing" only when it counted none). Written before the
/// test's verdict, so that a run that lost something is in the report too; then fails if
/// anything was lost.
pub fn fault_report(fault: &str, figures: &str, lost: &[String]) {
    use std::io::Write;
    let what = if lost.is_empty() {
        "nothing".to_string()
    } else {
        format!("{} ({})", lost.len(), lost.join("; "))
    };
    let line = format!("FAULT {fault}: {figures}; lost: {what}");
    eprintln!("{line}");
    let path = kept_logs_dir().with_file_name("fault-report.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
    assert!(lost.is_empty(), "{line}");
}

/// Appends one line to a report of the suite (`target/<file>`, printed by scripts/test.sh at
/// the end) and prints it.
pub fn report(file: &str, line: &str) {
    use std::io::Write;
    eprintln!("{line}");
    let path = kept_logs_dir().with_file_name(file);
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("a test executable in target/<profile>/deps")
        .to_owned()
}

/// The path of a binary of this workspace, built by Cargo for the running test: next to the
/// directory of the test executable (`target/<profile>/deps/…` → `target/<profile>/<name>`).
/// `CLW_TEST_BINARY_DIR` points the tests at other builds instead (e.g. an older commit's, to
/// show that a test fails there).
pub fn binary(name: &str) -> PathBuf {
    match std::env::var_os("CLW_TEST_BINARY_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join(name),
        _ => profile_dir().join(name),
    }
}
