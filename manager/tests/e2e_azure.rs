//! End to end: the real CodaLab server, the Azure Batch stand-in (tests/peers/azure-batch.sh:
//! the Batch task API, checked with Microsoft's SDK in its selftest, running each task's
//! container in the machine's Docker engine, and a Blob service for the task logs) and
//! `cl-worker-manager azure-batch`.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::images::worker_image;
use testkit::manager::{metric, metric_sum, ManagerProc};
use testkit::{cl::*, peers::*, wait_until, worker::*};

/// The stand-in's environment (`azure-batch.sh env`), started once.
fn az() -> &'static HashMap<String, String> {
    static ENV: OnceLock<HashMap<String, String>> = OnceLock::new();
    ENV.get_or_init(|| {
        bash(&["tests/peers/azure-batch.sh", "start"], &HashMap::new());
        exports(&bash(
            &["tests/peers/azure-batch.sh", "env"],
            &HashMap::new(),
        ))
    })
}

fn sh(args: &[&str]) -> String {
    let mut a = vec!["tests/peers/azure-batch.sh"];
    a.extend(args);
    bash(&a, az())
}

fn state() -> Value {
    serde_json::from_str(&sh(&["state"])).unwrap()
}

fn tasks() -> Vec<Value> {
    state()["tasks"].as_array().cloned().unwrap_or_default()
}

fn requests() -> Vec<Value> {
    serde_json::from_str(&sh(&["requests"])).unwrap()
}

fn blobs() -> Vec<String> {
    let v: Value = serde_json::from_str(&sh(&["blobs"])).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap().to_string())
        .collect()
}

/// The tasks that ended before their worker checked in (from the manager's log), and the
/// workers' own stderr of each, as the stand-in uploaded it to the log container.
fn lost_task_logs(manager_log: &str) -> (usize, String) {
    let ids: Vec<&str> = manager_log
        .lines()
        .filter(|l| l.contains("ended unsuccessfully before its worker checked in"))
        .filter_map(|l| l.split("job ").nth(1)?.split_whitespace().next())
        .collect();
    let url = &az()["CLW_AZBATCH_CONTAINER_URL"];
    let (base, sas) = url.split_once('?').unwrap_or((url.as_str(), ""));
    let mut text = String::new();
    for id in &ids {
        let out = std::process::Command::new("curl")
            .args(["-sS", "-m", "10", &format!("{base}/{id}/stderr.txt?{sas}")])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_else(|e| format!("(curl: {e})"));
        text.push_str(&format!("--- task {id}, stderr.txt ---\n{out}\n"));
    }
    (ids.len(), text)
}

/// `cl-worker-manager … azure-batch` serving the worker queue `tag`, the key in the environment.
fn start_manager(dir: &std::path::Path, tag: &str, prefix: &str, extra: &[&str]) -> ManagerProc {
    start_manager_with(dir, tag, prefix, extra, &[])
}

/// The same, with `backend_extra` after the `azure-batch` flags.
fn start_manager_with(
    dir: &std::path::Path,
    tag: &str,
    prefix: &str,
    extra: &[&str],
    backend_extra: &[&str],
) -> ManagerProc {
    let p = peer();
    let e = az();
    let mut args: Vec<String> = [
        "--server",
        &p.server_url(),
        "--min-workers",
        "0",
        "--sleep-time",
        "2",
        "--min-seconds-between-workers",
        "0",
        "--worker-tag",
        tag,
        "--worker-tag-exclusive",
        "--worker-idle-seconds",
        "5",
        "--worker-work-dir-prefix",
        prefix,
        "--metrics-addr",
        "127.0.0.1:0",
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend(
        [
            "azure-batch",
            "--account-name",
            &e["CLW_AZBATCH_ACCOUNT"],
            "--service-url",
            &e["CLW_AZBATCH_URL"],
            "--job-id",
            &e["CLW_AZBATCH_JOB"],
            "--pool-id",
            &e["CLW_AZBATCH_POOL"],
        ]
        .map(String::from),
    );
    if !backend_extra.contains(&"--worker-image") {
        args.extend(["--worker-image".to_string(), worker_image().to_string()]);
    }
    args.extend(backend_extra.iter().map(|s| s.to_string()));
    let mut env = HashMap::new();
    env.insert("CODALAB_USERNAME".into(), p.var("CLW_ROOT_USER"));
    env.insert("CODALAB_PASSWORD".into(), p.var("CLW_ROOT_PASSWORD"));
    env.insert(
        "AZURE_BATCH_ACCOUNT_KEY".into(),
        e["CLW_AZBATCH_KEY"].clone(),
    );
    env.insert(
        "AZURE_BATCH_LOG_CONTAINER_URL".into(),
        e["CLW_AZBATCH_CONTAINER_URL"].clone(),
    );
    ManagerProc::spawn(dir, &args, &env)
}

/// The account's secrets, which must not appear anywhere the manager writes or sends (the test
/// passwords: `testkit::secrets`).
fn secrets() -> Vec<String> {
    vec![
        az()["CLW_AZBATCH_KEY"].clone(),
        az()["CLW_AZBATCH_SAS"].clone(),
    ]
}

fn assert_no_secret(what: &str, text: &str) {
    for s in secrets() {
        assert!(
            !text.contains(&s),
            "{what} holds a secret ({s:.4}…): {text}"
        );
    }
}

/// Whether request `r` adds a task (one of `ids`, or any when empty).
fn is_add_of(r: &Value, ids: &[String]) -> bool {
    r["method"] == "POST"
        && r["path"].as_str().unwrap().ends_with("/tasks")
        && (ids.is_empty() || ids.iter().any(|id| r["body"]["id"] == id.as_str()))
}

#[test]
fn full_loop_three_bundles_three_tasks_ready_logs_uploaded_tasks_deleted() {
    // The worker image of a site whose nodes have GPUs (the fake ones).
    let image = testkit::images::gpu_host_worker_image();
    sh(&["reset"]);
    sh(&["ctl", r#"{"nodes": 3}"#]);
    let cl = Cl::new("az-loop");
    let tag = unique("clw-az-loop");
    let uuids: Vec<String> = (0..3)
        .map(|i| {
            let pause = if i == 0 { "sleep 6; " } else { "" };
            cl.run_bundle(
                &tag,
                &["--request-memory", "500m"],
                &format!("{pause}echo azure-{i}"),
            )
        })
        .collect();
    for u in &uuids {
        wait_for(&peer().client(), u, T, |s| s == "staged");
    }
    let prefix = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let m = start_manager_with(
        dir.path(),
        &tag,
        &prefix.path().display().to_string(),
        &[],
        &["--worker-image", image],
    );
    // A worker of the default shape (`--gpus 0`) on a GPU node offers no GPU.
    assert_eq!(
        testkit::cl::gpus_offered_for(&uuids[0]),
        0,
        "{}",
        m.log_text()
    );
    for u in &uuids {
        let b = wait_for(&peer().client(), u, T, is_final);
        assert_eq!(
            b.state(),
            Some("ready"),
            "{b:?}\ntasks: {:?}\n{}",
            tasks(),
            m.log_text()
        );
    }
    for (i, u) in uuids.iter().enumerate() {
        assert_eq!(cl.stdout(u), format!("azure-{i}\n"));
    }
    // Three tasks in one tick: no listing between the three adds.
    let ids: Vec<String> = m.launched().into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids.len(), 3, "{}", m.log_text());
    let reqs = requests();
    let adds: Vec<usize> = reqs
        .iter()
        .enumerate()
        .filter(|(_, r)| is_add_of(r, &ids))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(adds.len(), 3, "{}", m.log_text());
    assert!(
        reqs[adds[0]..=adds[2]]
            .iter()
            .all(|r| r["method"] == "POST"),
        "a listing came between the adds"
    );
    // The idle workers exit, their tasks complete, are reported once and deleted; each
    // worker's stdout and stderr are in the log container under its task id.
    wait_until(
        Duration::from_secs(120),
        "the completed tasks to be deleted",
        || tasks().is_empty(),
    );
    let names = blobs();
    for id in &ids {
        assert!(id.starts_with("cl_worker_"), "{id}");
        for f in ["stdout.txt", "stderr.txt"] {
            assert!(
                names.contains(&format!("{id}/{f}")),
                "{id}/{f} in {names:?}"
            );
        }
    }
    wait_until(
        Duration::from_secs(20),
        "the manager to see the ends",
        || m.log_text().matches("succeeded").count() >= 3,
    );
    assert_eq!(m.launches(), 3, "{}", m.log_text());
    // The pool is in /status and /metrics.
    let status: Value = serde_json::from_str(&m.get("/status")).unwrap();
    assert_eq!(status["pool"]["id"], az()["CLW_AZBATCH_POOL"].as_str());
    assert_eq!(status["pool"]["current_dedicated_nodes"], 3);
    let metrics = m.get("/metrics");
    assert_eq!(
        metric(
            &metrics,
            &format!(
                "cl_worker_manager_pool_nodes{{pool=\"{}\",nodes=\"current_dedicated\"}}",
                az()["CLW_AZBATCH_POOL"]
            )
        ),
        3,
        "{metrics}"
    );
    // No password, key or SAS in any task body, header we sent, or the manager's log; the
    // credentials file the workers read is private.
    for r in reqs.iter().filter(|r| is_add_of(r, &ids)) {
        let mut body = r["body"].clone();
        // The log container URL carries its SAS by design (Batch uploads with it).
        body["outputFiles"][0]["destination"]["container"]["containerUrl"] = Value::Null;
        assert_no_secret("a task body", &body.to_string());
        testkit::secrets::assert_absent("a task body", &body.to_string());
        for e in body["environmentSettings"].as_array().into_iter().flatten() {
            assert_ne!(e["name"], "CODALAB_PASSWORD", "{body}");
        }
        assert!(body["commandLine"]
            .as_str()
            .unwrap()
            .contains("--password-file"));
    }
    assert_no_secret("the manager log", &m.log_text());
    testkit::secrets::assert_absent("the manager log", &m.log_text());
    let pw = prefix.path().join(".worker-password");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&pw).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
}

/// A Spot node's eviction as Azure Batch does it: a Scheduled Event `Preempt` of the node
/// 15 s ahead, then the VM goes with everything on it. The worker, told to poll its node's
/// metadata service (`--worker-preemption-notice azure`), hands its run back in that time and
/// exits; a task on the other node runs the bundle again to `ready`.
#[test]
fn a_preempted_low_priority_node_gives_notice_and_its_worker_hands_the_run_back() {
    worker_image();
    sh(&["reset"]);
    sh(&["ctl", r#"{"nodes": 0, "low_priority_nodes": 2}"#]);
    let cl = Cl::new("az-preempt");
    let tag = unique("clw-az-preempt");
    let uuid = cl.run_bundle(
        &tag,
        &["--request-memory", "500m"],
        testkit::reclaim::BUNDLE,
    );
    wait_for(&peer().client(), &uuid, T, |s| s == "staged");
    let prefix = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let m = start_manager(
        dir.path(),
        &tag,
        &prefix.path().display().to_string(),
        &["--worker-preemption-notice", "azure"],
    );
    wait_for(&peer().client(), &uuid, T, |s| s == "running");
    let first = tasks();
    assert_eq!(first.len(), 1, "{first:?}");
    let node = first[0]["node"].as_str().unwrap().to_string();
    let t0 = Instant::now();
    let out = sh(&[
        "ctl",
        &format!(
            r#"{{"preempt": {{"node": "{node}", "notice_seconds": 15, "down_seconds": 30}}}}"#
        ),
    ]);
    assert!(out.contains(&node), "{out}");
    testkit::reclaim::assert_handed_back_then_ready(
        &cl,
        &uuid,
        t0,
        Duration::from_secs(10),
        "Azure Batch Spot node preempted (15 s notice)",
        || m.log_text(),
    );
    // The first worker left before the eviction (15 s after the notice, long before the
    // rerun's end): the eviction found no task on the node to requeue. (The manager deletes
    // ended tasks, so the stand-in's record of the eviction is what tells.)
    let logs = sh(&["logs", "2000"]);
    assert!(
        logs.contains(&format!("evict {node}: 0 task(s) requeued")),
        "{logs}"
    );
    assert_eq!(m.launches(), 2, "{}", m.log_text());
    drop(m);
    sh(&["reset"]);
}

#[test]
fn pending_tasks_count_against_max_workers_and_a_restarted_manager_adopts_them() {
    worker_image();
    sh(&["reset"]);
    // No node: every task stays active (queued).
    sh(&["ctl", r#"{"hold": true}"#]);
    let cl = Cl::new("az-pend");
    let tag = unique("clw-az-pend");
    let uuids: Vec<String> = (0..5)
        .map(|_| cl.run_bundle(&tag, &["--request-memory", "500m"], "echo pending"))
        .collect();
    for u in &uuids {
        wait_for(&peer().client(), u, T, |s| s == "staged");
    }
    let prefix = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let prefix_s = prefix.path().display().to_string();
    let mut m = start_manager(dir.path(), &tag, &prefix_s, &["--max-workers", "3"]);
    wait_until(Duration::from_secs(30), "three tasks", || {
        tasks().len() == 3
    });
    // Several ticks later: still three, all queued, counted as pending.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        let t = tasks();
        assert!(t.len() <= 3, "more than --max-workers tasks: {t:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(tasks().iter().all(|t| t["state"] == "active"));
    let metrics = m.get("/metrics");
    assert_eq!(
        metric(
            &metrics,
            "cl_worker_manager_workers{shape=\"default\",state=\"pending\"}"
        ),
        3,
        "{metrics}"
    );
    // Requests per tick at steady state: one listing page and the pool. A tick counts itself
    // after its requests, so the counter is read first and last: every tick whose requests
    // fall between the two reads of the requests is counted, but for the last one (whose
    // count may come after the final read), hence the one tick of slack below.
    let ticks0 = metric(&m.get("/metrics"), "cl_worker_manager_ticks_total");
    let before = requests().len();
    std::thread::sleep(Duration::from_secs(6));
    let sent = requests().len() - before;
    let ticks = metric(&m.get("/metrics"), "cl_worker_manager_ticks_total") - ticks0;
    assert!(ticks >= 2, "{ticks} ticks");
    assert!(
        sent as u64 <= 2 * (ticks + 1),
        "{sent} requests in {ticks} ticks: {:?}",
        &requests()[before..]
    );
    // SIGKILL, restart: the three tasks are adopted, none is added.
    let ids: Vec<Value> = tasks().iter().map(|t| t["id"].clone()).collect();
    m.child.kill().unwrap();
    m.child.wait().unwrap();
    let m2 = start_manager(dir.path(), &tag, &prefix_s, &["--max-workers", "3"]);
    wait_until(
        Duration::from_secs(30),
        "four ticks of the new manager",
        || metric(&m2.get("/metrics"), "cl_worker_manager_ticks_total") >= 4,
    );
    let after: Vec<Value> = tasks().iter().map(|t| t["id"].clone()).collect();
    assert_eq!(after, ids, "{}", m2.log_text());
    assert_eq!(m2.launches(), 0, "{}", m2.log_text());
    let metrics = m2.get("/metrics");
    assert_eq!(
        metric(
            &metrics,
            "cl_worker_manager_workers{shape=\"default\",state=\"pending\"}"
        ),
        3,
        "{metrics}"
    );
    drop(m2);
    sh(&["reset"]);
    for u in &uuids {
        cl.run(&["kill", u]);
    }
}

#[test]
fn a_missing_job_launches_nothing_and_a_wrong_key_stops_the_manager_at_once() {
    sh(&["reset"]);
    sh(&["ctl", r#"{"hold": true}"#]);
    let cl = Cl::new("az-job");
    let tag = unique("clw-az-job");
    let prefix = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let prefix_s = prefix.path().display().to_string();
    let m = start_manager(dir.path(), &tag, &prefix_s, &[]);
    assert!(
        m.wait_log("Azure Batch job", Duration::from_secs(20)),
        "{}",
        m.log_text()
    );
    sh(&["ctl", r#"{"job_missing": true}"#]);
    let uuid = cl.run_bundle(&tag, &["--request-memory", "500m"], "echo job");
    wait_for(&peer().client(), &uuid, T, |s| s == "staged");
    m.wait_ticks(3);
    assert!(
        !requests().iter().any(|r| is_add_of(r, &[])),
        "{}",
        m.log_text()
    );
    let metrics = m.get("/metrics");
    assert!(
        metric(
            &metrics,
            "cl_worker_manager_observation_errors_total{source=\"backend_list\"}"
        ) >= 2,
        "{metrics}"
    );
    assert!(m.log_text().contains("JobNotFound"), "{}", m.log_text());
    // The job is back: the bundle gets its worker.
    sh(&["ctl", r#"{"job_missing": false}"#]);
    wait_until(Duration::from_secs(20), "a task", || tasks().len() == 1);
    drop(m);
    cl.run(&["kill", &uuid]);
    sh(&["reset"]);

    // A wrong key: the pre-flight check stops the manager with the service's answer.
    let p = peer();
    let e = az();
    let out = std::process::Command::new(testkit::binary("cl-worker-manager"))
        .args([
            "--server",
            &p.server_url(),
            "--worker-work-dir-prefix",
            &prefix_s,
            "azure-batch",
            "--account-name",
            &e["CLW_AZBATCH_ACCOUNT"],
            "--service-url",
            &e["CLW_AZBATCH_URL"],
            "--job-id",
            &e["CLW_AZBATCH_JOB"],
            "--log-container-url",
            "http://127.0.0.1:10101/worker-logs",
        ])
        .env("CODALAB_USERNAME", p.var("CLW_ROOT_USER"))
        .env("CODALAB_PASSWORD", p.var("CLW_ROOT_PASSWORD"))
        .env(
            "AZURE_BATCH_ACCOUNT_KEY",
            "d3Jvbmcga2V5IGZvciB0aGUgdGVzdCBhY2NvdW50IQ==",
        )
        .env_remove("AZURE_BATCH_LOG_CONTAINER_URL")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("AuthenticationFailed"), "{err}");
    assert_eq!(
        requests().len(),
        1,
        "one request, no storm: {:?}",
        requests()
    );
}

/// CodaLab's documented Azure Batch command (docs/Worker-Managers.md), as written: the account
/// key and the log container's URL on the command line, `--min-workers 0 --max-workers 8
/// --worker-pass-down-termination --worker-exit-on-exception --worker-exit-after-num-runs 1`,
/// `--cpus/--gpus/--memory-mb` of the VM, no tag, no work-dir prefix; changed only in the
/// endpoints (the server, the stand-in's URLs), the times a test cannot wait for
/// (`--min-seconds-between-workers 300 --sleep-time 120`) and the registry's image tag
/// (`CODALAB_VERSION`). As written it is refused, naming the one flag our security model adds
/// (`--password-file`: the workers' credentials never go into the tasks' settings); with it, it
/// works, warning that the key is visible in `ps` and naming the flag to use instead. A CPU bundle and a GPU bundle (the fake GPU machine, found by the worker
/// container through the Docker engine) reach `ready`, each on a worker of its own.
#[test]
fn the_documented_command_takes_a_cpu_and_a_gpu_bundle_to_ready() {
    testkit::images::gpu_host_worker_image();
    sh(&["reset"]);
    sh(&["ctl", r#"{"nodes": 2}"#]);
    let user = testkit::peers::add_user("clwdocaz");
    let cl = Cl::as_user("az-doc", &user);
    let (cpu, gpu) = testkit::manager::stage_cpu_and_gpu(&cl);
    let p = peer();
    let e = az();
    let mut args = testkit::manager::documented_globals(&p.server_url());
    args.extend(
        [
            "azure-batch",
            "--account-name",
            &e["CLW_AZBATCH_ACCOUNT"],
            "--account-key",
            &e["CLW_AZBATCH_KEY"],
            "--service-url",
            &e["CLW_AZBATCH_URL"],
            "--log-container-url",
            &e["CLW_AZBATCH_CONTAINER_URL"],
            "--job-id",
            &e["CLW_AZBATCH_JOB"],
        ]
        .map(String::from),
    );
    args.extend(testkit::manager::documented_vm());
    let env = testkit::manager::documented_env(&user);
    // As written: refused at once, naming the one flag to add.
    let dir = tempfile::tempdir().unwrap();
    testkit::manager::assert_refused(
        dir.path(),
        &args,
        &env,
        "never from the tasks' settings: add --password-file FILE (mode 600",
    );
    // With the credentials file (here: the nodes are this machine).
    let creds = tempfile::tempdir().unwrap();
    let file = creds.path().join("codalab-credentials");
    std::fs::write(&file, format!("{}\n{}\n", user.name, user.password)).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    args.extend(["--password-file".to_string(), file.display().to_string()]);
    let m = ManagerProc::spawn(dir.path(), &args, &env);
    testkit::manager::assert_cpu_and_gpu_ready(&cl, &m, &cpu, &gpu);
    assert!(
        m.log_text().contains(
            "--account-key on the command line is visible to every user of this machine \
             (ps, /proc); prefer --account-key-file or AZURE_BATCH_ACCOUNT_KEY"
        ),
        "{}",
        m.log_text()
    );
    // One worker a run. A worker that died before it checked in is replaced (that is the
    // manager's job), and its own log is in the message: two "nodes" of the stand-in share
    // this machine's Docker engine and /tmp with the other lanes' workers.
    let (lost, their_logs) = lost_task_logs(&m.log_text());
    assert_eq!(
        m.launches(),
        2 + lost,
        "one worker a run, {lost} replaced: {}\n----- the lost workers' logs -----\n{their_logs}",
        m.log_text()
    );
    assert!(
        lost <= 2,
        "{lost} workers died before they checked in:\n{their_logs}\n{}",
        m.log_text()
    );
    if lost > 0 {
        eprintln!("{lost} worker(s) replaced after dying before check-in:\n{their_logs}");
    }
    assert_no_secret("the manager log", &m.log_text());
    // Each worker leaves after its run (--worker-exit-after-num-runs 1): its task completes.
    wait_until(
        Duration::from_secs(120),
        "the completed tasks to be deleted",
        || tasks().is_empty(),
    );
}

/// A pool's broken nodes, as Azure reports them, are removed after the grace period
/// (`--remove-unhealthy-nodes-after`) in one *Remove Nodes* each, their place taken by fresh
/// nodes; a resize that failed on quota shows the service's error in `/status`, on the page and
/// in `/metrics`, and goes when the service clears it.
#[test]
fn broken_pool_nodes_are_removed_and_resize_errors_reported() {
    sh(&["reset"]);
    sh(&["ctl", r#"{"nodes": 3}"#]);
    let pool = az()["CLW_AZBATCH_POOL"].clone();
    let broken = |state: &str, extra: &str| -> String {
        let out = sh(&[
            "ctl",
            &format!(r#"{{"node_state": {{"node": "{extra}", "state": "{state}"}}}}"#),
        ]);
        let v: Value = serde_json::from_str(&out).unwrap();
        v["node"].as_str().unwrap().to_string()
    };
    let prefix = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tag = unique("clw-az-heal");
    let m = start_manager_with(
        dir.path(),
        &tag,
        &prefix.path().display().to_string(),
        &[],
        &["--remove-unhealthy-nodes-after", "8"],
    );
    m.metrics_addr();
    let unusable = broken("unusable", "first");
    let failed = broken("starttaskfailed", "last");
    let t0 = Instant::now();
    // Reported at once, removed only after the grace.
    wait_until(T, "the broken nodes reported", || {
        let s: Value = serde_json::from_str(&m.get("/status")).unwrap();
        s["pool"]["unhealthy_nodes"].as_array().map_or(0, Vec::len) == 2
    });
    let page = m.get("/");
    assert!(
        page.contains(&format!("node {unusable} unusable")),
        "{page}"
    );
    assert!(page.contains("NodeAgentUnreachable"), "{page}");
    let removals = || state()["removals"].as_array().cloned().unwrap_or_default();
    wait_until(T, "both broken nodes removed", || {
        removals()
            .iter()
            .map(|r| r["nodes"].as_array().unwrap().len())
            .sum::<usize>()
            == 2
    });
    assert!(
        t0.elapsed() >= Duration::from_secs(4),
        "removed before the grace"
    );
    for r in removals() {
        assert_eq!(r["option"], "terminate", "{r}");
    }
    let asked: Vec<Value> = requests()
        .into_iter()
        .filter(|r| r["path"].as_str().unwrap().ends_with("/removenodes"))
        .collect();
    let mut ids: Vec<String> = asked
        .iter()
        .flat_map(|r| r["body"]["nodeList"].as_array().unwrap().clone())
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    ids.sort();
    let mut want = vec![unusable.clone(), failed.clone()];
    want.sort();
    assert_eq!(ids, want, "{asked:?}");
    for state in ["unusable", "starttaskfailed"] {
        let series = format!(
            "cl_worker_manager_pool_nodes_removed_total{{pool=\"{pool}\",state=\"{state}\"}}"
        );
        wait_until(T, "the removals counted", || {
            metric(&m.get("/metrics"), &series) == 1
        });
    }
    let log = m.log_text();
    assert!(
        log.contains(&format!("removing node {unusable} (unusable for")),
        "{log}"
    );
    // Fresh nodes take their place, and nothing is left to report or remove.
    wait_until(T, "three healthy nodes again", || {
        let nodes = state()["node_states"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        nodes.len() == 3 && nodes.values().all(|s| s == "idle") && !nodes.contains_key(&unusable)
    });
    wait_until(T, "no unhealthy node reported", || {
        let metrics = m.get("/metrics");
        metric_sum(&metrics, "cl_worker_manager_pool_unhealthy_nodes") == 0.0
    });
    assert_eq!(removals().len(), asked.len(), "a node was asked for twice");

    // A resize that fails on quota: the service's words on the status page and in /metrics.
    sh(&[
        "ctl",
        r#"{"resize_failure": {"code": "AccountCoreQuotaReached", "message": "The specified account has reached VM core quota limit.", "max_nodes": 1}}"#,
    ]);
    let series = format!(
        "cl_worker_manager_pool_resize_errors{{pool=\"{pool}\",code=\"AccountCoreQuotaReached\"}}"
    );
    wait_until(T, "the resize error reported", || {
        metric(&m.get("/metrics"), &series) == 1
    });
    let s: Value = serde_json::from_str(&m.get("/status")).unwrap();
    assert_eq!(
        s["pool"]["resize_errors"][0]["code"], "AccountCoreQuotaReached",
        "{s}"
    );
    assert_eq!(s["pool"]["current_dedicated_nodes"], 1, "{s}");
    assert!(m
        .get("/")
        .contains("resize error AccountCoreQuotaReached: The specified account"));
    sh(&["ctl", r#"{"resize_failure": null}"#]);
    wait_until(T, "the resize error gone", || {
        !m.get("/metrics")
            .contains("cl_worker_manager_pool_resize_errors{")
    });
    assert_eq!(m.launches(), 0, "{}", m.log_text());
    drop(m);
    sh(&["reset"]);
}
