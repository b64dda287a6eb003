//! The pod builder and the reading of listed pods, without a cluster.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, Pod,
    PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{json, Value};

use super::pod::{self, Deadlines, Seen};
use super::{BundleRuntime, Credentials, KubernetesConfig};
use crate::{JobSpec, JobState, Resources};

const DEADLINES: Deadlines = Deadlines {
    unschedulable: Duration::from_secs(900),
    start_failure: Duration::from_secs(300),
    node_lost: Duration::from_secs(300),
};

fn config() -> KubernetesConfig {
    KubernetesConfig {
        namespace: "codalab".into(),
        manager_name: "gpu-managers".into(),
        image: "codalab/worker:1.7.5".into(),
        image_pull_policy: None,
        bundle_runtime: BundleRuntime::Docker,
        docker_socket: "/var/run/docker.sock".into(),
        work_dir: "/mnt/nfs/codalab-worker-scratch".into(),
        nfs_volume_name: None,
        credentials: Credentials::Secret("codalab-creds".into()),
        service_account: None,
        image_pull_secrets: Vec::new(),
        priority_class: None,
        node_selector: BTreeMap::new(),
        tolerations: Vec::new(),
        one_worker_per_node: false,
        deadlines: DEADLINES,
    }
}

fn spec(gpus: u32) -> JobSpec {
    JobSpec {
        worker_id: "0123456789abcdef".into(),
        shape_name: "gpu".into(),
        resources: Resources::new(4, gpus, 3 << 30),
        command: [
            "cl-worker",
            "--server",
            "http://s",
            "--id",
            "host-0123456789abcdef",
        ]
        .map(String::from)
        .to_vec(),
        env: Vec::new(),
    }
}

fn json_of(cfg: &KubernetesConfig, spec: &JobSpec) -> Value {
    serde_json::to_value(pod::worker_pod(cfg, spec)).unwrap()
}

#[test]
fn pod_has_identity_labels_and_shape_resources() {
    let p = json_of(&config(), &spec(0));
    assert_eq!(p["apiVersion"], "v1");
    assert_eq!(p["kind"], "Pod");
    assert_eq!(p["metadata"]["name"], "cl-worker-0123456789abcdef");
    assert_eq!(p["metadata"]["namespace"], "codalab");
    let labels = &p["metadata"]["labels"];
    assert_eq!(labels["codalab.org/manager"], "gpu-managers");
    assert_eq!(labels["codalab.org/shape"], "gpu");
    assert_eq!(labels["codalab.org/worker-id"], "0123456789abcdef");
    assert_eq!(labels["app.kubernetes.io/managed-by"], "cl-worker-manager");
    assert_eq!(labels["app"], "cl-worker");
    assert_eq!(p["spec"]["restartPolicy"], "Never");
    let c = &p["spec"]["containers"][0];
    // A real CPU request (no 0.5 trick), equal to the limit.
    assert_eq!(
        c["resources"]["requests"],
        json!({"cpu": "4", "memory": "3072Mi"})
    );
    assert_eq!(c["resources"]["limits"], c["resources"]["requests"]);
    assert!(p["spec"].get("tolerations").is_none());
    assert_eq!(
        c["env"][0],
        json!({"name": "CODALAB_KUBERNETES_NODE_NAME",
               "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    );
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(p["spec"]["automountServiceAccountToken"], false);
    // The selector the backend lists with matches the pod's labels.
    for kv in pod::selector("gpu-managers").split(',') {
        let (k, v) = kv.split_once('=').unwrap();
        assert_eq!(labels[k], v, "{kv}");
    }
}

#[test]
fn gpu_shape_requests_gpus_and_tolerates_the_gke_taint() {
    let p = json_of(&config(), &spec(2));
    let c = &p["spec"]["containers"][0];
    assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], "2");
    assert_eq!(c["resources"]["requests"]["nvidia.com/gpu"], "2");
    assert_eq!(
        p["spec"]["tolerations"],
        json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    );
    // An operator's own toleration of the key is not doubled.
    let mut cfg = config();
    cfg.tolerations = vec![pod::parse_toleration("nvidia.com/gpu=present:NoSchedule").unwrap()];
    let p = json_of(&cfg, &spec(1));
    assert_eq!(
        p["spec"]["tolerations"],
        json!([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present",
                "effect": "NoSchedule"}])
    );
}

#[test]
fn credentials_come_from_the_secret_as_a_password_file() {
    let p = json_of(&config(), &spec(0));
    let text = p.to_string();
    let c = &p["spec"]["containers"][0];
    let cmd: Vec<&str> = c["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        &cmd[cmd.len() - 2..],
        ["--password-file", pod::CREDENTIALS_DIR]
    );
    assert!(!text.contains("CODALAB_PASSWORD"), "{text}");
    let vol = p["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v.get("secret").is_some())
        .unwrap();
    assert_eq!(vol["secret"]["secretName"], "codalab-creds");
    assert_eq!(vol["secret"]["defaultMode"], 0o400);
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == vol["name"])
        .unwrap();
    assert_eq!(mount["readOnly"], true);
    assert_eq!(mount["mountPath"], pod::CREDENTIALS_DIR);

    let mut cfg = config();
    cfg.credentials = Credentials::Plaintext {
        username: "codalab".into(),
        password: "hunter2".into(),
    };
    let p = json_of(&cfg, &spec(0));
    assert!(p.to_string().contains("hunter2"));
    assert!(!p.to_string().contains("--password-file"));
    assert!(!format!("{cfg:?}").contains("hunter2"));
}

#[test]
fn work_dir_is_the_claim_or_the_node_path_and_docker_gets_the_socket() {
    let p = json_of(&config(), &spec(0));
    let vols = p["spec"]["volumes"].as_array().unwrap();
    let work = vols.iter().find(|v| v["name"] == "workdir").unwrap();
    assert_eq!(
        work["hostPath"],
        json!({"path": "/mnt/nfs/codalab-worker-scratch", "type": "DirectoryOrCreate"})
    );
    let sock = vols.iter().find(|v| v["name"] == "docker-socket").unwrap();
    assert_eq!(sock["hostPath"]["type"], "Socket");
    let mounts = p["spec"]["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap();
    assert!(mounts
        .iter()
        .any(|m| m["name"] == "workdir" && m["mountPath"] == "/mnt/nfs/codalab-worker-scratch"));
    assert!(mounts
        .iter()
        .any(|m| m["name"] == "docker-socket" && m["mountPath"] == "/var/run/docker.sock"));

    let mut cfg = config();
    cfg.nfs_volume_name = Some("nfs".into());
    cfg.bundle_runtime = BundleRuntime::Kubernetes;
    let p = json_of(&cfg, &spec(0));
    let vols = p["spec"]["volumes"].as_array().unwrap();
    let work = vols.iter().find(|v| v["name"] == "nfs").unwrap();
    assert_eq!(work["persistentVolumeClaim"]["claimName"], "nfs-claim");
    assert!(vols.iter().all(|v| v["name"] != "docker-socket"));
    assert!(vols.iter().all(|v| v.get("hostPath").is_none()));
    assert_eq!(p["spec"]["automountServiceAccountToken"], true);
    // Such a worker finds its own pod (and the volume of its work dir) by name.
    let env = p["spec"]["containers"][0]["env"].as_array().unwrap();
    assert!(env
        .iter()
        .any(|e| e["name"] == "CODALAB_KUBERNETES_POD_NAME"
            && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"));
}

#[test]
fn anti_affinity_is_a_well_formed_required_term() {
    let mut cfg = config();
    let p = json_of(&cfg, &spec(0));
    assert!(p["spec"].get("affinity").is_none());
    cfg.one_worker_per_node = true;
    let p = json_of(&cfg, &spec(0));
    assert_eq!(
        p["spec"]["affinity"],
        json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {"codalab.org/manager": "gpu-managers"}},
            "topologyKey": "kubernetes.io/hostname"
        }]}})
    );
}

#[test]
fn operator_placement_flags_reach_the_pod() {
    let mut cfg = config();
    cfg.service_account = Some("cl-worker".into());
    cfg.image_pull_secrets = vec!["regcred".into()];
    cfg.priority_class = Some("batch-low".into());
    cfg.node_selector = BTreeMap::from([(
        "cloud.google.com/gke-nodepool".to_string(),
        "gpu-pool".to_string(),
    )]);
    cfg.image_pull_policy = Some("IfNotPresent".into());
    let p = json_of(&cfg, &spec(0));
    assert_eq!(p["spec"]["serviceAccountName"], "cl-worker");
    assert_eq!(p["spec"]["imagePullSecrets"], json!([{"name": "regcred"}]));
    assert_eq!(p["spec"]["priorityClassName"], "batch-low");
    assert_eq!(
        p["spec"]["nodeSelector"],
        json!({"cloud.google.com/gke-nodepool": "gpu-pool"})
    );
    assert_eq!(
        p["spec"]["containers"][0]["imagePullPolicy"],
        "IfNotPresent"
    );
}

#[test]
fn flag_parsers_refuse_malformed_values() {
    let t = pod::parse_toleration("dedicated").unwrap();
    assert_eq!(
        (t.operator.as_deref(), t.effect.as_deref()),
        (Some("Exists"), None)
    );
    let t = pod::parse_toleration("dedicated=gpu:NoExecute").unwrap();
    assert_eq!(t.value.as_deref(), Some("gpu"));
    assert_eq!(t.effect.as_deref(), Some("NoExecute"));
    assert!(pod::parse_toleration("k=v:Sometimes").is_err());
    assert!(pod::parse_toleration(":NoSchedule").is_err());
    assert_eq!(
        pod::parse_node_selector("pool=gpu").unwrap(),
        ("pool".to_string(), "gpu".to_string())
    );
    assert!(pod::parse_node_selector("pool").is_err());
    assert!(pod::parse_node_selector("pool=a b").is_err());
    assert!(pod::is_label_value("gpu-1.large_x"));
    assert!(!pod::is_label_value("-gpu"));
    assert!(!pod::is_label_value(&"x".repeat(64)));
    assert!(pod::is_dns_label("cl-worker-00ff"));
    assert!(!pod::is_dns_label("cl-worker-00FF"));
}

/// The `kubernetes` flags as the manager parses them.
fn backend_args(argv: &[&str]) -> super::KubernetesArgs {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        k: super::KubernetesArgs,
    }
    let argv = std::iter::once("kubernetes").chain(argv.iter().copied());
    <Cli as clap::Parser>::try_parse_from(argv).unwrap().k
}

#[test]
fn workers_read_the_kubelet_only_when_the_manager_says_so() {
    // By default the workers read metrics-server only: no flag that makes them call
    // nodes/proxy.
    let a = backend_args(&["--bundle-runtime", "kubernetes", "--namespace", "codalab"]);
    assert_eq!(
        a.worker_args(),
        [
            "--pass-down-termination",
            "--bundle-runtime",
            "kubernetes",
            "--kubernetes-namespace",
            "codalab"
        ]
    );
    let a = backend_args(&[
        "--bundle-runtime",
        "kubernetes",
        "--namespace",
        "codalab",
        "--worker-cluster-host",
        "https://10.0.0.1",
        "--worker-kubelet-stats",
    ]);
    assert_eq!(
        a.worker_args(),
        [
            "--pass-down-termination",
            "--bundle-runtime",
            "kubernetes",
            "--kubernetes-namespace",
            "codalab",
            "--kubernetes-cluster-host",
            "https://10.0.0.1",
            "--kubernetes-kubelet-stats"
        ]
    );
    // Docker-runtime workers never call the API: the flag is not passed on.
    let a = backend_args(&["--worker-kubelet-stats"]);
    assert_eq!(
        a.worker_args(),
        ["--pass-down-termination", "--bundle-runtime", "docker"]
    );
}

// Reading listed pods.

const NOW: i64 = 1_800_000_000;

fn listed(phase: &str, age_secs: i64) -> Pod {
    let mut p = pod::worker_pod(&config(), &spec(0));
    p.metadata.creation_timestamp = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(NOW - age_secs).unwrap(),
    ));
    p.status = Some(PodStatus {
        phase: Some(phase.into()),
        ..Default::default()
    });
    p
}

fn waiting(mut p: Pod, reason: &str) -> Pod {
    p.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
        name: "c".into(),
        state: Some(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.into()),
                message: Some(format!("{reason} for image x")),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    p
}

fn unschedulable(mut p: Pod) -> Pod {
    p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
        type_: "PodScheduled".into(),
        status: "False".into(),
        reason: Some("Unschedulable".into()),
        message: Some("0/2 nodes are available: 2 Insufficient nvidia.com/gpu.".into()),
        ..Default::default()
    }]);
    p
}

fn state(seen: &Seen) -> JobState {
    match seen {
        Seen::Job(j) | Seen::Stuck { job: j, .. } | Seen::Lost { job: j, .. } => j.state,
        Seen::Foreign => panic!("foreign"),
    }
}

#[test]
fn phases_map_to_job_states() {
    let s = pod::classify(&listed("Pending", 10), NOW, DEADLINES);
    let Seen::Job(j) = &s else { panic!("{s:?}") };
    assert_eq!(j.state, JobState::Pending);
    assert_eq!(j.id, "cl-worker-0123456789abcdef");
    assert_eq!(j.worker_id, "0123456789abcdef");
    assert_eq!(j.shape_name, "gpu");
    assert!(!s.should_delete());
    let s = pod::classify(&listed("Running", 10), NOW, DEADLINES);
    assert_eq!(state(&s), JobState::Running);
    let s = pod::classify(&listed("Unknown", 10), NOW, DEADLINES);
    assert_eq!(state(&s), JobState::Running);
    let s = pod::classify(&listed("Succeeded", 10), NOW, DEADLINES);
    assert_eq!(state(&s), JobState::Finished { success: true });
    assert!(s.should_delete());
    let mut failed = listed("Failed", 10);
    failed.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
        name: "c".into(),
        state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 137,
                reason: Some("OOMKilled".into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    let s = pod::classify(&failed, NOW, DEADLINES);
    let Seen::Job(j) = &s else { panic!("{s:?}") };
    assert_eq!(j.state, JobState::Finished { success: false });
    assert_eq!(j.detail.as_deref(), Some("OOMKilled (exit code 137)"));
    assert!(s.should_delete());
    let mut lost = listed("Failed", 10);
    lost.status.as_mut().unwrap().reason = Some("NodeLost".into());
    let Seen::Job(j) = pod::classify(&lost, NOW, DEADLINES) else {
        panic!()
    };
    assert_eq!(j.detail.as_deref(), Some("NodeLost"));
}

#[test]
fn pods_that_cannot_start_are_stuck_only_past_their_deadline() {
    for reason in [
        "ImagePullBackOff",
        "ErrImagePull",
        "CreateContainerConfigError",
    ] {
        let young = waiting(listed("Pending", 299), reason);
        assert_eq!(
            pod::classify(&young, NOW, DEADLINES),
            pod::classify(&listed("Pending", 299), NOW, DEADLINES),
            "{reason}: pending before the deadline"
        );
        let old = waiting(listed("Pending", 300), reason);
        let s = pod::classify(&old, NOW, DEADLINES);
        let Seen::Stuck { job, message } = &s else {
            panic!("{reason}: {s:?}")
        };
        assert_eq!(job.state, JobState::Finished { success: false });
        assert_eq!(job.detail.as_deref(), Some(reason));
        assert!(message.contains(reason));
        assert!(s.should_delete());
    }
    // Waiting for the autoscaler: not a failure for 15 minutes.
    let scaling = unschedulable(listed("Pending", 899));
    assert_eq!(
        state(&pod::classify(&scaling, NOW, DEADLINES)),
        JobState::Pending
    );
    let s = pod::classify(&unschedulable(listed("Pending", 900)), NOW, DEADLINES);
    let Seen::Stuck { job, message } = &s else {
        panic!("{s:?}")
    };
    assert_eq!(job.detail.as_deref(), Some("Unschedulable"));
    assert!(message.contains("Insufficient nvidia.com/gpu"));
    // Ordinary waiting (ContainerCreating) never is.
    let creating = waiting(listed("Pending", 10_000), "ContainerCreating");
    assert_eq!(
        state(&pod::classify(&creating, NOW, DEADLINES)),
        JobState::Pending
    );
    // Nor a pod already being deleted.
    let mut going = waiting(listed("Pending", 10_000), "ImagePullBackOff");
    going.metadata.deletion_timestamp = going.metadata.creation_timestamp.clone();
    assert_eq!(
        state(&pod::classify(&going, NOW, DEADLINES)),
        JobState::Pending
    );
}

#[test]
fn pods_without_a_worker_id_are_left_alone() {
    let mut p = listed("Failed", 10);
    p.metadata
        .labels
        .as_mut()
        .unwrap()
        .remove(pod::LABEL_WORKER_ID);
    let s = pod::classify(&p, NOW, DEADLINES);
    assert_eq!(s, Seen::Foreign);
    assert!(!s.should_delete());
}

fn not_ready(mut p: Pod, since_secs: i64) -> Pod {
    p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
        type_: "Ready".into(),
        status: "False".into(),
        reason: Some("NodeNotReady".into()),
        last_transition_time: Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(NOW - since_secs).unwrap(),
        )),
        ..Default::default()
    }]);
    p
}

#[test]
fn a_pod_on_a_node_that_stopped_reporting_is_deleted_by_force_after_its_deadline() {
    // Running, not ready for less than the deadline: still a running worker.
    let s = pod::classify(&not_ready(listed("Running", 900), 299), NOW, DEADLINES);
    assert_eq!(state(&s), JobState::Running);
    assert!(!s.should_delete());
    // Past it: lost, deleted (by force), ended unsuccessfully with reason NodeLost.
    let s = pod::classify(&not_ready(listed("Running", 900), 300), NOW, DEADLINES);
    let Seen::Lost { job, message } = &s else {
        panic!("{s:?}")
    };
    assert_eq!(job.state, JobState::Finished { success: false });
    assert_eq!(job.detail.as_deref(), Some("NodeLost"));
    assert!(
        message.contains("not ready on its node (NodeNotReady) for 300 s"),
        "{message}"
    );
    assert!(s.should_delete());
    // A ready running pod never is.
    let mut ready = not_ready(listed("Running", 900), 900);
    ready.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "True".into();
    assert_eq!(
        state(&pod::classify(&ready, NOW, DEADLINES)),
        JobState::Running
    );
    // A deletion the node never confirmed: lost once its grace plus the deadline passed.
    let mut terminating = listed("Running", 900);
    terminating.spec.as_mut().unwrap().node_name = Some("node-a".into());
    terminating.metadata.deletion_timestamp = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(NOW - 330).unwrap(),
    ));
    terminating.metadata.deletion_grace_period_seconds = Some(30);
    assert!(matches!(
        pod::classify(&terminating, NOW, DEADLINES),
        Seen::Lost { .. }
    ));
    terminating.metadata.deletion_grace_period_seconds = Some(60);
    assert_eq!(
        state(&pod::classify(&terminating, NOW, DEADLINES)),
        JobState::Running
    );
    // Ended pods are reported as they ended; 0 turns the deadline off.
    let failed = not_ready(listed("Failed", 900), 900);
    assert!(matches!(
        pod::classify(&failed, NOW, DEADLINES),
        Seen::Job(_)
    ));
    let off = Deadlines {
        node_lost: Duration::ZERO,
        ..DEADLINES
    };
    let s = pod::classify(&not_ready(listed("Running", 900), 900), NOW, off);
    assert_eq!(state(&s), JobState::Running);
}
