//! Reclaimed capacity on Kubernetes: the worker pod of a running bundle deleted with a grace
//! period (a spot node's shutdown), and a node cut off from the control plane; each ends with
//! the bundle `ready` on another pod (testkit::reclaim).

use super::*;

/// A manager named after `what` (with `extra` flags of its backend) whose one worker pod runs
/// a reclaim test's bundle.
struct Running {
    name: String,
    cl: Cl,
    uuid: String,
    m: ManagerProc,
    _clean: Cleanup,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

fn running(what: &str, extra: &[&str]) -> Running {
    let name = unique(what);
    let clean = Cleanup(name.clone());
    let cl = Cl::new(what);
    let tag = unique(&format!("clw-{what}"));
    let uuid = stage(&cl, &tag, testkit::reclaim::BUNDLE);
    let prefix = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let m = start_manager(
        dir.path(),
        prefix.path(),
        &tag,
        &name,
        &["--max-workers", "1"],
        extra,
    );
    wait_for(&peer().client(), &uuid, T, |s| s == "running");
    Running {
        name,
        cl,
        uuid,
        m,
        _clean: clean,
        _dirs: (prefix, dir),
    }
}

/// A spot node's shutdown as Kubernetes shows it: the worker pod is deleted with a grace
/// period (15 s, as GKE gives the pods of a preempted Spot VM; the stand-in's node agent sends
/// SIGTERM, SIGKILL after the grace). The worker
/// hands its run back in that time (the backend passes `--pass-down-termination`), and a
/// worker of a new pod runs the bundle again to `ready`.
#[test]
fn a_worker_pod_deleted_with_a_grace_period_hands_its_run_back_and_a_new_pod_finishes_it() {
    let r = running("k8s-reclaim", &[]);
    let (cl, uuid, m) = (&r.cl, &r.uuid, &r.m);
    let first = pod_names(&r.name);
    assert_eq!(first.len(), 1, "{first:?}");
    let t0 = Instant::now();
    let (code, body) = api(
        "DELETE",
        &format!(
            "/api/v1/namespaces/{NS}/pods/{}?gracePeriodSeconds=15",
            first[0]
        ),
        None,
    );
    assert_eq!(code, 200, "{body}");
    testkit::reclaim::assert_handed_back_then_ready(
        cl,
        uuid,
        t0,
        Duration::from_secs(15),
        "Kubernetes pod deleted (grace 15 s)",
        || m.log_text(),
    );
    assert_eq!(m.launches(), 2, "{}", m.log_text());
    testkit::reclaim::assert_one_interrupted(m);
}

/// Restores a node when dropped.
struct Unreachable(String);

impl Unreachable {
    fn now(node: &str) -> Self {
        let out = Command::new("bash")
            .args(["tests/peers/k8s.sh", "unreachable-node", node])
            .current_dir(repo_root())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        Unreachable(node.to_string())
    }
}

impl Drop for Unreachable {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .args(["tests/peers/k8s.sh", "restore-node", &self.0])
            .current_dir(repo_root())
            .output();
    }
}

/// A node cut off from the control plane: Kubernetes marks its pods not Ready and can never
/// confirm their deletion, so a pod there would hold its place under --max-workers for good.
/// Past --node-lost-timeout the manager deletes the worker pod by force and counts it ended
/// (NodeLost); the worker, stopped once its pod is gone, hands its run back, and a pod on
/// another node runs the bundle again to `ready`.
#[test]
fn a_worker_pod_on_a_node_gone_not_ready_is_deleted_by_force_after_the_deadline() {
    let r = running("k8s-notready", &["--node-lost-timeout", "5"]);
    let (cl, uuid, m) = (&r.cl, &r.uuid, &r.m);
    let first = pods(&r.name);
    assert_eq!(first.len(), 1);
    let node = first[0]["spec"]["nodeName"].as_str().unwrap().to_string();
    let t0 = Instant::now();
    let _down = Unreachable::now(&node);
    testkit::reclaim::assert_handed_back_then_ready(
        cl,
        uuid,
        t0,
        Duration::from_secs(25),
        "Kubernetes node NotReady (--node-lost-timeout 5)",
        || m.log_text(),
    );
    let log = m.log_text();
    assert!(log.contains("deleting it by force"), "{log}");
    assert_eq!(m.launches(), 2, "{log}");
    let metrics = m.get("/metrics");
    assert!(metrics.contains("reason=\"NodeLost\""), "{metrics}");
    testkit::reclaim::assert_one_interrupted(m);
}
