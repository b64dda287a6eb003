//! End to end: the real CodaLab server, real Docker, `cl-worker-manager local` launching real
//! `cl-worker`s.

#[path = "../../worker/tests/common/mod.rs"]
mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

struct Manager {
    child: Child,
    log: std::path::PathBuf,
}

impl Manager {
    fn start(tag: &str, prefix: &std::path::Path, log_name: &str, extra: &[&str]) -> Self {
        let p = peer();
        let log = prefix.parent().unwrap().join(log_name);
        let mut args: Vec<String> = vec![
            "--server".into(),
            p.server_url(),
            "--min-workers".into(),
            "0".into(),
            "--max-workers".into(),
            "6".into(),
            "--sleep-time".into(),
            "2".into(),
            "--min-seconds-between-workers".into(),
            "0".into(),
            "--worker-tag".into(),
            tag.into(),
            "--worker-tag-exclusive".into(),
            "--worker-idle-seconds".into(),
            "5".into(),
            "--worker-executable".into(),
            worker_bin().display().to_string(),
            "--worker-work-dir-prefix".into(),
            prefix.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend(["local", "--cpus", "1", "--memory-mb", "2048"].map(String::from));
        let child = Command::new(env!("CARGO_BIN_EXE_cl-worker-manager"))
            .args(&args)
            .env("CODALAB_USERNAME", p.var("CLW_ROOT_USER"))
            .env("CODALAB_PASSWORD", p.var("CLW_ROOT_PASSWORD"))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Manager { child, log }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("----- manager log -----\n{}", self.log_text());
        }
    }
}

fn launches(text: &str) -> usize {
    text.matches("launched worker").count()
}

#[test]
fn six_staged_bundles_six_workers_in_one_tick_then_zero() {
    let cl = Cl::new("mgr");
    let tag = unique("clw-mgr");
    let uuids: Vec<String> = (0..6)
        .map(|i| cl.run_bundle(&tag, &[], &format!("echo run {i}")))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("workers");
    let mut m = Manager::start(&tag, &prefix, "manager-1.log", &[]);
    // One tick launches every worker the demand needs.
    let t0 = Instant::now();
    while launches(&m.log_text()) < 6 && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let first = m.log_text();
    assert_eq!(launches(&first), 6, "{first}");
    // Killed and restarted mid-way, the manager adopts its workers and launches none.
    let _ = m.child.kill();
    let _ = m.child.wait();
    let m2 = Manager::start(&tag, &prefix, "manager-2.log", &[]);
    let client = peer().client();
    for uuid in &uuids {
        let b = wait_for(&client, uuid, T, is_final);
        assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", m2.log_text());
    }
    let mut outs: Vec<String> = uuids.iter().map(|u| cl.stdout(u)).collect();
    outs.sort();
    assert_eq!(
        outs,
        (0..6).map(|i| format!("run {i}\n")).collect::<Vec<_>>()
    );
    // Idle workers exit; the manager is left with none and launched no duplicate.
    let t0 = Instant::now();
    let mut zero = false;
    while t0.elapsed() < Duration::from_secs(120) && !zero {
        let jobs = std::fs::read_to_string(prefix.join("local-jobs.json")).unwrap_or_default();
        zero = !jobs.contains("worker_id");
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(zero, "workers still recorded\n{}", m2.log_text());
    assert_eq!(launches(&m2.log_text()), 0, "{}", m2.log_text());
    drop(m2);
    // --once prints the plan and launches nothing.
    let out = Command::new(env!("CARGO_BIN_EXE_cl-worker-manager"))
        .args([
            "--server",
            &peer().server_url(),
            "--once",
            "--worker-tag",
            &tag,
        ])
        .arg("--worker-tag-exclusive")
        .arg("--worker-work-dir-prefix")
        .arg(&prefix)
        .args(["local"])
        .env("CODALAB_USERNAME", peer().var("CLW_ROOT_USER"))
        .env("CODALAB_PASSWORD", peer().var("CLW_ROOT_PASSWORD"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["total_jobs"], 0, "{plan}");
}
