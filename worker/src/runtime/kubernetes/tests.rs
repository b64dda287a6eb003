//! The run pod, the reading of run pods and the node's capacity, without a cluster.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{json, Value};

use super::pod::*;
use super::{stats_source, StatsSource};
use crate::runtime::{Mount, RunSpec};
use common::Resources;

fn spec() -> RunSpec {
    RunSpec {
        uuid: "0xabc".into(),
        command: "cat d/x".into(),
        image: "img:latest".into(),
        bundle_path: "/work/runs/0xabc".into(),
        mounts: vec![
            Mount {
                host: "/work/dependencies/0xdef".into(),
                container: "/0xabc_dependencies/d".into(),
                read_only: true,
            },
            Mount {
                host: "/shared/bundles/0x123".into(),
                container: "/0xabc/e".into(),
                read_only: true,
            },
        ],
        user: "1000:1001".into(),
        memory_bytes: 2 << 30,
        cpuset: vec![0, 1],
        gpu_uuids: vec!["kubernetes-gpu-0".into()],
        shm_size_bytes: 1 << 30,
        network: false,
        worker_id: "w 1".into(),
        pids_limit: 0,
        no_capabilities: false,
    }
}

fn placement() -> Placement {
    Placement {
        namespace: "codalab".into(),
        node: "node-a".into(),
        tolerations: vec![],
        worker_id: "host/worker (12)".into(),
    }
}

fn json_of(p: &Pod) -> Value {
    serde_json::to_value(p).unwrap()
}

#[test]
fn a_run_as_an_unprivileged_user_has_no_capabilities_and_is_not_root() {
    let work = WorkVolume::host("/work".as_ref()).unwrap();
    let mut sp = spec();
    sp.user = "65534:65534".into();
    sp.no_capabilities = true;
    let p = json_of(&run_pod(&sp, &work, &placement()).unwrap());
    let s = &p["spec"];
    assert_eq!(s["securityContext"]["runAsUser"], 65534);
    assert_eq!(s["securityContext"]["runAsGroup"], 65534);
    let c = &s["containers"][0]["securityContext"];
    assert_eq!(c["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(c["runAsNonRoot"], true);
    assert_eq!(c["allowPrivilegeEscalation"], false);
    // By default: the bundle dir's owner, and only the usual capabilities dropped.
    let p = json_of(&run_pod(&spec(), &work, &placement()).unwrap());
    let c = &p["spec"]["containers"][0]["securityContext"];
    assert!(c.get("runAsNonRoot").is_none());
    assert!(c["capabilities"]["drop"]
        .as_array()
        .unwrap()
        .contains(&json!("NET_RAW")));
}

#[test]
fn run_pod_has_codalabs_contract_on_the_workers_node() {
    let work = WorkVolume::host("/work".as_ref()).unwrap();
    let p = json_of(&run_pod(&spec(), &work, &placement()).unwrap());
    assert_eq!(p["metadata"]["name"], "codalab-run-0xabc");
    assert_eq!(p["metadata"]["namespace"], "codalab");
    let labels = &p["metadata"]["labels"];
    assert_eq!(labels["codalab.org/bundle-uuid"], "0xabc");
    assert_eq!(labels["codalab.org/network"], "false");
    assert_eq!(labels["app.kubernetes.io/managed-by"], "cl-worker");
    assert_eq!(
        p["metadata"]["annotations"]["codalab.org/worker-id"],
        "host/worker (12)"
    );
    let s = &p["spec"];
    assert_eq!(s["restartPolicy"], "Never");
    assert_eq!(s["automountServiceAccountToken"], false);
    assert_eq!(
        s["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchFields"],
        json!([{"key": "metadata.name", "operator": "In", "values": ["node-a"]}])
    );
    assert_eq!(s["securityContext"]["runAsUser"], 1000);
    assert_eq!(s["securityContext"]["runAsGroup"], 1001);
    // A GPU run tolerates the GPU taint.
    assert_eq!(s["tolerations"][0]["key"], "nvidia.com/gpu");
    let c = &s["containers"][0];
    // Hardened as Docker runs are.
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(
        c["securityContext"]["capabilities"]["drop"],
        json!(crate::runtime::DROPPED_CAPABILITIES)
    );
    assert_eq!(
        c["command"],
        json!(["/bin/bash", "-c", "( cat d/x; ) >stdout 2>stderr"])
    );
    assert_eq!(c["workingDir"], "/0xabc");
    assert_eq!(c["imagePullPolicy"], "IfNotPresent");
    assert!(c["env"]
        .as_array()
        .unwrap()
        .contains(&json!({"name": "HOME", "value": "/0xabc"})));
    assert!(c["env"]
        .as_array()
        .unwrap()
        .contains(&json!({"name": "CODALAB", "value": "true"})));
    // The GPU run's devices come from the device plugin; a run without GPUs gets none even
    // where the image asks for all.
    let void = json!({"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"});
    assert!(!c["env"].as_array().unwrap().contains(&void));
    let no_gpu = RunSpec {
        gpu_uuids: vec![],
        ..spec()
    };
    let p = json_of(&run_pod(&no_gpu, &work, &placement()).unwrap());
    assert!(p["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .contains(&void));
    // A resumed run's limit is read back from its pod.
    assert_eq!(
        memory_limit(&run_pod(&spec(), &work, &placement()).unwrap()),
        2 << 30
    );
    let want = json!({"cpu": "2", "memory": (2u64 << 30).to_string(), "nvidia.com/gpu": "1"});
    assert_eq!(c["resources"]["requests"], want);
    assert_eq!(c["resources"]["limits"], want);
    let mounts = c["volumeMounts"].as_array().unwrap();
    assert!(
        mounts.contains(&json!({"name": "work", "mountPath": "/0xabc", "subPath": "runs/0xabc"}))
    );
    assert!(mounts.contains(
        &json!({"name": "work", "mountPath": "/0xabc_dependencies/d",
        "subPath": "dependencies/0xdef", "readOnly": true})
    ));
    // Outside the work volume (shared file system): the node's path itself, read-only.
    assert!(mounts.contains(&json!({"name": "dep-1", "mountPath": "/0xabc/e", "readOnly": true})));
    let vols = s["volumes"].as_array().unwrap();
    assert!(
        vols.contains(&json!({"name": "work", "hostPath": {"path": "/work", "type": "Directory"}}))
    );
    assert!(vols.contains(&json!({"name": "dep-1", "hostPath": {"path": "/shared/bundles/0x123"}})));
    assert!(vols
        .iter()
        .any(|v| v["name"] == "shm" && v["emptyDir"]["medium"] == "Memory"));
}

#[test]
fn run_pods_hold_no_credentials_of_the_cluster() {
    // A run is untrusted code: its pod gets no service account token (the namespace's
    // `default` account, which nothing binds a role to, and no automounted token), no volume
    // that could carry one, no Service environment variables, and the host's namespaces stay
    // closed.
    for network in [false, true] {
        let work = WorkVolume::host("/work".as_ref()).unwrap();
        let p = json_of(&run_pod(&RunSpec { network, ..spec() }, &work, &placement()).unwrap());
        let s = &p["spec"];
        assert_eq!(s["automountServiceAccountToken"], false, "{s}");
        assert!(
            s.get("serviceAccountName").is_none() && s.get("serviceAccount").is_none(),
            "run pods use the namespace's default account: {s}"
        );
        assert_eq!(s["enableServiceLinks"], false, "{s}");
        for v in s["volumes"].as_array().unwrap() {
            for key in [
                "secret",
                "projected",
                "serviceAccountToken",
                "configMap",
                "csi",
            ] {
                assert!(v.get(key).is_none(), "run pod volume {v}");
            }
        }
        for key in ["hostNetwork", "hostPID", "hostIPC"] {
            assert!(s.get(key).is_none(), "{key}: {s}");
        }
        let c = &s["containers"][0];
        assert!(c["securityContext"].get("privileged").is_none(), "{c}");
        assert!(c.get("envFrom").is_none(), "{c}");
        // The label the NetworkPolicies select on: egress only for runs that asked for it.
        assert_eq!(
            p["metadata"]["labels"][LABEL_NETWORK],
            network.to_string(),
            "{p}"
        );
        assert_eq!(p["metadata"]["labels"][LABEL_MANAGED_BY], MANAGED_BY);
    }
}

#[test]
fn work_volume_of_the_workers_pod() {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "w"},
        "spec": {
            "containers": [{"name": "c", "volumeMounts": [
                {"name": "nfs", "mountPath": "/mnt/nfs", "subPath": "team"},
                {"name": "creds", "mountPath": "/etc/codalab/credentials"}]}],
            "volumes": [
                {"name": "nfs", "persistentVolumeClaim": {"claimName": "nfs-claim"}},
                {"name": "creds", "secret": {"secretName": "s"}}]
        }
    }))
    .unwrap();
    let w = WorkVolume::of_pod(&pod, "/mnt/nfs/codalab-worker-scratch".as_ref()).unwrap();
    assert_eq!(w.source, WorkSource::Claim("nfs-claim".into()));
    assert_eq!(
        w.sub_path_of("/mnt/nfs/codalab-worker-scratch/runs/0x1".as_ref())
            .unwrap()
            .as_deref(),
        Some("team/codalab-worker-scratch/runs/0x1")
    );
    assert_eq!(w.sub_path_of("/elsewhere/x".as_ref()), Ok(None));
    // Inside the volume but not carried exactly: refused, never approximated.
    let twin = std::ffi::OsStr::from_bytes(b"/mnt/nfs/codalab-worker-scratch/runs/x\xff");
    assert!(w.sub_path_of(Path::new(twin)).is_err());
    assert!(WorkVolume::of_pod(&pod, "/tmp/w".as_ref()).is_none());
    let p = json_of(
        &run_pod(
            &RunSpec {
                bundle_path: "/mnt/nfs/codalab-worker-scratch/runs/0xabc".into(),
                mounts: vec![],
                ..spec()
            },
            &w,
            &placement(),
        )
        .unwrap(),
    );
    assert_eq!(
        p["spec"]["volumes"][0],
        json!({"name": "work", "persistentVolumeClaim": {"claimName": "nfs-claim"}})
    );
    // A bundle dir outside the volume is refused rather than mounted from the wrong place.
    assert!(run_pod(&spec(), &w, &placement()).is_err());
}

fn pod(status: Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": "codalab-run-0x1"}, "status": status}))
        .unwrap()
}

#[test]
fn run_status_from_the_pod() {
    let st = run_status(&pod(json!({"phase": "Succeeded", "containerStatuses": [{
        "name": "run", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 3, "reason": "Error",
            "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:05Z"}}}]})));
    assert!(!st.running);
    assert_eq!(st.exit_code, Some(3));
    assert!(!st.oom_killed);
    assert_eq!(st.finished_at.unwrap() - st.started_at.unwrap(), 5.0);
    let st = run_status(&pod(json!({"phase": "Failed", "containerStatuses": [{
        "name": "run", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]})));
    assert!(st.oom_killed && !st.running);
    let st = run_status(&pod(json!({"phase": "Failed", "reason": "Evicted",
        "message": "The node was low on resource: memory."})));
    assert!(!st.running && st.exit_code.is_none());
    assert_eq!(
        st.failure.as_deref(),
        Some("Kubernetes pod failed: Evicted: The node was low on resource: memory.")
    );
    let st = run_status(&pod(json!({"phase": "Running", "containerStatuses": [{
        "name": "run", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
        "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]})));
    assert!(st.running && st.started_at.is_some());
}

#[test]
fn startup_waits_for_the_scheduler_and_gives_up_on_images() {
    assert_eq!(startup(&pod(json!({"phase": "Running"}))), Startup::Started);
    let waiting = |reason: &str| {
        pod(json!({"phase": "Pending", "containerStatuses": [{
            "name": "run", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": reason, "message": "m"}}}]}))
    };
    assert_eq!(
        startup(&waiting("ContainerCreating")),
        Startup::Waiting(Some("ContainerCreating: m".into()))
    );
    // The first failed pull is retried once by the kubelet before it backs off.
    assert!(matches!(
        startup(&waiting("ErrImagePull")),
        Startup::Waiting(_)
    ));
    assert_eq!(
        startup(&waiting("ImagePullBackOff")),
        Startup::Failed {
            image: true,
            message: "ImagePullBackOff: m".into()
        }
    );
    assert!(matches!(
        startup(&waiting("CreateContainerConfigError")),
        Startup::Failed { image: false, .. }
    ));
    let Startup::Waiting(Some(m)) = startup(&pod(json!({"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/2 nodes are available: 1 Insufficient nvidia.com/gpu."}]})))
    else {
        panic!()
    };
    assert!(m.ends_with("1 Insufficient nvidia.com/gpu."), "{m}");
}

#[test]
fn quantities() {
    assert_eq!(quantity("500m"), Some(0.5));
    assert_eq!(quantity("4"), Some(4.0));
    assert_eq!(quantity("8Gi"), Some(8.0 * 1024f64.powi(3)));
    assert_eq!(quantity("1e3"), Some(1000.0));
    assert_eq!(quantity("250000n"), Some(0.00025));
    assert_eq!(quantity("12Ki"), Some(12288.0));
    assert_eq!(quantity("x"), None);
}

#[test]
fn worker_labels_are_valid_and_distinct() {
    assert_eq!(worker_label("cl-worker-manager-1"), "cl-worker-manager-1");
    let a = worker_label("host/worker (12)");
    let b = worker_label("host/worker (13)");
    assert_ne!(a, b);
    for l in [
        &a,
        &b,
        &worker_label(&"x".repeat(100)),
        &worker_label("///"),
    ] {
        assert!(l.len() <= 63, "{l}");
        assert!(
            l.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
            "{l}"
        );
        assert!(l.starts_with(|c: char| c.is_ascii_alphanumeric()), "{l}");
    }
}

#[test]
fn capacity_is_allocatable_minus_other_pods_including_the_workers_own() {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "node-a"},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "2"}}
    }))
    .unwrap();
    let p = |name: &str, node: &str, labels: Value, phase: &str, req: Value| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": req}]},
            "status": {"phase": phase}
        }))
        .unwrap()
    };
    let pods = vec![
        // The worker pod itself holds a GPU.
        p(
            "worker",
            "node-a",
            json!({}),
            "Running",
            json!({"limits": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}}),
        ),
        // This worker's own run: the server deducts it already.
        p(
            "codalab-run-0x1",
            "node-a",
            json!({"app.kubernetes.io/managed-by": "cl-worker", "codalab.org/worker-id": "w1"}),
            "Running",
            json!({"requests": {"cpu": "2", "nvidia.com/gpu": "1"}}),
        ),
        // Another worker's run counts.
        p(
            "codalab-run-0x2",
            "node-a",
            json!({"app.kubernetes.io/managed-by": "cl-worker", "codalab.org/worker-id": "w2"}),
            "Running",
            json!({"requests": {"cpu": "500m", "memory": "1Gi"}}),
        ),
        // Ended pods and pods of other nodes do not.
        p(
            "done",
            "node-a",
            json!({}),
            "Succeeded",
            json!({"requests": {"cpu": "3"}}),
        ),
        p(
            "far",
            "node-b",
            json!({}),
            "Running",
            json!({"requests": {"cpu": "3"}}),
        ),
    ];
    assert_eq!(capacity(&node, &pods, "w1"), Resources::new(2, 1, 6 << 30));
}

/// A client of the API at `server` (plain HTTP, no credentials).
fn client_of(server: &wiremock::MockServer) -> kube::Client {
    common::install_crypto_provider();
    let config = kube::Config::new(server.uri().parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

async fn paths_asked(server: &wiremock::MockServer) -> Vec<String> {
    server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| r.url.path().to_owned())
        .collect()
}

#[tokio::test]
async fn the_kubelet_is_asked_for_stats_only_with_kubelet_stats() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let not_found = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": "the server could not find the requested resource", "reason": "NotFound",
        "code": 404});
    // No metrics-server; the kubelet's Summary API would answer.
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/apis/metrics.k8s.io/v1beta1"))
        .respond_with(ResponseTemplate::new(404).set_body_json(&not_found))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/api/v1/nodes/node-a/proxy/stats/summary"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"node": {}, "pods": []})))
        .mount(&server)
        .await;
    let client = client_of(&server);

    // By default: no stats rather than nodes/proxy, which is never called.
    assert_eq!(
        stats_source(&client, "node-a", false).await,
        StatsSource::None
    );
    let asked = paths_asked(&server).await;
    assert_eq!(asked, ["/apis/metrics.k8s.io/v1beta1"], "{asked:?}");

    // --kubernetes-kubelet-stats: the Summary API of the worker's node.
    assert_eq!(
        stats_source(&client, "node-a", true).await,
        StatsSource::Summary
    );
    assert!(paths_asked(&server)
        .await
        .contains(&"/api/v1/nodes/node-a/proxy/stats/summary".to_owned()));

    // With metrics-server the metrics API wins either way, and the kubelet is not asked.
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/apis/metrics.k8s.io/v1beta1"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "kind": "APIResourceList", "groupVersion": "metrics.k8s.io/v1beta1", "resources": []})))
        .mount(&server)
        .await;
    let client = client_of(&server);
    for kubelet_stats in [false, true] {
        assert_eq!(
            stats_source(&client, "node-a", kubelet_stats).await,
            StatsSource::Metrics
        );
    }
    let asked = paths_asked(&server).await;
    assert!(!asked.iter().any(|p| p.contains("/proxy/")), "{asked:?}");
}

#[test]
fn nodes_proxy_is_only_in_the_opt_in_table() {
    use super::rbac::{CLUSTER, KUBELET_STATS, NAMESPACED};
    for p in NAMESPACED.iter().chain(CLUSTER) {
        assert!(
            !p.resource.contains("proxy") && !p.resource.contains('/'),
            "{p:?}: the default rules grant no subresource"
        );
        assert!(!p.verbs.contains(&"*") && p.resource != "*", "{p:?}");
    }
    assert_eq!(KUBELET_STATS.len(), 1);
    assert_eq!(
        (
            KUBELET_STATS[0].group,
            KUBELET_STATS[0].resource,
            KUBELET_STATS[0].verbs
        ),
        ("", "nodes/proxy", &["get"][..])
    );
}

/// A runtime of worker `w1` in namespace `codalab` on node `node-a`, on the API at `server`.
fn runtime_on(server: &wiremock::MockServer) -> super::KubernetesRuntime {
    super::KubernetesRuntime {
        inner: std::sync::Arc::new(super::Inner {
            client: client_of(server),
            namespace: "codalab".into(),
            node: "node-a".into(),
            worker_label: worker_label("w1"),
            work: WorkVolume::host("/work".as_ref()).unwrap(),
            tolerations: vec![],
            stats: StatsSource::None,
            summary: tokio::sync::Mutex::new(None),
            cpu: Default::default(),
            limits: Default::default(),
            capacity: Default::default(),
            no_gpus: false,
            listings: super::Listings::new(),
        }),
    }
}

/// The worker's run pods `codalab-run-<i>`, those in `ended` terminated with exit code 0.
fn pod_list(n: usize, ended: &[usize]) -> Value {
    let items: Vec<Value> = (0..n)
        .map(|i| {
            let state = if ended.contains(&i) {
                json!({"terminated": {"exitCode": 0, "reason": "Completed"}})
            } else {
                json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}})
            };
            json!({"metadata": {"name": format!("codalab-run-{i}"), "namespace": "codalab",
                    "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_WORKER_ID: worker_label("w1")}},
                   "status": {"phase": "Running", "containerStatuses": [{"name": "run",
                    "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                    "state": state}]}})
        })
        .collect();
    json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
           "items": items})
}

#[tokio::test]
async fn runs_read_their_pods_from_one_listing_a_second() {
    use crate::runtime::BundleRuntime;
    use std::time::Duration;
    use wiremock::matchers::{method, path, query_param};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let server = MockServer::start().await;
    let list_path = "/api/v1/namespaces/codalab/pods";
    let selector = format!(
        "{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_WORKER_ID}={}",
        worker_label("w1")
    );
    let mount = |ended: &'static [usize]| {
        Mock::given(method("GET"))
            .and(path(list_path))
            .and(query_param("labelSelector", selector.as_str()))
            .respond_with(ResponseTemplate::new(200).set_body_json(pod_list(5, ended)))
    };
    mount(&[]).mount(&server).await;
    let rt = runtime_on(&server);
    let mut waits: Vec<_> = (0..5)
        .map(|i| {
            let rt = rt.clone();
            tokio::spawn(async move { rt.wait(&format!("codalab-run-{i}")).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let asked = paths_asked(&server).await;
    // Five runs waiting for 3.5 s: one listing a second for all of them, no GET of a pod.
    assert!(asked.iter().all(|p| p == list_path), "{asked:?}");
    assert!(
        (3..=5).contains(&asked.len()),
        "{} listings: {asked:?}",
        asked.len()
    );
    assert!(waits.iter().all(|w| !w.is_finished()));

    // Run 2 ends: its wait returns with the next listing, the others go on waiting.
    server.reset().await;
    mount(&[2]).mount(&server).await;
    tokio::time::timeout(Duration::from_secs(3), waits.remove(2))
        .await
        .expect("the wait of the ended run returns within a listing")
        .unwrap();
    assert!(waits.iter().all(|w| !w.is_finished()));
    for w in waits {
        w.abort();
    }
    // Its state is read from the same listing: no request of its own.
    let before = paths_asked(&server).await.len();
    let st = rt.inspect("codalab-run-2").await.unwrap().unwrap();
    assert!(!st.running && st.exit_code == Some(0), "{st:?}");
    assert!(rt.inspect("codalab-run-9").await.unwrap().is_none());
    assert_eq!(paths_asked(&server).await.len(), before);
}

/// A run's monitor stops polling its wait while it reads the run's state and stats: that read
/// must not wait for the listing the wait asked for (a lock held by the unpolled wait would
/// never be released).
#[tokio::test]
async fn a_wait_left_unpolled_holds_up_no_other_reader() {
    use crate::runtime::BundleRuntime;
    use std::time::Duration;
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/v1/namespaces/codalab/pods"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(pod_list(1, &[]))
                .set_delay(Duration::from_millis(300)),
        )
        .mount(&server)
        .await;
    let rt = runtime_on(&server);
    let mut wait = Box::pin(rt.wait("codalab-run-0"));
    // Polled until its listing is asked for, then left alone.
    assert!(tokio::time::timeout(Duration::from_millis(50), &mut wait)
        .await
        .is_err());
    let st = tokio::time::timeout(Duration::from_secs(5), rt.inspect("codalab-run-0"))
        .await
        .expect("the inspection is not held up by the unpolled wait")
        .unwrap()
        .unwrap();
    assert!(st.running);
}

#[test]
fn a_worker_given_no_gpu_offers_none_of_the_nodes() {
    let free = Resources {
        cpus: 4,
        gpus: 2,
        memory_bytes: 8 << 30,
    };
    assert_eq!(super::offered(Some(free), false), Some(free));
    let none = super::offered(Some(free), true).unwrap();
    assert_eq!((none.cpus, none.gpus, none.memory_bytes), (4, 0, 8 << 30));
    assert_eq!(super::offered(None, true), None);
    assert!(super::args::no_gpus("NONE") && super::args::no_gpus(" "));
    assert!(!super::args::no_gpus("ALL") && !super::args::no_gpus("0"));
}
