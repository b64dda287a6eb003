//! The worker pod: one per worker, built from the backend's settings and a [`JobSpec`], and
//! read back into a [`JobStatus`] — both pure, so that they are tested without a cluster.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, EnvVar, EnvVarSource, HostPathVolumeSource, KeyToPath,
    LocalObjectReference, ObjectFieldSelector, PersistentVolumeClaimVolumeSource, Pod,
    PodAffinityTerm, PodAntiAffinity, PodSecurityContext, PodSpec, ResourceRequirements,
    SeccompProfile, SecretVolumeSource, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::KubernetesConfig;
use crate::{JobSpec, JobState, JobStatus};

pub use common::cluster::{GPU_RESOURCE, LABEL_MANAGED_BY, LABEL_WORKER_ID};
/// Value of [`LABEL_MANAGED_BY`] on worker pods.
pub const MANAGED_BY: &str = "cl-worker-manager";
/// Label naming the manager (`--manager-name`): a manager lists and touches only its own pods.
pub const LABEL_MANAGER: &str = "codalab.org/manager";
/// Label naming the worker shape of the pod.
pub const LABEL_SHAPE: &str = "codalab.org/shape";
/// Where the credentials Secret is mounted in the worker container (a directory holding
/// `username` and `password`, given to the worker as `--password-file`).
pub const CREDENTIALS_DIR: &str = "/etc/codalab/credentials";
/// Where the node's Docker socket is mounted in the worker container.
pub const DOCKER_SOCKET_IN_POD: &str = "/var/run/docker.sock";

/// Container waiting reasons that mean the pod cannot start until someone acts.
const START_FAILURES: [&str; 5] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
];

/// The pod name of worker `worker_id` (Python's `cl-worker-<id>`).
pub fn pod_name(worker_id: &str) -> String {
    format!("cl-worker-{worker_id}")
}

/// The label selector of this manager's pods: the one list call of a tick.
pub fn selector(manager_name: &str) -> String {
    format!("{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_MANAGER}={manager_name}")
}

/// Whether `v` is a valid label value (at most 63 characters, alphanumerics at both ends,
/// `-`, `_` and `.` inside).
pub fn is_label_value(v: &str) -> bool {
    let b = v.as_bytes();
    v.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b.first().is_none_or(u8::is_ascii_alphanumeric)
        && b.last().is_none_or(u8::is_ascii_alphanumeric)
}

/// Whether `v` is a valid DNS-1123 label (pod names, namespaces).
pub fn is_dns_label(v: &str) -> bool {
    let b = v.as_bytes();
    !v.is_empty()
        && v.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

fn quantity(s: impl Into<String>) -> Quantity {
    Quantity(s.into())
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

/// The worker pod for `spec`.
pub fn worker_pod(cfg: &KubernetesConfig, spec: &JobSpec) -> Pod {
    let name = pod_name(&spec.worker_id);
    let labels = BTreeMap::from([
        // Python's label, which its documentation's DaemonSets and dashboards select on.
        ("app".to_string(), "cl-worker".to_string()),
        ("app.kubernetes.io/name".into(), "cl-worker".into()),
        (LABEL_MANAGED_BY.into(), MANAGED_BY.into()),
        (LABEL_MANAGER.into(), cfg.manager_name.clone()),
        (LABEL_SHAPE.into(), spec.shape_name.clone()),
        (LABEL_WORKER_ID.into(), spec.worker_id.clone()),
    ]);

    // Requests equal limits: the scheduler reserves what the worker may use (Guaranteed QoS).
    let mut amounts = BTreeMap::from([
        ("cpu".to_string(), quantity(spec.resources.cpus.to_string())),
        (
            "memory".to_string(),
            quantity(format!(
                "{}Mi",
                spec.resources.memory_bytes.div_ceil(1 << 20)
            )),
        ),
    ]);
    if spec.resources.gpus > 0 {
        amounts.insert(
            GPU_RESOURCE.into(),
            quantity(spec.resources.gpus.to_string()),
        );
    }

    let mut command = spec.command.clone();
    let mut env_vars = vec![EnvVar {
        name: "CODALAB_KUBERNETES_NODE_NAME".into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "spec.nodeName".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }];
    if cfg.bundle_runtime == super::BundleRuntime::Kubernetes {
        // The worker reads its own pod to mount its work dir's volume in its run pods.
        env_vars.push(EnvVar {
            name: "CODALAB_KUBERNETES_POD_NAME".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.name".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    env_vars.extend(spec.env.iter().map(|(k, v)| env(k, v)));
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();

    match &cfg.credentials {
        super::Credentials::Secret(secret) => {
            command.extend(["--password-file".into(), CREDENTIALS_DIR.into()]);
            volumes.push(Volume {
                name: "codalab-credentials".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(secret.clone()),
                    default_mode: Some(0o400),
                    items: Some(
                        ["username", "password"]
                            .map(|k| KeyToPath {
                                key: k.into(),
                                path: k.into(),
                                mode: None,
                            })
                            .to_vec(),
                    ),
                    optional: Some(false),
                }),
                ..Default::default()
            });
            mounts.push(VolumeMount {
                name: "codalab-credentials".into(),
                mount_path: CREDENTIALS_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            });
        }
        super::Credentials::Plaintext { username, password } => {
            env_vars.push(env("CODALAB_USERNAME", username));
            env_vars.push(env("CODALAB_PASSWORD", password));
        }
    }

    // The work directory at the same path as on the node: the worker's bundle containers,
    // started by the node's Docker, bind paths under it.
    let work_volume = cfg
        .nfs_volume_name
        .clone()
        .unwrap_or_else(|| "workdir".into());
    volumes.push(match &cfg.nfs_volume_name {
        Some(nfs) => Volume {
            name: nfs.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: format!("{nfs}-claim"),
                read_only: None,
            }),
            ..Default::default()
        },
        None => Volume {
            name: "workdir".into(),
            host_path: Some(HostPathVolumeSource {
                path: cfg.work_dir.clone(),
                type_: Some("DirectoryOrCreate".into()),
            }),
            ..Default::default()
        },
    });
    mounts.push(VolumeMount {
        name: work_volume,
        mount_path: cfg.work_dir.clone(),
        ..Default::default()
    });

    if cfg.bundle_runtime == super::BundleRuntime::Docker {
        volumes.push(Volume {
            name: "docker-socket".into(),
            host_path: Some(HostPathVolumeSource {
                path: cfg.docker_socket.clone(),
                type_: Some("Socket".into()),
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: "docker-socket".into(),
            mount_path: DOCKER_SOCKET_IN_POD.into(),
            ..Default::default()
        });
    }

    let mut tolerations = cfg.tolerations.clone();
    if spec.resources.gpus > 0
        && !tolerations
            .iter()
            .any(|t| t.key.as_deref() == Some(GPU_RESOURCE))
    {
        tolerations.push(Toleration {
            key: Some(GPU_RESOURCE.into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        });
    }

    let affinity = cfg.one_worker_per_node.then(|| Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
                label_selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([(
                        LABEL_MANAGER.to_string(),
                        cfg.manager_name.clone(),
                    )])),
                    ..Default::default()
                }),
                topology_key: "kubernetes.io/hostname".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    });

    let container = Container {
        name: format!("{name}-container"),
        image: Some(cfg.image.clone()),
        image_pull_policy: cfg.image_pull_policy.clone(),
        command: Some(command),
        env: Some(env_vars),
        resources: Some(ResourceRequirements {
            limits: Some(amounts.clone()),
            requests: Some(amounts),
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
        // Root in the container (the image's user) to reach the node's Docker socket, with
        // only the capabilities a worker needs to manage run directories that bundles wrote
        // as other users.
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: Some(vec!["CHOWN".into(), "DAC_OVERRIDE".into(), "FOWNER".into()]),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };

    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(cfg.namespace.clone()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            containers: vec![container],
            volumes: Some(volumes),
            service_account_name: cfg.service_account.clone(),
            // A worker running bundles as pods talks to the API with its service account;
            // one running them in Docker needs no token at all.
            automount_service_account_token: Some(
                cfg.bundle_runtime == super::BundleRuntime::Kubernetes,
            ),
            image_pull_secrets: (!cfg.image_pull_secrets.is_empty()).then(|| {
                cfg.image_pull_secrets
                    .iter()
                    .map(|s| LocalObjectReference { name: s.clone() })
                    .collect()
            }),
            priority_class_name: cfg.priority_class.clone(),
            node_selector: (!cfg.node_selector.is_empty()).then(|| cfg.node_selector.clone()),
            tolerations: (!tolerations.is_empty()).then_some(tolerations),
            affinity,
            security_context: Some(PodSecurityContext {
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// How long a pod may stay pending for a reason that needs someone to act.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// No node fits (a cluster autoscaler may still add one).
    pub unschedulable: Duration,
    /// The image cannot be pulled or the container cannot be created.
    pub start_failure: Duration,
    /// The pod's node stopped reporting (0: never act).
    pub node_lost: Duration,
}

/// What one listed pod means for the manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// A live or ended pod, as the manager counts it.
    Job(JobStatus),
    /// Pending past its deadline: delete it and report it as a failed launch (`job` is
    /// already `Finished { success: false }`, `job.detail` the reason).
    Stuck { job: JobStatus, message: String },
    /// On a node that stopped reporting past its deadline: delete it by force (the node
    /// cannot confirm a graceful deletion) and report it ended (`job` is already
    /// `Finished { success: false }`, reason `NodeLost`).
    Lost { job: JobStatus, message: String },
    /// Not one of ours in a usable form (no worker id label): left alone.
    Foreign,
}

impl Seen {
    /// Whether the pod should be deleted this tick (ended, or stuck).
    pub fn should_delete(&self) -> bool {
        match self {
            Seen::Job(j) => matches!(j.state, JobState::Finished { .. }),
            Seen::Stuck { .. } | Seen::Lost { .. } => true,
            Seen::Foreign => false,
        }
    }
}

/// Why a pending pod cannot start, if it cannot: `(reason, message, deadline)`.
fn blocked(pod: &Pod, deadlines: Deadlines) -> Option<(String, String, Duration)> {
    let status = pod.status.as_ref()?;
    let waiting = status
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
        .find(|w| {
            w.reason
                .as_deref()
                .is_some_and(|r| START_FAILURES.contains(&r))
        });
    if let Some(w) = waiting {
        return Some((
            w.reason.clone().unwrap_or_default(),
            w.message.clone().unwrap_or_default(),
            deadlines.start_failure,
        ));
    }
    let unschedulable = status.conditions.iter().flatten().find(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    })?;
    Some((
        "Unschedulable".into(),
        unschedulable.message.clone().unwrap_or_default(),
        deadlines.unschedulable,
    ))
}

/// How long (seconds at `now`) a live pod has been on a node that stopped reporting: since
/// its deletion's grace ran out with the pod still there (the node never confirmed it), or
/// since its Ready condition left True while it runs (Kubernetes' node controller marks the
/// pods of a NotReady node so; a worker pod has no readiness probe that could).
fn lost_for(pod: &Pod, phase: &str, now: i64) -> Option<(i64, String)> {
    let on_a_node = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
    if let Some(t) = pod
        .metadata
        .deletion_timestamp
        .as_ref()
        .filter(|_| on_a_node)
    {
        let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(0);
        let since = t.0.as_second().saturating_add(grace);
        return Some((
            now.saturating_sub(since),
            "its deletion was never confirmed by its node".into(),
        ));
    }
    if !matches!(phase, "Running" | "Unknown") {
        return None;
    }
    let ready = pod
        .status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")?;
    if ready.status == "True" {
        return None;
    }
    let since = ready
        .last_transition_time
        .as_ref()
        .map_or(now, |t| t.0.as_second());
    Some((
        now.saturating_sub(since),
        format!(
            "not ready on its node{}",
            ready
                .reason
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        ),
    ))
}

/// Why an ended pod failed (the pod's reason, else its container's), for the log.
fn failure_reason(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    if let Some(r) = status.reason.clone().filter(|r| !r.is_empty()) {
        return Some(r);
    }
    status
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
        .find_map(|t| {
            t.reason
                .clone()
                .map(|r| format!("{r} (exit code {})", t.exit_code))
        })
}

/// Reads one listed pod at unix time `now`.
pub fn classify(pod: &Pod, now: i64, deadlines: Deadlines) -> Seen {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let Some(worker_id) = labels.get(LABEL_WORKER_ID).cloned() else {
        return Seen::Foreign;
    };
    let Some(id) = pod.metadata.name.clone() else {
        return Seen::Foreign;
    };
    let shape_name = labels.get(LABEL_SHAPE).cloned().unwrap_or_default();
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending");
    let mut job = JobStatus {
        id,
        worker_id,
        shape_name,
        state: JobState::Pending,
        detail: None,
    };
    if !matches!(phase, "Succeeded" | "Failed") && !deadlines.node_lost.is_zero() {
        if let Some((age, why)) = lost_for(pod, phase, now) {
            if age >= deadlines.node_lost.as_secs() as i64 {
                job.state = JobState::Finished { success: false };
                job.detail = Some("NodeLost".into());
                let message = format!(
                    "{why} for {age} s (node {})",
                    pod.spec
                        .as_ref()
                        .and_then(|s| s.node_name.as_deref())
                        .unwrap_or("?")
                );
                return Seen::Lost { job, message };
            }
        }
    }
    match phase {
        "Pending" => {
            // A pod already being deleted is on its way out: not stuck, just pending.
            if pod.metadata.deletion_timestamp.is_some() {
                return Seen::Job(job);
            }
            let age = pod
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| now.saturating_sub(t.0.as_second()).max(0));
            if let Some((reason, message, deadline)) = blocked(pod, deadlines) {
                if age as u64 >= deadline.as_secs() {
                    job.state = JobState::Finished { success: false };
                    job.detail = Some(reason);
                    return Seen::Stuck { job, message };
                }
            }
        }
        "Succeeded" => job.state = JobState::Finished { success: true },
        "Failed" => {
            job.state = JobState::Finished { success: false };
            job.detail = failure_reason(pod);
        }
        // Running, and Unknown (the node stopped reporting): it still holds its place.
        _ => job.state = JobState::Running,
    }
    Seen::Job(job)
}

/// Parses a `--toleration`: `KEY[=VALUE][:EFFECT]` (kubectl's taint syntax; without a value
/// the key is tolerated whatever its value; without an effect, every effect).
pub fn parse_toleration(s: &str) -> Result<Toleration, String> {
    let (kv, effect) = match s.rsplit_once(':') {
        Some((kv, e)) => (kv, Some(e)),
        None => (s, None),
    };
    if let Some(e) = effect {
        if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&e) {
            return Err(format!(
                "toleration {s:?}: the effect must be NoSchedule, PreferNoSchedule or NoExecute"
            ));
        }
    }
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (kv, None),
    };
    if key.is_empty() {
        return Err(format!(
            "toleration {s:?}: expected KEY[=VALUE][:EFFECT], e.g. nvidia.com/gpu=present:NoSchedule"
        ));
    }
    Ok(Toleration {
        key: Some(key.into()),
        operator: Some(if value.is_some() { "Equal" } else { "Exists" }.into()),
        value: value.map(str::to_string),
        effect: effect.map(str::to_string),
        ..Default::default()
    })
}

/// Parses a `--node-selector`: `KEY=VALUE`.
pub fn parse_node_selector(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() && is_label_value(v) => Ok((k.into(), v.into())),
        _ => Err(format!(
            "node selector {s:?}: expected KEY=VALUE, e.g. cloud.google.com/gke-nodepool=gpu-pool"
        )),
    }
}
