//! End to end: the real CodaLab server, the Kubernetes stand-in (tests/peers/k8s.sh: an API
//! served by kube-fake-client, and a node agent that runs bound pods in the machine's Docker
//! engine) and `cl-worker-manager kubernetes` on kube-rs. Every object the manager creates is
//! checked with PyPI kubernetes-validate in strict mode.
//!
//! Each test uses its own `--manager-name`, so that its pods, faults and counts are its own.

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::images::worker_image;
use testkit::k8s::*;
use testkit::manager::{metric, metric_sum, ManagerProc};
use testkit::{cl::*, peers::*, worker::*};

#[path = "e2e_k8s/proxy.rs"]
mod proxy;
use proxy::CountingProxy;

/// Reclaimed capacity: a worker pod deleted with a grace period, a node gone NotReady.
#[path = "e2e_k8s/reclaim.rs"]
mod reclaim;

/// Two managers on one Kubernetes lease.
#[path = "e2e_k8s/lease.rs"]
mod lease;

/// The pods of manager `name`, by name.
fn pods(name: &str) -> Vec<Value> {
    let (code, list) = api(
        "GET",
        &format!("/api/v1/namespaces/{NS}/pods?labelSelector=codalab.org/manager%3D{name}"),
        None,
    );
    assert_eq!(code, 200, "{list}");
    list["items"].as_array().cloned().unwrap_or_default()
}

fn pod_names(name: &str) -> Vec<String> {
    let mut v: Vec<String> = pods(name)
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

/// Deletes every pod of manager `name` (and lifts its faults) when dropped.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let sel = format!("codalab.org/manager={}", self.0);
        for kind in ["unschedulable", "image-pull-fail"] {
            let _ = Command::new("bash")
                .args(["tests/peers/k8s.sh", kind, "off", &sel])
                .current_dir(repo_root())
                .output();
        }
        for name in pod_names(&self.0) {
            api(
                "DELETE",
                &format!("/api/v1/namespaces/{NS}/pods/{name}"),
                None,
            );
        }
    }
}

/// `cl-worker-manager … kubernetes` named `name`, serving the worker queue `tag`, with its
/// workers' work dirs under `prefix`.
fn start_manager(
    dir: &std::path::Path,
    prefix: &std::path::Path,
    tag: &str,
    name: &str,
    globals: &[&str],
    extra: &[&str],
) -> ManagerProc {
    start_manager_at(dir, prefix, tag, name, &url(), globals, extra)
}

fn start_manager_at(
    dir: &std::path::Path,
    prefix: &std::path::Path,
    tag: &str,
    name: &str,
    api_url: &str,
    globals: &[&str],
    extra: &[&str],
) -> ManagerProc {
    ensure_secret();
    let p = peer();
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
        &prefix.display().to_string(),
        "--metrics-addr",
        "127.0.0.1:0",
    ]
    .map(String::from)
    .to_vec();
    // A global flag given by the test replaces the default above.
    for pair in globals.chunks(2) {
        if let Some(i) = args.iter().position(|a| a == pair[0]) {
            args.drain(i..i + 2);
        }
    }
    args.extend(globals.iter().map(|s| s.to_string()));
    args.extend(
        [
            "kubernetes",
            "--cluster-host",
            api_url,
            "--namespace",
            NS,
            "--manager-name",
            name,
            "--password-secret",
            SECRET,
        ]
        .map(String::from),
    );
    if !extra.contains(&"--worker-image") {
        args.extend(["--worker-image".to_string(), worker_image().to_string()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let env = HashMap::from([
        ("CODALAB_USERNAME".to_string(), p.var("CLW_ROOT_USER")),
        ("CODALAB_PASSWORD".to_string(), p.var("CLW_ROOT_PASSWORD")),
    ]);
    ManagerProc::spawn(dir, &args, &env)
}

fn stage(cl: &Cl, tag: &str, command: &str) -> String {
    let uuid = cl.run_bundle(tag, &["--request-memory", "500m"], command);
    wait_for(&peer().client(), &uuid, T, |s| s == "staged");
    uuid
}

#[test]
fn full_loop_with_the_kubernetes_bundle_runtime_and_no_docker_socket() {
    let name = unique("k8s-rt");
    let _clean = Cleanup(name.clone());
    let cl = Cl::new("k8s-rt");
    let tag = unique("clw-k8s-rt");
    let uuids: Vec<String> = (0..3)
        .map(|i| stage(&cl, &tag, &format!("echo pod-run-{i}")))
        .collect();
    let prefix = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let m = start_manager(
        dir.path(),
        prefix.path(),
        &tag,
        &name,
        &[],
        &[
            "--bundle-runtime",
            "kubernetes",
            "--worker-cluster-host",
            &url(),
        ],
    );
    // The first worker may take all three runs (a run pod needs no worker CPU) before the
    // others start, and the next tick cancels a pod no staged bundle needs: the pods are
    // checked as they were created, not as they are listed later.
    wait_until(Duration::from_secs(60), "3 launches", || m.launches() >= 3);
    let created: Vec<String> = m.launched().into_iter().map(|(id, _)| id).collect();
    for p in created_pods(&created) {
        let vols = p["spec"]["volumes"].as_array().unwrap();
        assert!(
            vols.iter()
                .all(|v| v["name"] != "docker-socket"
                    && v["hostPath"]["path"] != "/var/run/docker.sock"),
            "{p}"
        );
        assert_eq!(p["spec"]["automountServiceAccountToken"], true, "{p}");
        let mut argv = Vec::new();
        strings(&p["spec"]["containers"][0]["command"], &mut argv);
        let at = argv.iter().position(|a| a == "--bundle-runtime").unwrap();
        assert_eq!(argv[at + 1], "kubernetes", "{p}");
        // The API is reached with the pod's service account: no token on argv.
        assert!(argv.iter().all(|a| !a.contains("token")), "{p}");
    }
    validate_created(&created);
    for (i, uuid) in uuids.iter().enumerate() {
        let b = wait_for(&peer().client(), uuid, T, is_final);
        assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", m.log_text());
        assert_eq!(cl.stdout(uuid), format!("pod-run-{i}\n"));
    }
    // Each bundle ran in a pod of its own, created by a worker pod, and checked strictly.
    validate_created(
        &uuids
            .iter()
            .map(|u| format!("codalab-run-{u}"))
            .collect::<Vec<_>>(),
    );
    wait_until(Duration::from_secs(120), "all pods deleted", || {
        pods(&name).is_empty()
    });
    // A tick may see a bundle still staged while the server is assigning it to one of the
    // three workers, or while the workers have started but not checked in yet (their capacity
    // is not counted before their first check-in): it launches more. Those are cancelled once
    // unneeded for 10 s, or, started by then, leave by their own idle exit; either way they are
    // gone with the others (the pods above). Seen: up to 6 under a loaded suite; never more
    // than one a bundle more.
    let launches = m.launches();
    let log = m.log_text();
    assert!((3..=6).contains(&launches), "{launches} launches: {log}");
}

#[test]
fn full_loop_three_bundles_three_worker_pods_run_them_and_are_deleted() {
    let name = unique("k8s-loop");
    let _clean = Cleanup(name.clone());
    let cl = Cl::new("k8s-loop");
    let tag = unique("clw-k8s-loop");
    let password = peer().var("CLW_ROOT_PASSWORD");
    let uuids: Vec<String> = (0..3)
        .map(|i| {
            let pause = if i == 0 { "sleep 6; " } else { "" };
            stage(&cl, &tag, &format!("{pause}echo k8s-{i}"))
        })
        .collect();
    let prefix = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The worker image of a site whose nodes have GPUs (the fake ones).
    let image = testkit::images::gpu_host_worker_image();
    let m = start_manager(
        dir.path(),
        prefix.path(),
        &tag,
        &name,
        &[],
        &["--worker-image", image],
    );
    // One tick creates the three pods.
    wait_until(Duration::from_secs(60), "3 pods", || pods(&name).len() == 3);
    let created = pod_names(&name);
    assert_eq!(m.launches(), 3, "{}", m.log_text());
    // No password in any pod spec, env or argv; the workers read the mounted Secret.
    for p in pods(&name) {
        // (The test server's password is `codalab`, also the namespace's name: look where a
        // password could be, not for the word.)
        let c = &p["spec"]["containers"][0];
        let env: Vec<&str> = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(env, ["CODALAB_KUBERNETES_NODE_NAME"], "{p}");
        assert!(c["env"][0].get("value").is_none(), "{p}");
        let mut argv = Vec::new();
        strings(&c["command"], &mut argv);
        strings(&c["args"], &mut argv);
        assert!(argv.iter().all(|a| a != &password), "password on argv: {p}");
        let c = &p["spec"]["containers"][0];
        assert!(c["command"]
            .as_array()
            .unwrap()
            .windows(2)
            .any(|w| w[0] == "--password-file" && w[1] == "/etc/codalab/credentials"));
        assert!(c["env"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["name"] != "CODALAB_PASSWORD"));
    }
    validate_created(&created);
    // A worker of the default shape (`--gpus 0`) on a GPU node offers no GPU.
    assert_eq!(
        testkit::cl::gpus_offered_for(&uuids[0]),
        0,
        "{}",
        m.log_text()
    );
    // The node agent runs the worker image; each worker checks in and runs a bundle in Docker.
    for (i, uuid) in uuids.iter().enumerate() {
        let b = wait_for(&peer().client(), uuid, T, is_final);
        assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", m.log_text());
        assert_eq!(cl.stdout(uuid), format!("k8s-{i}\n"));
        let remote = meta_str(&b, "remote");
        assert!(
            created
                .iter()
                .any(|p| p.ends_with(remote.trim_start_matches("host-"))),
            "remote {remote} is not one of {created:?}"
        );
    }
    // Idle workers exit 0, their pods succeed, the manager reports and deletes them.
    wait_until(Duration::from_secs(120), "all pods deleted", || {
        pods(&name).is_empty()
    });
    let log = m.log_text();
    for p in &created {
        assert!(
            log.contains(&format!("job {p} (worker")),
            "{p} ended: {log}"
        );
    }
    assert!(!log.contains("unsuccessfully"), "{log}");
    assert!(
        log.lines()
            .filter(|l| l.to_lowercase().contains("password"))
            .all(|l| !l
                .split(|c: char| !c.is_alphanumeric())
                .any(|w| w == password)),
        "password in the manager's log: {log}"
    );
    let metrics = m.get("/metrics");
    wait_until(Duration::from_secs(20), "0 workers in /metrics", || {
        metric_sum(&m.get("/metrics"), "cl_worker_manager_workers") == 0.0
    });
    assert_eq!(m.launches(), 3, "{metrics}\n{}", m.log_text());
}

#[test]
fn pending_pods_count_toward_max_workers() {
    let name = unique("k8s-pending");
    let _clean = Cleanup(name.clone());
    fault(
        "unschedulable",
        true,
        &format!("codalab.org/manager={name}"),
    );
    let cl = Cl::new("k8s-pending");
    let tag = unique("clw-k8s-pending");
    let uuids: Vec<String> = (0..5).map(|_| stage(&cl, &tag, "echo pending")).collect();
    let prefix = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let m = start_manager(
        dir.path(),
        prefix.path(),
        &tag,
        &name,
        &["--max-workers", "3", "--sleep-time", "1"],
        &[],
    );
    wait_until(Duration::from_secs(30), "first pods", || {
        !pods(&name).is_empty()
    });
    // 10 ticks and more: never more than 3 pods, all pending (no node fits).
    let t0 = Instant::now();
    let mut most = 0;
    while t0.elapsed() < Duration::from_secs(12) {
        let now = pods(&name);
        most = most.max(now.len());
        assert!(now.len() <= 3, "{} pods: {now:?}", now.len());
        for p in &now {
            assert_eq!(p["status"]["phase"], "Pending", "{p}");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(most, 3);
    assert_eq!(m.launches(), 3, "{}", m.log_text());
    let metrics = m.get("/metrics");
    assert!(
        metric(&metrics, "cl_worker_manager_ticks_total") >= 10,
        "{metrics}"
    );
    let pending = metric(
        &metrics,
        "cl_worker_manager_workers{shape=\"default\",state=\"pending\"}",
    );
    assert_eq!(pending, 3, "{metrics}");
    drop(m);
    for u in uuids {
        cl.run(&["rm", "--force", &u]);
    }
}

#[test]
fn pods_that_cannot_pull_their_image_are_failed_launches_that_back_off() {
    let name = unique("k8s-pull");
    let _clean = Cleanup(name.clone());
    let cl = Cl::new("k8s-pull");
    let tag = unique("clw-k8s-pull");
    let uuid = stage(&cl, &tag, "echo never");
    let prefix = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // No such image in the engine (and no registry): ErrImagePull, then ImagePullBackOff.
    let mut m = start_manager(
        dir.path(),
        prefix.path(),
        &tag,
        &name,
        &[],
        &[
            "--worker-image",
            "cl-worker-test/no-such-image:latest",
            "--start-failure-timeout",
            "3",
        ],
    );
    let t0 = Instant::now();
    let mut backoff_seen = false;
    while t0.elapsed() < Duration::from_secs(32) {
        assert!(pods(&name).len() <= 1, "one launch at a time");
        if let Some(s) = m.child.try_wait().unwrap() {
            panic!("manager exited {s}: {}", m.log_text());
        }
        let metrics = m.get("/metrics");
        backoff_seen |= metric_sum(&metrics, "cl_worker_manager_launch_backoff_seconds") > 0.0;
        std::thread::sleep(Duration::from_secs(1));
    }
    let log = m.log_text();
    let launches = m.launches();
    // 2 s ticks for 32 s would be 16 launches; the back-off (5, 10, 20 s) allows 2 to 4.
    assert!((2..=4).contains(&launches), "{launches} launches\n{log}");
    assert!(
        log.contains("cannot start (ErrImagePull")
            || log.contains("cannot start (ImagePullBackOff"),
        "{log}"
    );
    assert!(
        log.contains("unsuccessfully before its worker checked in"),
        "{log}"
    );
    let metrics = m.get("/metrics");
    let failed = metric_sum(&metrics, "cl_worker_manager_failed_launches_total");
    assert!(failed >= 2.0, "{metrics}");
    assert!(
        metrics.lines().any(
            |l| l.starts_with("cl_worker_manager_failed_launches_total{")
                && (l.contains("reason=\"ImagePullBackOff\"")
                    || l.contains("reason=\"ErrImagePull\""))
        ),
        "{metrics}"
    );
    assert!(backoff_seen, "launch_backoff_seconds never rose: {metrics}");
    assert!(pods(&name).len() <= 1);
    drop(m);
    cl.run(&["rm", "--force", &uuid]);
}

/// Creates a sleeping pod labelled as a worker pod of manager `manager`; returns its name.
fn sleeping_pod(manager: &str, worker_id: &str) -> String {
    let name = format!("cl-worker-{worker_id}");
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {
            "app.kubernetes.io/managed-by": "cl-worker-manager",
            "codalab.org/manager": manager,
            "codalab.org/shape": "default",
            "codalab.org/worker-id": worker_id}},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "c", "image": "cl-worker-test/base:latest", "command": ["sleep", "600"],
            "resources": {"limits": {"cpu": "50m", "memory": "16Mi"}}}]},
    });
    let (code, body) = api("POST", &format!("/api/v1/namespaces/{NS}/pods"), Some(&pod));
    assert_eq!(code, 201, "{body}");
    name
}

#[test]
fn a_restarted_manager_adopts_its_pods_and_leaves_other_managers_alone() {
    let name = unique("k8s-adopt");
    let other = unique("k8s-other");
    let _clean = Cleanup(name.clone());
    let _clean_other = Cleanup(other.clone());
    fault(
        "unschedulable",
        true,
        &format!("codalab.org/manager={name}"),
    );
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let foreign = sleeping_pod(&other, &format!("{:016x}", nanos as u64));
    let cl = Cl::new("k8s-adopt");
    let tag = unique("clw-k8s-adopt");
    let uuids: Vec<String> = (0..2).map(|_| stage(&cl, &tag, "echo adopt")).collect();
    let prefix = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut first = start_manager(dir.path(), prefix.path(), &tag, &name, &[], &[]);
    wait_until(Duration::from_secs(30), "2 pods", || pods(&name).len() == 2);
    let before = pod_names(&name);
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let second = start_manager(dir.path(), prefix.path(), &tag, &name, &[], &[]);
    assert!(second.wait_log("serving /metrics", Duration::from_secs(20)));
    // A few ticks of its own, each of which could have launched.
    wait_ticks(&second, 4);
    assert_eq!(second.launches(), 0, "{}", second.log_text());
    assert_eq!(pod_names(&name), before);
    let metrics = second.get("/metrics");
    assert_eq!(
        metric_sum(&metrics, "cl_worker_manager_workers"),
        2.0,
        "{metrics}"
    );
    // The other manager's pod was neither counted nor touched.
    let others = pod_names(&other);
    assert_eq!(others, vec![foreign.clone()]);
    assert!(
        !second.log_text().contains(&foreign),
        "{}",
        second.log_text()
    );
    drop(second);
    for u in uuids {
        cl.run(&["rm", "--force", &u]);
    }
}

/// Waits until the manager has run `n` more ticks than now.
fn wait_ticks(m: &ManagerProc, n: u64) {
    let ticks = || metric(&m.get("/metrics"), "cl_worker_manager_ticks_total");
    let t0 = ticks();
    wait_until(Duration::from_secs(60), &format!("{n} ticks"), || {
        ticks() >= t0 + n
    });
}

#[test]
fn an_api_outage_launches_nothing_and_the_next_tick_recovers() {
    let name = unique("k8s-outage");
    let _clean = Cleanup(name.clone());
    let selector = format!("codalab.org/manager={name}");
    fault("unschedulable", true, &selector);
    let cl = Cl::new("k8s-outage");
    let tag = unique("clw-k8s-outage");
    let uuid = stage(&cl, &tag, "echo outage");
    let prefix = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut m = start_manager(dir.path(), prefix.path(), &tag, &name, &[], &[]);
    wait_until(Duration::from_secs(30), "1 pod", || pods(&name).len() == 1);
    bash(&["tests/peers/k8s.sh", "stop"], k8s());
    let launched = m.launches();
    // Ticks go on without the API (each lists and fails); none of them launches.
    wait_ticks(&m, 6);
    assert!(m.child.try_wait().unwrap().is_none(), "{}", m.log_text());
    assert_eq!(m.launches(), launched, "{}", m.log_text());
    assert!(
        m.log_text().contains("listing jobs failed"),
        "{}",
        m.log_text()
    );
    // The stand-in comes back empty (its store is in memory): the pod is gone, so the manager
    // counts a lost launch and, after its back-off, launches again.
    bash(&["tests/peers/k8s.sh", "start"], k8s());
    ensure_secret();
    fault("unschedulable", true, &selector);
    wait_until(Duration::from_secs(40), "a new pod", || {
        pods(&name).len() == 1
    });
    assert!(m.child.try_wait().unwrap().is_none(), "{}", m.log_text());
    assert_eq!(m.launches(), launched + 1, "{}", m.log_text());
    drop(m);
    cl.run(&["rm", "--force", &uuid]);
}

#[test]
fn a_gpu_shape_gets_gpus_and_the_toleration_and_the_nfs_claim_is_the_work_dir() {
    let name = unique("k8s-gpu");
    let _clean = Cleanup(name.clone());
    let claim = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "nfs-claim", "namespace": NS},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    });
    let (code, body) = api(
        "POST",
        &format!("/api/v1/namespaces/{NS}/persistentvolumeclaims"),
        Some(&claim),
    );
    assert!(code == 201 || code == 409, "{body}");
    let cl = Cl::new("k8s-gpu");
    let tag = unique("clw-k8s-gpu");
    let uuid = stage(&cl, &tag, "echo gpu");
    let prefix = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The worker pod runs bundles in the node's Docker engine, which resolves bind mounts on the
    // node: as the documented deployment does (the nodes mount the NFS export at the work dir's
    // path, `--worker-work-dir-prefix` set to it), the node sees the claim at the pod's path. Here
    // the stand-in's claim directory stands for the export, and a link on the node for its mount.
    let claim_dir = std::path::Path::new(&k8s()["CLW_K8S_PVC_DIR"])
        .join(NS)
        .join("nfs-claim");
    std::fs::create_dir_all(&claim_dir).unwrap();
    std::os::unix::fs::symlink(&claim_dir, prefix.path().join("codalab-worker-scratch")).unwrap();
    let m = start_manager(
        dir.path(),
        prefix.path(),
        &tag,
        &name,
        &[],
        &["--gpus", "1", "--cpus", "1", "--nfs-volume-name", "nfs"],
    );
    wait_until(Duration::from_secs(30), "1 pod", || pods(&name).len() == 1);
    let p = &pods(&name)[0];
    let c = &p["spec"]["containers"][0];
    assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], "1", "{p}");
    assert_eq!(c["resources"]["requests"]["nvidia.com/gpu"], "1", "{p}");
    assert!(
        p["spec"]["tolerations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["key"] == "nvidia.com/gpu" && t["effect"] == "NoSchedule"),
        "{p}"
    );
    let vol = p["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "nfs")
        .unwrap();
    assert_eq!(vol["persistentVolumeClaim"]["claimName"], "nfs-claim");
    validate_created(&pod_names(&name));
    // Scheduled on the node with GPUs; the worker writes its work dir into the claim.
    wait_until(Duration::from_secs(60), "Running on node-a", || {
        let p = &pods(&name);
        p.len() == 1 && p[0]["status"]["phase"] == "Running" && p[0]["spec"]["nodeName"] == "node-a"
    });
    wait_until(
        Duration::from_secs(60),
        "the worker's files in the claim",
        || std::fs::read_dir(&claim_dir).is_ok_and(|mut d| d.next().is_some()),
    );
    // The worker runs the bundle to its end (the server refuses to remove a run in progress).
    let b = wait_for(&peer().client(), &uuid, T, is_final);
    assert_final_state(&b, "ready", &m.log_text());
    drop(m);
    cl.run(&["rm", "--force", &uuid]);
}

#[test]
fn one_list_call_per_tick_with_twenty_pods() {
    let name = unique("k8s-calls");
    let _clean = Cleanup(name.clone());
    // Twenty pods of this manager, created before it starts: it adopts them.
    for i in 0..20 {
        sleeping_pod(&name, &format!("{:016x}", 0xc0ffee00u64 + i));
    }
    let proxy = CountingProxy::start(&url());
    let tag = unique("clw-k8s-calls");
    let prefix = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let m = start_manager_at(
        dir.path(),
        prefix.path(),
        &tag,
        &name,
        &proxy.addr,
        &[
            "--min-workers",
            "20",
            "--max-workers",
            "20",
            "--sleep-time",
            "1",
        ],
        &[],
    );
    let ticks = || metric(&m.get("/metrics"), "cl_worker_manager_ticks_total");
    wait_until(Duration::from_secs(30), "2 ticks", || ticks() >= 2);
    proxy.take();
    let t0 = ticks();
    std::thread::sleep(Duration::from_secs(10));
    let calls = proxy.take();
    let t1 = ticks();
    let n = t1 - t0;
    assert!(n >= 5, "{n} ticks in 10 s");
    let lists = calls
        .iter()
        .filter(|(m, p)| m == "GET" && p.contains("/pods?"))
        .count() as u64;
    let others: Vec<_> = calls
        .iter()
        .filter(|(m, p)| !(m == "GET" && p.contains("/pods?")))
        .collect();
    eprintln!(
        "calls per tick with 20 pods: {lists} pod lists in {n} ticks, other calls {others:?}"
    );
    assert!(
        lists.abs_diff(n) <= 1,
        "{lists} lists in {n} ticks: {calls:?}"
    );
    assert!(others.is_empty(), "{others:?}");
    assert_eq!(m.launches(), 0, "{}", m.log_text());
    assert_eq!(pod_names(&name).len(), 20);
}

/// CodaLab's documented Kubernetes command (docs/Worker-Managers.md), as written: `--cert-path`,
/// `--auth-token` and `--cluster-host` (the stand-in's: no certificate, `/dev/null`, and a token
/// it ignores), `--min-workers 0 --max-workers 8 --worker-pass-down-termination
/// --worker-exit-on-exception --worker-exit-after-num-runs 1`, `--cpus/--gpus/--memory-mb` of
/// the VM, the `default` namespace, no tag; changed only in the endpoints, the times a test
/// cannot wait for and the registry's image tag (`CODALAB_VERSION`). As written it is refused,
/// naming the one flag our security model adds (`--password-secret`: the credentials never go
/// into the pods' plain environment); with it, a CPU bundle and a GPU bundle (the node's
/// `nvidia.com/gpu`, the worker's NVIDIA_VISIBLE_DEVICES, found through the Docker engine)
/// reach `ready`, each on a worker pod of its own; the token on argv is warned about, naming
/// the flag to use instead.
#[test]
fn the_documented_command_takes_a_cpu_and_a_gpu_bundle_to_ready() {
    testkit::images::gpu_host_worker_image();
    let user = testkit::peers::add_user("clwdock8s");
    // The pods of the default manager name in the default namespace go when the test ends.
    struct Pods;
    impl Drop for Pods {
        fn drop(&mut self) {
            let (_, list) = api(
                "GET",
                "/api/v1/namespaces/default/pods?labelSelector=codalab.org/manager%3Dcl-worker-manager",
                None,
            );
            for p in list["items"].as_array().into_iter().flatten() {
                let name = p["metadata"]["name"].as_str().unwrap_or_default();
                api(
                    "DELETE",
                    &format!("/api/v1/namespaces/default/pods/{name}"),
                    None,
                );
            }
        }
    }
    let _pods = Pods;
    let secret_name = format!("{}-credentials", user.name);
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": secret_name, "namespace": "default"},
        "type": "Opaque",
        "stringData": {"username": user.name, "password": user.password},
    });
    let (code, body) = api("POST", "/api/v1/namespaces/default/secrets", Some(&secret));
    assert!(code == 201 || code == 409, "{code} {body}");

    let cl = Cl::as_user("k8s-doc", &user);
    let (cpu, gpu) = testkit::manager::stage_cpu_and_gpu(&cl);
    let p = peer();
    let mut args = testkit::manager::documented_globals(&p.server_url());
    args.extend(
        [
            "kubernetes",
            "--cert-path",
            "/dev/null",
            "--auth-token",
            "documented-token",
            "--cluster-host",
            &url(),
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
        "kubernetes: the workers need credentials: pass --password-secret NAME",
    );
    args.extend(["--password-secret".to_string(), secret_name]);
    let m = ManagerProc::spawn(dir.path(), &args, &env);
    testkit::manager::assert_cpu_and_gpu_ready(&cl, &m, &cpu, &gpu);
    assert!(
        m.log_text().contains(
            "--auth-token: a token on the command line is visible to every user of this \
             machine (ps); prefer --auth-token-file"
        ),
        "{}",
        m.log_text()
    );
    assert_eq!(m.launches(), 2, "one worker a run: {}", m.log_text());
}
