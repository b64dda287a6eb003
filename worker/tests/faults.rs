//! The fault suite, worker side: the real CodaLab 1.7.5 server and the real Docker engine, each
//! broken in turn under a running `cl-worker`. Every test ends by stating what was lost, and
//! asserts that it is nothing. The manager's faults (Slurm's controller and moto restarted
//! mid-tick) and the credentials scan are in `manager/tests/faults.rs`.
//!
//! These tests stop the REST server, restart MariaDB and the Docker engine, and mount a small
//! file system: they must run alone (scripts/test.sh runs every test binary with one thread).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use testkit::{cl::*, fault_report, k8s, peers::*, wait_until, worker::*};

/// `tests/peers/codalab-server.sh ARGS`.
fn server(args: &[&str]) {
    let mut all = vec!["tests/peers/codalab-server.sh"];
    all.extend_from_slice(args);
    bash(&all, &HashMap::new());
}

fn sleep_until(t: Instant) {
    if let Some(d) = t.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
}

fn alive(w: &mut WorkerProc) -> bool {
    w.child.try_wait().unwrap().is_none()
}

/// What a finished run wrote to a file of its bundle ("" when it is not there).
fn cat_or_empty(cl: &Cl, target: &str) -> String {
    let out = cl.command(&["cat", target]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The REST server is stopped for 120 s while a run is in flight, and MariaDB is restarted once
/// during that outage. The run goes on in its container, its results wait for the server, and
/// the bundle ends `ready` with its whole output.
#[test]
fn rest_server_down_for_120_s_and_mariadb_restarted_mid_run() {
    let mut w = WorkerProc::start("fault-rest", &[]);
    let cl = Cl::new("fault-rest");
    let client = peer().client();
    let uuid = cl.run_bundle(
        &w.tag,
        &["--request-memory", "64m"],
        "sleep 20; seq 1 200000 > numbers; echo finished",
    );
    wait_for(&client, &uuid, T, |s| s == "running");

    let down = Instant::now();
    server(&["stop-service", "rest-server"]);
    std::thread::sleep(Duration::from_secs(30));
    server(&["stop-service", "mysql"]);
    server(&["start-service", "mysql"]);
    let db_back = down.elapsed();
    sleep_until(down + Duration::from_secs(120));
    assert!(
        alive(&mut w),
        "the worker exited during the outage:\n{}",
        w.log_text()
    );
    // `start` brings back the REST server, and the bundle manager if MariaDB's restart ended it.
    server(&["start"]);
    let up = Instant::now();
    let outage = down.elapsed();

    // `worker_offline` (the server's view during the outage) is not an end: the worker comes back.
    let b = wait_for(&client, &uuid, Duration::from_secs(300), |s| {
        matches!(s, "ready" | "failed" | "killed")
    });
    let recovered = up.elapsed();
    // What the outage cost the run: its end, its output, its lines.
    let mut lost = Vec::new();
    if b.state() != Some("ready") {
        lost.push(format!("the run ended {:?}", b.state()));
    }
    let stdout = cat_or_empty(&cl, &format!("{uuid}/stdout"));
    if stdout != "finished\n" {
        lost.push(format!("its stdout is {stdout:?}"));
    }
    let numbers = cat_or_empty(&cl, &format!("{uuid}/numbers"));
    let lines = numbers.lines().count();
    if lines != 200_000 || numbers.lines().last() != Some("200000") {
        lost.push(format!("{} of 200000 lines", lines));
    }
    if !lost.is_empty() {
        eprintln!("{b:?}\n{}", w.log_text());
    }
    fault_report(
        "REST server outage",
        &format!(
            "server down {:.0} s (MariaDB restarted {:.0} s in); the run ended {:?} with {lines} \
             lines {:.1} s after the server came back",
            outage.as_secs_f64(),
            db_back.as_secs_f64(),
            b.state().unwrap_or_default(),
            recovered.as_secs_f64()
        ),
        &lost,
    );
    assert!(alive(&mut w), "{}", w.log_text());
    let log = w.log_text();
    assert!(
        log.contains("checkin failed") || log.contains("retrying"),
        "the worker never saw the outage:\n{log}"
    );

    // The worker keeps serving.
    let next = cl.run_bundle(&w.tag, &["--request-memory", "64m"], "echo after");
    let b = wait_for(&client, &next, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
}

/// The Docker engine is restarted (its containers stopped with it) while a run is in flight.
/// The worker notices, fails that run with a message saying what happened, and keeps serving
/// new runs on the restarted engine.
#[test]
fn docker_engine_restarted_mid_run() {
    let mut w = WorkerProc::start("fault-docker", &[]);
    let cl = Cl::new("fault-docker");
    let client = peer().client();
    let uuid = cl.run_bundle(&w.tag, &["--request-memory", "64m"], "sleep 300");
    wait_for(&client, &uuid, T, |s| s == "running");

    let t0 = Instant::now();
    let out = bash(
        &["tests/peers/docker-engine.sh", "restart"],
        &HashMap::new(),
    );
    let restart_secs = out.trim().to_string();
    let b = wait_for(&client, &uuid, T, is_final);
    let noticed = t0.elapsed();
    let message = meta_str(&b, "failure_message");
    assert_final_state_or_server_race(&b, "failed", &w.log_text());
    assert!(
        message.contains("Docker engine"),
        "the failure message should say what happened: {message:?}\n{}",
        w.log_text()
    );
    assert!(alive(&mut w), "{}", w.log_text());

    let next = cl.run_bundle(
        &w.tag,
        &["--request-memory", "64m"],
        "echo after the restart",
    );
    let b = wait_for(&client, &next, T, is_final);
    // What the restart cost beyond the run in flight: the worker's next run.
    let mut lost = Vec::new();
    if b.state() != Some("ready") {
        lost.push(format!("the next run ended {:?}", b.state()));
    }
    let out = cat_or_empty(&cl, &format!("{next}/stdout"));
    if out != "after the restart\n" {
        lost.push(format!("the next run's stdout is {out:?}"));
    }
    if !lost.is_empty() {
        eprintln!("{b:?}\n{}", w.log_text());
    }
    fault_report(
        "Docker engine restart",
        &format!(
            "engine back in {restart_secs} s; the run in flight failed {:.1} s after the restart \
             began with {message:?}; the next run ended ready",
            noticed.as_secs_f64()
        ),
        &lost,
    );
}

/// A small file system mounted for the test; unmounted when dropped.
struct SmallFs {
    path: std::path::PathBuf,
}

impl SmallFs {
    fn mount(path: &Path, size: &str) -> Self {
        std::fs::create_dir_all(path).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "clw-fault-fs"])
            .arg(path)
            .status()
            .expect("mount runs");
        assert!(
            st.success(),
            "cannot mount a {size} tmpfs on {} (the fault suite runs as root)",
            path.display()
        );
        SmallFs {
            path: path.to_owned(),
        }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// The dependency cache's state file, by parent uuid: (stage, name).
fn cache_entries(work_dir: &Path) -> BTreeMap<String, (String, String)> {
    let text = std::fs::read_to_string(work_dir.join("dependencies-state.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("dependencies-state.json is corrupt ({e}): {text}"));
    v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["parent_uuid"].as_str().unwrap().to_string(),
                (
                    e["stage"].as_str().unwrap().to_string(),
                    e["name"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect()
}

/// The work dir is a 40 MiB file system. A dependency that does not fit fails its run with the
/// file system's own words; a run whose output fills the disk fails on its own; the cached
/// dependency other runs use stays intact, and the worker stays healthy.
#[test]
fn work_dir_file_system_full() {
    let id = unique("clw-fault-full");
    let dir = tempfile::tempdir().unwrap();
    let fs = SmallFs::mount(&dir.path().join("wd"), "40m");
    let wd = fs.path.clone();
    let mut w = WorkerProc::start_as(&id, &id.clone(), dir, &[]);
    let cl = Cl::new("fault-full");
    let client = peer().client();
    let files = tempfile::tempdir().unwrap();

    // A small dependency, cached by a first run.
    let small_text: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
    let small = cl.upload_text(files.path(), "small.txt", &small_text);
    let dep = format!("dep:{small}");
    let first = cl.run_bundle(&w.tag, &["--request-memory", "64m", &dep], "wc -l < dep");
    let b = wait_for(&client, &first, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    assert_eq!(cl.stdout(&first).trim(), "20000");

    // A 64 MiB dependency of random bytes does not fit.
    let big_path = files.path().join("big.bin");
    let st = Command::new("head")
        .args(["-c", "64M", "/dev/urandom"])
        .stdout(std::fs::File::create(&big_path).unwrap())
        .status()
        .unwrap();
    assert!(st.success());
    let big = last_uuid(&cl.run(&["upload", big_path.to_str().unwrap()]));
    let too_big = cl.run_bundle(
        &w.tag,
        &["--request-memory", "64m", &format!("big:{big}")],
        "ls -l big",
    );
    let b = wait_for(&client, &too_big, T, is_final);
    let message = meta_str(&b, "failure_message");
    assert_final_state(&b, "failed", &w.log_text());
    assert!(
        message.contains("No space left on device"),
        "the failure should name the full disk: {message:?}\n{}",
        w.log_text()
    );

    // A run whose own output fills the disk.
    let filler = cl.run_bundle(
        &w.tag,
        &["--request-memory", "64m"],
        "head -c 100M /dev/zero > fill",
    );
    // Its stderr may be empty (no room to write it): the failure message says why.
    let b = wait_for(&client, &filler, T, is_final);
    assert_final_state_or_server_race(&b, "failed", &w.log_text());
    let filler_message = meta_str(&b, "failure_message");
    assert!(
        filler_message.contains("No space left on device"),
        "{filler_message:?}\n{}",
        w.log_text()
    );

    // The cache: the small dependency is still ready and whole, the big one is not "ready",
    // no partial download is left, and the state file parses.
    let entries = cache_entries(&wd);
    let (stage, name) = entries
        .get(&small)
        .cloned()
        .expect("the small entry is kept");
    assert_eq!(stage, "ready", "{entries:?}");
    assert_eq!(
        std::fs::read_to_string(wd.join("dependencies").join(&name)).unwrap(),
        small_text
    );
    assert_ne!(entries.get(&big).map(|e| e.0.as_str()), Some("ready"));
    wait_until(Duration::from_secs(30), "partial downloads cleaned", || {
        std::fs::read_dir(wd.join("dependencies"))
            .unwrap()
            .all(|e| {
                !e.unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with(".partial.")
            })
    });

    // The worker is healthy: a run on the cached dependency ends ready with the same bytes.
    let again = cl.run_bundle(&w.tag, &["--request-memory", "64m", &dep], "md5sum < dep");
    let b = wait_for(&client, &again, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    let expected = Command::new("md5sum")
        .stdin(std::fs::File::open(files.path().join("small.txt")).unwrap())
        .output()
        .unwrap();
    let got = cat_or_empty(&cl, &format!("{again}/stdout"));
    let lost: Vec<String> = (got != String::from_utf8_lossy(&expected.stdout))
        .then(|| format!("the cached dependency read back as {got:?}"))
        .into_iter()
        .collect();
    assert!(alive(&mut w), "{}", w.log_text());
    fault_report(
        "work dir full (40 MiB tmpfs)",
        &format!(
            "the dependency that did not fit failed with {message:?}; the run that filled the \
             disk failed with {filler_message:?}; the cached dependency was intact and reused"
        ),
        &lost,
    );
    drop(w);
}

/// The checkin times the server recorded for `worker_id`, sampled every second until `stop`.
/// Read from its database (the column `/workers/info` reports, in whole seconds as there), not
/// through the REST server: that is one process, and each `/workers/info` loads every run the
/// worker holds, beside the checkins being measured.
fn watch_checkins(worker_id: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<f64>> {
    std::thread::spawn(move || {
        let query = format!(
            "SELECT TIMESTAMPDIFF(SECOND, '1970-01-01', checkin_time) FROM worker \
             WHERE worker_id = '{worker_id}'"
        );
        let mut seen: Vec<f64> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let t = sql(&query)
                .lines()
                .find_map(|l| l.trim().parse::<f64>().ok());
            if let Some(t) = t {
                if seen.last() != Some(&t) {
                    seen.push(t);
                }
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        seen
    })
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// A node of the Kubernetes stand-in with 128 CPUs, for as long as it lives (its pods are
/// containers of this machine's Docker engine, like every stand-in node's).
struct BigNode(String);

impl BigNode {
    fn create() -> Self {
        let name = unique("clw-fault-node");
        let capacity = serde_json::json!({"cpu": "128", "memory": "64Gi", "pods": "250",
                                          "ephemeral-storage": "100Gi"});
        let (code, body) = k8s::api(
            "POST",
            "/api/v1/nodes",
            Some(&serde_json::json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                      "kubernetes.io/os": "linux"}},
                "status": {
                    "capacity": capacity, "allocatable": capacity,
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                    "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                  {"type": "Hostname", "address": name}],
                },
            })),
        );
        assert_eq!(code, 201, "cannot create node {name}: {body}");
        BigNode(name)
    }
}

impl Drop for BigNode {
    fn drop(&mut self) {
        k8s::api("DELETE", &format!("/api/v1/nodes/{}", self.0), None);
    }
}

/// 100 runs at once on one worker: the server never goes more than 60 s without a checkin from
/// it (the largest gap is measured from the server's own record), and every run ends `ready`.
/// CodaLab's scheduler gives every run at least one CPU, and this machine has two: the worker
/// runs its bundles with the Kubernetes runtime on a 128-CPU node of the stand-in, whose pods
/// are containers of this machine's Docker engine.
#[test]
fn hundred_concurrent_runs_keep_checkins_flowing() {
    const N: usize = 100;
    let node = BigNode::create();
    let id = unique("clw-fault-100");
    let mut w = WorkerProc::start_env(
        &id,
        &id,
        tempfile::tempdir().unwrap(),
        &[
            "--bundle-runtime",
            "kubernetes",
            "--kubernetes-cluster-host",
            &k8s::url(),
            "--kubernetes-namespace",
            k8s::NS,
        ],
        &[("CODALAB_KUBERNETES_NODE_NAME", node.0.clone())],
    );
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_checkins(w.id.clone(), stop.clone());
    let t0 = now_secs();

    // Every run waits at a gate: a file the test creates, once all of them run, in the
    // worker's cached copy of their one dependency (a directory every run mounts).
    let cl = Cl::new("fault-100");
    let gate_dir = tempfile::tempdir().unwrap();
    std::fs::write(gate_dir.path().join("README"), "the gate of the 100 runs\n").unwrap();
    let gate = last_uuid(&cl.run(&["upload", gate_dir.path().to_str().unwrap()]));
    let dep = format!("gate:{gate}");

    // Staged from four CLI sessions at once.
    let tag = w.tag.clone();
    let uuids: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|k| {
                let tag = tag.clone();
                let dep = dep.clone();
                s.spawn(move || {
                    let cl = Cl::new(&format!("fault-100-{k}"));
                    (0..N / 4)
                        .map(|i| {
                            cl.run_bundle(
                                &tag,
                                &["--request-memory", "16m", &dep],
                                &format!(
                                    "until [ -e gate/open ]; do sleep 1; done; echo run {k} {i}"
                                ),
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert_eq!(uuids.len(), N);

    // All 100 states in one snapshot of the server's database, every 3 s: reading them
    // through the REST server (one process) competed with the checkins this test is about.
    let list = uuids
        .iter()
        .map(|u| format!("'{u}'"))
        .collect::<Vec<_>>()
        .join(",");
    let query = format!("SELECT uuid, state FROM bundle WHERE uuid IN ({list})");
    let states = || -> Vec<String> {
        let rows = sql(&query);
        let by_uuid: HashMap<&str, &str> =
            rows.lines().filter_map(|l| l.split_once('\t')).collect();
        uuids
            .iter()
            .map(|u| {
                by_uuid
                    .get(u.as_str())
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default()
            })
            .collect()
    };
    let poll_until = |what: &str, done: &dyn Fn(&str) -> bool| -> Vec<String> {
        let t0 = Instant::now();
        loop {
            let last = states();
            if last.iter().all(|s| done(s)) {
                return last;
            }
            // 900 s: the 100 run pods start at the pace of a loaded machine (the serial tail
            // runs beside clippy); a rehearsal took past 600 s to have them all running. What
            // the test measures is the checkins meanwhile, not this pace.
            assert!(
                t0.elapsed() < Duration::from_secs(900),
                "timed out: {what}: {last:?}"
            );
            std::thread::sleep(Duration::from_secs(3));
        }
    };
    // No run can end before the gate opens: one snapshot with all of them running.
    poll_until("all 100 runs running", &|s| s == "running");
    let wd = w.work_dir.path().join("wd");
    let (_, name) = cache_entries(&wd)[&gate].clone();
    std::fs::write(wd.join("dependencies").join(name).join("open"), "").unwrap();
    // The server hands out one `mark_finalized` per checkin: 100 finalizations are 100
    // checkins, each of which the server makes write all the worker's runs.
    let states = poll_until("all 100 runs ended", &|s| {
        matches!(s, "ready" | "failed" | "killed")
    });
    stop.store(true, Ordering::Relaxed);
    let mut checkins = watcher.join().unwrap();
    checkins.push(now_secs());
    checkins.insert(0, t0);
    let largest_gap = checkins
        .windows(2)
        .map(|p| p[1] - p[0])
        .fold(0.0_f64, f64::max);

    let lost: Vec<String> = uuids
        .iter()
        .zip(&states)
        .filter(|(_, s)| *s != "ready")
        .map(|(u, s)| format!("{u} ended {s}"))
        .collect();
    if !lost.is_empty() {
        eprintln!("{}", w.log_text());
    }
    fault_report(
        "100 concurrent runs",
        &format!(
            "{} of {N} runs ready, all {N} running at once; largest gap between the server's \
             recorded checkins {largest_gap:.1} s over {} checkins (Kubernetes runtime, one \
             128-CPU node)",
            N - lost.len(),
            checkins.len() - 2
        ),
        &lost,
    );
    assert!(alive(&mut w));
    assert!(
        checkins.len() > 3,
        "too few checkins recorded: {checkins:?}"
    );
    assert!(
        largest_gap < 60.0,
        "the server went {largest_gap:.1} s without a checkin: {checkins:?}"
    );
    drop(w);
}
