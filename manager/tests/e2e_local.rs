//! End to end: the real CodaLab server, real Docker, `cl-worker-manager local` launching real
//! `cl-worker`s.

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use testkit::manager::{worker_globals, ManagerProc};
use testkit::{cl::*, peers::*, worker::*};

/// `cl-worker-manager … local` serving the worker queue `tag`, workers under `prefix`.
fn start_manager(tag: &str, prefix: &std::path::Path, extra: &[&str]) -> ManagerProc {
    let p = peer();
    let mut args = worker_globals(&p.server_url(), tag, &worker_bin(), prefix);
    args.extend(["--max-workers".into(), "6".into()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    // Six 1-CPU workers on a smaller machine: overcommit its cores on purpose.
    args.extend(
        [
            "local",
            "--cpus",
            "1",
            "--memory-mb",
            "2048",
            "--machine-cpus",
            "6",
            "--network-prefix",
            TEST_NETWORK_PREFIX,
        ]
        .map(String::from),
    );
    let env = HashMap::from([
        ("CODALAB_USERNAME".to_string(), p.var("CLW_ROOT_USER")),
        ("CODALAB_PASSWORD".to_string(), p.var("CLW_ROOT_PASSWORD")),
    ]);
    ManagerProc::spawn(prefix.parent().unwrap(), &args, &env)
}

/// `cl-worker-manager --once` serving the worker queue `tag` (tag-exclusive), workers under
/// `prefix`: the plan it prints as JSON (nothing is launched).
fn plan_once(
    tag: &str,
    prefix: &std::path::Path,
    globals: &[&str],
    backend: &[&str],
) -> serde_json::Value {
    testkit::json_stdout(
        Command::new(env!("CARGO_BIN_EXE_cl-worker-manager"))
            .args([
                "--server",
                &peer().server_url(),
                "--once",
                "--worker-tag",
                tag,
            ])
            .arg("--worker-tag-exclusive")
            .args(globals)
            .arg("--worker-work-dir-prefix")
            .arg(prefix)
            .args(backend)
            .env("CODALAB_USERNAME", peer().var("CLW_ROOT_USER"))
            .env("CODALAB_PASSWORD", peer().var("CLW_ROOT_PASSWORD")),
    )
}

#[test]
fn six_staged_bundles_six_workers_in_one_tick_then_zero() {
    let cl = Cl::new("mgr");
    let tag = unique("clw-mgr");
    let uuids: Vec<String> = (0..6)
        .map(|i| cl.run_bundle(&tag, &[], &format!("echo run {i}")))
        .collect();
    // All six staged (the server stages new bundles on its own schedule) before the manager looks.
    let client = peer().client();
    for uuid in &uuids {
        wait_for(&client, uuid, T, |s| s == "staged");
    }
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("workers");
    let mut m = start_manager(&tag, &prefix, &[]);
    // One tick launches every worker the demand needs.
    let t0 = Instant::now();
    while m.launches() < 6 && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let first = m.log_text();
    assert_eq!(m.launches(), 6, "{first}");
    // Killed and restarted mid-way, the manager adopts its workers and launches none.
    let _ = m.child.kill();
    let _ = m.child.wait();
    let m2 = start_manager(&tag, &prefix, &[]);
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
    assert_eq!(m2.launches(), 0, "{}", m2.log_text());
    drop(m2);
    // --once prints the plan and launches nothing.
    let plan = plan_once(&tag, &prefix, &[], &["local"]);
    assert_eq!(plan["total_jobs"], 0, "{plan}");
}

/// Deletes the bundles it holds when the test ends, passed or not.
struct Bundles(Vec<String>);

impl Drop for Bundles {
    fn drop(&mut self) {
        delete_bundles(&peer().client(), &self.0);
    }
}

/// 250 bundles staged on one queue. With room for 2 workers the first page of 100 decides the
/// tick: the server only counts the other 150. With room for 200 every bundle is read.
#[test]
fn a_long_queue_is_read_only_as_far_as_the_plan_can_use_it() {
    let cl = Cl::new("mgr-long");
    let tag = unique("clw-long");
    let client = peer().client();
    let first = cl.run_bundle(&tag, &[], "true");
    let mut bundles = Bundles(vec![first.clone()]);
    let template = wait_for(&client, &first, T, |s| s == "staged");
    bundles.0.extend(create_runs_like(&client, &template, 249));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let staged = ["state=staged".to_string(), format!("request_queue={tag}")];
    testkit::wait_until(T, "250 bundles staged", || {
        rt.block_on(client.count_bundles(&staged)).unwrap() >= 250
    });
    let dir = tempfile::tempdir().unwrap();
    let once = |max_workers: &str| {
        plan_once(
            &tag,
            dir.path(),
            &["--max-workers", max_workers],
            &["local", "--cpus", "1", "--machine-cpus", "4"],
        )
    };
    let staged_read = |plan: &serde_json::Value| -> u64 {
        let shapes = plan["shapes"].as_array().unwrap();
        shapes.iter().map(|s| s["staged"].as_u64().unwrap()).sum()
    };
    let launches = |plan: &serde_json::Value| -> u64 {
        let actions = plan["actions"].as_array().unwrap();
        let launch = |a: &&serde_json::Value| a["action"] == "launch";
        actions
            .iter()
            .filter(launch)
            .filter_map(|a| a["count"].as_u64())
            .sum()
    };
    let small = once("2");
    assert_eq!(staged_read(&small), 100, "{small}");
    assert_eq!(small["staged_unread"], 150, "{small}");
    assert_eq!(launches(&small), 2, "{small}");
    let large = once("200");
    assert_eq!(staged_read(&large), 250, "{large}");
    assert_eq!(large["staged_unread"], 0, "{large}");
    // The machine holds four 1-CPU workers: the capacity, not the queue, bounds the launches.
    assert_eq!(launches(&large), 4, "{large}");
}

#[test]
fn unschedulable_bundle_launches_nothing_and_is_reported_then_sigterm_stops() {
    let cl = Cl::new("mgr-unsched");
    let tag = unique("clw-unsched");
    let uuid = cl.run_bundle(&tag, &["--request-cpus", "64"], "echo never");
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("workers");
    let m = start_manager(&tag, &prefix, &["--metrics-addr", "127.0.0.1:0"]);
    m.wait_log("is unschedulable", Duration::from_secs(60));
    let log = m.log_text();
    assert!(
        log.contains(&format!(
            "bundle {uuid} is unschedulable: fits no worker shape: 64 cpus > largest 1"
        )),
        "{log}"
    );
    // A couple more ticks: still nothing launched.
    m.wait_ticks(2);
    assert_eq!(m.launches(), 0, "{}", m.log_text());
    let metrics = m.get("/metrics");
    for line in [
        "cl_worker_manager_staged_bundles 1",
        "cl_worker_manager_unschedulable_bundles 1",
        "cl_worker_manager_workers_needed{shape=\"default\"} 0",
        "cl_worker_manager_circuit_breaker_state 0",
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    assert!(
        !metrics.contains("cl_worker_manager_launches_total{"),
        "{metrics}"
    );
    let status: serde_json::Value = serde_json::from_str(&m.get("/status")).unwrap();
    assert_eq!(status["backend"], "local", "{status}");
    assert_eq!(
        status["plan"]["unschedulable"][0]["uuid"],
        uuid.as_str(),
        "{status}"
    );
    assert_eq!(status["plan"]["actions"], serde_json::json!([]), "{status}");
    assert_eq!(m.get("/healthz"), "ok\n");
    // The bundle stays staged, untouched.
    let b = peer().client();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let info = rt.block_on(b.get_bundle(&uuid)).unwrap();
    assert_eq!(info.state(), Some("staged"));
    // SIGTERM: the manager finishes its tick and exits 0 promptly.
    let mut m = m;
    let pid = m.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = m.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status:?}\n{}", m.log_text());
    assert!(
        m.log_text().contains("received SIGTERM"),
        "{}",
        m.log_text()
    );
    cl.run(&["rm", &uuid]);
}

#[test]
fn restart_after_seconds_re_executes_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("workers");
    let tag = unique("clw-restart");
    let mut m = start_manager(&tag, &prefix, &["--restart-after-seconds", "2"]);
    let t0 = Instant::now();
    while m.log_text().matches("local workers under").count() < 2
        && t0.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = m.log_text();
    assert!(
        log.contains("--restart-after-seconds passed: restarting"),
        "{log}"
    );
    assert!(log.matches("local workers under").count() >= 2, "{log}");
    // The same process (same pid) carries on.
    assert!(m.child.try_wait().unwrap().is_none(), "{log}");
}

/// The logs of the local workers under `prefix` (`<prefix>/<id>/worker.log`), with their
/// worker ids.
fn worker_logs(prefix: &std::path::Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(prefix).into_iter().flatten().flatten() {
        let log = e.path().join("worker.log");
        if let Ok(text) = std::fs::read_to_string(&log) {
            out.push((e.file_name().to_string_lossy().into_owned(), text));
        }
    }
    out
}

/// Cold workers start warm: the worker launched for a staged bundle is told its image (absent
/// from the engine, in the private registry) and its dependency, and fetches both as it
/// starts; after that worker left, the next one, launched for a second bundle needing the same
/// dependency, finds it in the cache the local backend's workers share, and downloads nothing.
#[test]
fn a_worker_launched_for_a_bundle_fetches_its_image_and_dependency_and_the_next_finds_them() {
    let cl = Cl::new("mgr-warm");
    let client = peer().client();
    let registry = testkit::peers::start("registry.sh")["CLW_REGISTRY"].clone();
    let image = format!("{registry}/clw-warm:{}", unique("t"));
    for args in [
        vec!["tag", "cl-worker-test/base:latest", &image],
        vec!["push", "-q", &image],
        vec!["rmi", &image],
    ] {
        let out = Command::new("docker").args(&args).output().unwrap();
        assert!(out.status.success(), "docker {args:?}: {out:?}");
    }
    let files = tempfile::tempdir().unwrap();
    let dep = cl.upload_text(files.path(), "dep.txt", &"x".repeat(1 << 20));
    let tag = unique("clw-warm");
    let d = format!("d:{dep}");
    let first = cl.run_bundle(&tag, &["--request-docker-image", &image, &d], "wc -c < d");
    wait_for(&client, &first, T, |s| s == "staged");
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("workers");
    let m = start_manager(&tag, &prefix, &[]);
    let b = wait_for(&client, &first, T, is_final);
    assert_final_state(&b, "ready", &m.log_text());
    assert_eq!(cl.stdout(&first).trim(), (1 << 20).to_string());
    let log = m.log_text();
    assert!(
        log.contains(&format!(
            "is told to fetch what {first} needs: 1 image(s), 1 dependency"
        )),
        "{log}"
    );
    let logs = worker_logs(&prefix);
    let listing = Command::new("ls")
        .arg("-laR")
        .arg(&prefix)
        .output()
        .unwrap();
    assert_eq!(
        logs.len(),
        1,
        "{log}\n{}",
        String::from_utf8_lossy(&listing.stdout)
    );
    let (first_worker, text) = &logs[0];
    assert!(
        text.contains(&format!("prefetched image {image}")),
        "{text}"
    );
    assert!(
        text.contains(&format!("prefetched dependency {dep}/")),
        "{text}"
    );
    assert!(
        text.contains(&format!("downloading dependency {dep}/")),
        "{text}"
    );
    // The worker leaves once idle.
    let t0 = Instant::now();
    while std::fs::read_to_string(prefix.join("local-jobs.json"))
        .unwrap_or_default()
        .contains("worker_id")
    {
        assert!(t0.elapsed() < Duration::from_secs(120), "{}", m.log_text());
        std::thread::sleep(Duration::from_secs(1));
    }
    let second = cl.run_bundle(&tag, &[&d], "wc -c < d");
    let b = wait_for(&client, &second, T, is_final);
    assert_final_state(&b, "ready", &m.log_text());
    let logs = worker_logs(&prefix);
    let (_, text) = logs
        .iter()
        .find(|(id, _)| id != first_worker)
        .unwrap_or_else(|| panic!("no second worker\n{}", m.log_text()));
    assert!(!text.contains("downloading dependency"), "{text}");
    assert!(
        prefix
            .join("dependency-cache")
            .join("dependencies")
            .is_dir(),
        "no shared cache"
    );
    drop(m);
    let _ = Command::new("docker").args(["rmi", &image]).output();
}
