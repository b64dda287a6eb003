//! End to end: `cl-worker --bundle-runtime kubernetes` with the real CodaLab server and the
//! Kubernetes stand-in (tests/peers/k8s.sh: kube-fake-client's API, and a node agent that runs
//! bound pods in the machine's Docker engine). The worker runs on the machine as if it were on
//! node `node-a` (`CODALAB_KUBERNETES_NODE_NAME`), so its work dir is a host path of the node;
//! each run is a pod `codalab-run-<uuid>` there. Every run pod created is checked with PyPI
//! kubernetes-validate in strict mode.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::k8s::*;
use testkit::{cl::*, peers::*, worker::*};

const NODE: &str = "node-a";

/// A worker with the Kubernetes runtime on `NODE`.
fn start_worker(name: &str) -> WorkerProc {
    let id = unique(&format!("clw-{name}"));
    start_worker_as(&id, tempfile::tempdir().unwrap())
}

fn start_worker_as(id: &str, work_dir: tempfile::TempDir) -> WorkerProc {
    let url = url();
    WorkerProc::start_env(
        id,
        id,
        work_dir,
        &[
            "--bundle-runtime",
            "kubernetes",
            "--kubernetes-cluster-host",
            &url,
            "--kubernetes-namespace",
            NS,
            // The stand-in serves the kubelet's Summary API, not metrics-server.
            "--kubernetes-kubelet-stats",
        ],
        &[("CODALAB_KUBERNETES_NODE_NAME", NODE.to_string())],
    )
}

fn run_pod(uuid: &str) -> (u16, Value) {
    api(
        "GET",
        &format!("/api/v1/namespaces/{NS}/pods/codalab-run-{uuid}"),
        None,
    )
}

fn wait_state(uuid: &str, w: &WorkerProc, want: &str) -> protocol::Bundle {
    let b = wait_for(&peer().client(), uuid, T, |s| s == want || is_final(s));
    assert_eq!(b.state(), Some(want), "{b:?}\n{}", w.log_text());
    b
}

#[test]
fn a_run_is_a_pod_on_the_workers_node_with_its_mounts_and_resources() {
    let cl = Cl::new("k8srt-hello");
    let w = start_worker("k8srt-hello");
    let dir = tempfile::tempdir().unwrap();
    let dep = cl.upload_text(dir.path(), "dep.txt", "dependency contents\n");
    let uuid = cl.run_bundle(
        &w.tag,
        &[
            "--request-cpus",
            "2",
            "--request-memory",
            "300m",
            &format!("d:{dep}"),
        ],
        "echo hello; cat d; (echo x > d 2>/dev/null && echo writable) || echo read-only; \
         echo $HOME $CODALAB; pwd; sleep 10",
    );
    // (The server hears of `running` at the next regular checkin: watch the pod itself.)
    let t0 = Instant::now();
    let p = loop {
        let (code, p) = run_pod(&uuid);
        if code == 200 && p["status"]["phase"] == "Running" {
            break p;
        }
        assert!(t0.elapsed() < T, "no running pod: {p}\n{}", w.log_text());
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(p["spec"]["nodeName"], NODE, "{p}");
    let c = &p["spec"]["containers"][0];
    let want = json!({"cpu": "2", "memory": (300u64 << 20).to_string()});
    assert_eq!(c["resources"]["requests"], want, "{p}");
    assert_eq!(c["resources"]["limits"], want, "{p}");
    let mounts = c["volumeMounts"].as_array().unwrap();
    assert!(
        mounts.iter().any(|m| m["mountPath"] == format!("/{uuid}")
            && m["subPath"]
                == format!("runs/{}", codalab_worker::agent::run_dir_name(&uuid, &w.id))),
        "{p}"
    );
    assert!(
        mounts.iter().any(|m| m["readOnly"] == true
            && m["subPath"].as_str().unwrap().starts_with("dependencies/")),
        "{p}"
    );
    let work = w.work_dir.path().join("wd").canonicalize().unwrap();
    assert_eq!(
        p["spec"]["volumes"][0]["hostPath"]["path"],
        work.display().to_string(),
        "{p}"
    );
    let b = wait_for(&peer().client(), &uuid, T, is_final);
    assert_final_state(&b, "ready", &w.log_text());
    // Stats came from the node (the stand-in serves the kubelet's Summary API): the memory
    // in use against the run's limit, and CPU time. (The run lasts 10 s: the stand-in reads
    // `docker stats` for each Summary, which on a loaded machine takes seconds; a run of 4 s
    // once ended, in a loaded rehearsal, with no sample reported.)
    let num = |k: &str| b.metadata(k).and_then(Value::as_f64).unwrap_or(0.0);
    assert!(
        num("memory_usage") > 0.0 && num("time_user") > 0.0,
        "memory_usage {}, time_user {}: {b:?}\n{}",
        num("memory_usage"),
        num("time_user"),
        w.log_text()
    );
    assert_eq!(
        cl.stdout(&uuid),
        format!("hello\ndependency contents\nread-only\n/{uuid} true\n/{uuid}\n")
    );
    // The pod is gone once the run is.
    let t0 = Instant::now();
    while run_pod(&uuid).0 != 404 {
        assert!(t0.elapsed() < T, "run pod still there\n{}", w.log_text());
        std::thread::sleep(Duration::from_millis(500));
    }
    validate_created(&[format!("codalab-run-{uuid}")]);
}

#[test]
fn exit_codes_kills_and_limits_end_runs_with_codalabs_messages() {
    let cl = Cl::new("k8srt-limits");
    let w = start_worker("k8srt-limits");
    let client = peer().client();
    let exit3 = cl.run_bundle(&w.tag, &[], "echo before; exit 3");
    let killed = cl.run_bundle(&w.tag, &[], "sleep 300");
    let timed = cl.run_bundle(&w.tag, &["--request-time", "3s"], "sleep 60");
    let oom = cl.run_bundle(
        &w.tag,
        &["--request-memory", "64m"],
        "x=$(head -c 300000000 /dev/zero | tr '\\0' a); echo ${#x}",
    );

    let b = wait_for(&client, &exit3, T, is_final);
    assert_final_state(&b, "failed", &w.log_text());
    assert_eq!(b.metadata("exitcode"), Some(&json!(3)), "{b:?}");
    assert_eq!(cl.stdout(&exit3), "before\n");

    wait_state(&killed, &w, "running");
    assert_eq!(run_pod(&killed).0, 200);
    cl.run(&["kill", &killed]);
    let b = wait_for(&client, &killed, T, is_final);
    assert_final_state_or_server_race(&b, "killed", &w.log_text());
    assert_eq!(meta_str(&b, "failure_message"), "Kill requested");
    assert_eq!(run_pod(&killed).0, 404, "the killed run's pod is deleted");

    let b = wait_for(&client, &timed, T, is_final);
    assert_final_state_or_server_race(&b, "failed", &w.log_text());
    let fm = meta_str(&b, "failure_message");
    assert!(
        fm.starts_with("Time limit exceeded. (Container uptime "),
        "{fm}"
    );

    let b = wait_for(&client, &oom, T, is_final);
    assert_final_state_or_server_race(&b, "failed", &w.log_text());
    assert_eq!(
        meta_str(&b, "failure_message"),
        "Memory limit 64m exceeded."
    );
}

/// A pod holding one of the node's GPUs, as the worker pod itself would.
struct Holder(String);

impl Holder {
    fn new(gpus: u32) -> Self {
        let name = unique("gpu-holder");
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"kubernetes.io/hostname": NODE},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{"name": "c", "image": "codalab/default-cpu:latest",
                    "command": ["sleep", "600"],
                    "resources": {"limits": {"nvidia.com/gpu": gpus.to_string(), "cpu": "100m", "memory": "50Mi"}}}]
            }
        });
        let (code, body) = api("POST", &format!("/api/v1/namespaces/{NS}/pods"), Some(&pod));
        assert_eq!(code, 201, "{body}");
        let t0 = Instant::now();
        loop {
            let (_, p) = api("GET", &format!("/api/v1/namespaces/{NS}/pods/{name}"), None);
            if p["status"]["phase"] == "Running" {
                break;
            }
            assert!(t0.elapsed() < T, "holder pod not running: {p}");
            std::thread::sleep(Duration::from_millis(300));
        }
        Holder(name)
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        api(
            "DELETE",
            &format!("/api/v1/namespaces/{NS}/pods/{}", self.0),
            None,
        );
    }
}

#[test]
fn runs_take_turns_on_the_gpu_the_worker_pod_leaves_free() {
    let _holder = Holder::new(1);
    let cl = Cl::new("k8srt-gpu");
    let w = start_worker("k8srt-gpu");
    let cmd = "echo $NVIDIA_VISIBLE_DEVICES; cut -d' ' -f1 /proc/uptime; sleep 3; \
               cut -d' ' -f1 /proc/uptime";
    let a = cl.run_bundle(&w.tag, &["--request-gpus", "1"], cmd);
    let b = cl.run_bundle(&w.tag, &["--request-gpus", "1"], cmd);
    // The node agent gives each run pod the node's other GPU (index 1), one run at a time.
    assert_took_turns(&cl, &[&a, &b], "1", "a node with one GPU free", || {
        w.log_text()
    });
    // The worker reported the one free GPU, not the node's two.
    assert!(w.log_text().contains(", 1 GPUs,"), "{}", w.log_text());
}

#[test]
fn a_worker_killed_mid_run_resumes_its_pod_after_restart() {
    let cl = Cl::new("k8srt-resume");
    let id = unique("clw-k8srt-resume");
    let mut w = start_worker_as(&id, tempfile::tempdir().unwrap());
    // Long enough to outlast a loaded machine's check-in lag; the pod itself says when the run
    // runs (the server hears of `running` only at the next regular checkin: a short run could
    // be over before the server showed it running, as seen once under a loaded suite).
    let uuid = cl.run_bundle(
        &w.tag,
        &[],
        "for i in $(seq 1 20); do echo $i; sleep 1; done",
    );
    let t0 = Instant::now();
    while !(run_pod(&uuid).0 == 200 && run_pod(&uuid).1["status"]["phase"] == "Running") {
        assert!(t0.elapsed() < T, "no running pod\n{}", w.log_text());
        std::thread::sleep(Duration::from_millis(300));
    }
    std::thread::sleep(Duration::from_secs(2));
    w.signal("KILL");
    w.wait_exit(Duration::from_secs(10)).expect("worker exits");
    assert_eq!(run_pod(&uuid).0, 200, "the run pod outlives the worker");
    let w = start_worker_as(&id, w.into_work_dir());
    let b = wait_for(&peer().client(), &uuid, T, is_final);
    assert_final_state(&b, "ready", &w.log_text());
    let want: String = (1..=20).map(|i| format!("{i}\n")).collect();
    assert_eq!(cl.stdout(&uuid), want);
}

#[test]
fn running_bundles_can_be_read_and_reached_with_netcat() {
    let cl = Cl::new("k8srt-read");
    let w = start_worker("k8srt-read");
    // The stand-in's pods share the machine's network: a port of this test's own.
    let port = 20000 + (std::process::id() % 10000);
    let uuid = cl.run_bundle(
        &w.tag,
        &[],
        &format!(
            "echo partial > out.txt; busybox nc -ll -p {port} -e sh -c 'x=$(head -c 5); echo got:$x' & \
             sleep 600"
        ),
    );
    wait_state(&uuid, &w, "running");
    let t0 = Instant::now();
    loop {
        let o = cl
            .command(&["cat", &format!("{uuid}/out.txt")])
            .output()
            .unwrap();
        if o.status.success() && o.stdout == b"partial\n" {
            break;
        }
        assert!(
            t0.elapsed() < T,
            "cl cat of a running bundle\n{}",
            w.log_text()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let t0 = Instant::now();
    loop {
        let o = cl
            .command(&["netcat", &uuid, &port.to_string(), "hello"])
            .output()
            .unwrap();
        if o.status.success() && o.stdout == b"got:hello\n" {
            break;
        }
        assert!(t0.elapsed() < T, "cl netcat\n{}", w.log_text());
        std::thread::sleep(Duration::from_millis(500));
    }
    cl.run(&["kill", &uuid]);
    let b = wait_for(&peer().client(), &uuid, T, is_final);
    assert_final_state_or_server_race(&b, "killed", &w.log_text());
}

#[test]
fn a_run_waiting_for_the_scheduler_says_why_and_then_runs() {
    let cl = Cl::new("k8srt-sched");
    let w = start_worker("k8srt-sched");
    let selector = format!("codalab.org/worker-id={}", w.id);
    fault("unschedulable", true, &selector);
    let uuid = cl.run_bundle(&w.tag, &[], "echo scheduled at last");
    let client = peer().client();
    let t0 = Instant::now();
    loop {
        let b = wait_for(&client, &uuid, T, |_| true);
        let status = meta_str(&b, "run_status");
        if status.starts_with("Waiting for the cluster to schedule the run on this node: ") {
            break;
        }
        assert!(
            t0.elapsed() < T,
            "run_status {status:?}: {b:?}\n{}",
            w.log_text()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    fault("unschedulable", false, &selector);
    let b = wait_for(&client, &uuid, T, is_final);
    assert_final_state(&b, "ready", &w.log_text());
    assert_eq!(cl.stdout(&uuid), "scheduled at last\n");
}
