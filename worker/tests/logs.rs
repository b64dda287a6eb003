//! `cl-worker --log-format json` and `--metrics-addr` before the server answers: against an
//! unreachable server the worker logs its login retries as JSON lines and already serves its
//! metrics.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn json_log_lines_and_metrics_while_the_server_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("worker.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_cl-worker"))
        .args([
            "--server",
            "http://127.0.0.1:9",
            "--work-dir",
            &dir.path().join("wd").display().to_string(),
            "--log-format",
            "json",
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .env("CODALAB_USERNAME", "u")
        .env("CODALAB_PASSWORD", "p")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let t0 = Instant::now();
    while !read().contains("cannot log in") && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let text = read();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    let serving = lines
        .iter()
        .find_map(|l| {
            l["message"]
                .as_str()?
                .strip_prefix("serving /metrics on http://")
        })
        .unwrap_or_else(|| panic!("no metrics address in {text}"))
        .to_string();
    let login = lines
        .iter()
        .find(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.contains("cannot log in"))
        })
        .unwrap_or_else(|| panic!("no login retry in {text}"));
    assert_eq!(login["level"], "WARN", "{login}");
    assert!(login["timestamp"].as_str().is_some(), "{login}");
    assert!(!text.contains('\u{1b}'), "{text:?}");
    let metrics = testkit::manager::http_get(&serving, "/metrics");
    for series in [
        "cl_worker_checkin_failures_total 0",
        "cl_worker_uploaded_bytes_total 0",
        "# TYPE cl_worker_checkin_duration_seconds histogram",
        "# TYPE cl_worker_runs gauge",
    ] {
        assert!(metrics.contains(series), "{series} not in\n{metrics}");
    }
    let _ = child.kill();
    let _ = child.wait();
}
