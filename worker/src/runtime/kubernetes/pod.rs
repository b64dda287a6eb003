//! The pure half of the Kubernetes runtime: the run pod built from a [`RunSpec`], what a listed
//! pod says about its run, and what a node can still give this worker. No I/O here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerStatus, EmptyDirVolumeSource, EnvVar,
    HostPathVolumeSource, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec,
    ResourceRequirements, SeccompProfile, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::runtime::{
    dropped_capabilities, exact, wrapped_command, RunSpec, RunStatus, RuntimeError,
};
use common::Resources;

pub use common::cluster::{GPU_RESOURCE, LABEL_MANAGED_BY, LABEL_WORKER_ID};
/// Value of [`LABEL_MANAGED_BY`] on run pods.
pub const MANAGED_BY: &str = "cl-worker";
/// Label of every run pod: its bundle.
pub const LABEL_BUNDLE_UUID: &str = "codalab.org/bundle-uuid";
/// `"false"` when the run asked for no network: a NetworkPolicy can select such pods.
pub const LABEL_NETWORK: &str = "codalab.org/network";
/// The worker id as given (a label value cannot hold every id).
pub const ANNOTATION_WORKER_ID: &str = "codalab.org/worker-id";

/// Python's name of a run's pod.
pub fn pod_name(uuid: &str) -> String {
    format!("codalab-run-{uuid}")
}

/// The label selector of the run pods of the worker labelled `worker_label`.
pub fn runs_selector(worker_label: &str) -> String {
    format!("{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_WORKER_ID}={worker_label}")
}

/// Whether `p` is a run pod of the worker labelled `worker_label` (what [`runs_selector`]
/// selects).
pub fn is_run_of(p: &Pod, worker_label: &str) -> bool {
    let labels = p.metadata.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    label(LABEL_MANAGED_BY) == Some(MANAGED_BY) && label(LABEL_WORKER_ID) == Some(worker_label)
}

/// A label value for any worker id: the id itself when it is one, else its readable part and
/// a hash, so that distinct ids stay distinct.
pub fn worker_label(id: &str) -> String {
    let ok = id.len() <= 63
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && id.starts_with(|c: char| c.is_ascii_alphanumeric())
        && id.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        return id.to_owned();
    }
    // FNV-1a: stable across versions and machines.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in id.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100000001b3);
    }
    let readable: String = id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(40)
        .collect();
    let readable = readable.trim_matches('-');
    if readable.is_empty() {
        format!("w{h:016x}")
    } else {
        format!("{readable}-{h:016x}")
    }
}

/// The volume that holds the worker's work dir, as run pods mount it: the worker pod's own
/// volume (a claim or a host path) when the worker runs in a pod, else the host path of the
/// work dir itself (the worker runs on the node).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkVolume {
    pub source: WorkSource,
    /// Where the volume (at `sub_path`) appears in the worker's file system.
    pub mount_root: PathBuf,
    /// The part of the volume mounted at `mount_root` (empty: all of it).
    pub sub_path: String,
}

/// Why a run pod cannot be made: a path it would mount cannot be carried exactly, or is not
/// where the pod could mount it from.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PodSpecError {
    /// A path that cannot be handed to the API exactly ([`exact`]).
    #[error(transparent)]
    Inexact(#[from] RuntimeError),
    #[error("the bundle directory {} is not in the work volume", .0.display())]
    BundleOutsideVolume(PathBuf),
}

#[derive(Debug, Clone, PartialEq)]
pub enum WorkSource {
    HostPath(String),
    Claim(String),
}

impl WorkVolume {
    /// The work dir as a host path on the node (Python's way); refused if the path cannot be
    /// carried exactly.
    pub fn host(work_dir: &Path) -> Result<Self, PodSpecError> {
        Ok(WorkVolume {
            source: WorkSource::HostPath(exact(work_dir)?.to_owned()),
            mount_root: work_dir.to_owned(),
            sub_path: String::new(),
        })
    }

    /// The volume of `pod` mounted at the deepest mount path that holds `work_dir`.
    pub fn of_pod(pod: &Pod, work_dir: &Path) -> Option<Self> {
        let spec = pod.spec.as_ref()?;
        let (mount, _) = spec
            .containers
            .iter()
            .flat_map(|c| c.volume_mounts.iter().flatten())
            .filter_map(|m| {
                let root = Path::new(&m.mount_path);
                work_dir
                    .starts_with(root)
                    .then(|| (m, root.components().count()))
            })
            .max_by_key(|(_, depth)| *depth)?;
        let volume = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)?;
        let source = if let Some(h) = &volume.host_path {
            WorkSource::HostPath(h.path.clone())
        } else if let Some(c) = &volume.persistent_volume_claim {
            WorkSource::Claim(c.claim_name.clone())
        } else {
            return None;
        };
        Some(WorkVolume {
            source,
            mount_root: PathBuf::from(&mount.mount_path),
            sub_path: mount.sub_path.clone().unwrap_or_default(),
        })
    }

    /// The `subPath` of `path` in this volume: `Ok(None)` if the volume does not hold it, an
    /// error if it does but the path cannot be carried exactly (never an approximation, which
    /// could name another entry of the volume).
    pub fn sub_path_of(&self, path: &Path) -> Result<Option<String>, PodSpecError> {
        let Ok(rel) = path.strip_prefix(&self.mount_root) else {
            return Ok(None);
        };
        let rel = exact(rel)?;
        let joined = match (self.sub_path.trim_matches('/'), rel.trim_matches('/')) {
            ("", r) => r.to_owned(),
            (s, "") => s.to_owned(),
            (s, r) => format!("{s}/{r}"),
        };
        Ok(Some(joined))
    }

    fn volume(&self, name: &str) -> Volume {
        match &self.source {
            WorkSource::HostPath(p) => Volume {
                name: name.into(),
                host_path: Some(HostPathVolumeSource {
                    path: p.clone(),
                    type_: Some("Directory".into()),
                }),
                ..Default::default()
            },
            WorkSource::Claim(c) => Volume {
                name: name.into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: c.clone(),
                    read_only: None,
                }),
                ..Default::default()
            },
        }
    }
}

/// Where the run pod goes and what it may tolerate.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub namespace: String,
    pub node: String,
    /// The worker pod's tolerations (the node's taints let it in), when known.
    pub tolerations: Vec<Toleration>,
    pub worker_id: String,
}

/// The run pod of `spec`: CodaLab's container contract (bash wrapper, `/<uuid>` as cwd and
/// HOME, `CODALAB=true`), on the worker's node, the bundle dir and dependencies as `subPath`s of
/// the work volume (dependencies read-only), requests equal to limits.
pub fn run_pod(spec: &RunSpec, work: &WorkVolume, at: &Placement) -> Result<Pod, PodSpecError> {
    let uuid = &spec.uuid;
    let workdir = format!("/{uuid}");
    let mut volumes = vec![work.volume("work")];
    let bundle_sub = work
        .sub_path_of(&spec.bundle_path)?
        .ok_or_else(|| PodSpecError::BundleOutsideVolume(spec.bundle_path.clone()))?;
    let mut mounts = vec![VolumeMount {
        name: "work".into(),
        mount_path: workdir.clone(),
        sub_path: Some(bundle_sub),
        ..Default::default()
    }];
    for (i, m) in spec.mounts.iter().enumerate() {
        exact(Path::new(&m.container))?;
        let (name, sub_path) = match work.sub_path_of(&m.host)? {
            Some(sub) => ("work".to_string(), Some(sub)),
            // Outside the work volume (a shared file system): the same path on the node.
            None => {
                let name = format!("dep-{i}");
                volumes.push(Volume {
                    name: name.clone(),
                    host_path: Some(HostPathVolumeSource {
                        path: exact(&m.host)?.to_owned(),
                        type_: None,
                    }),
                    ..Default::default()
                });
                (name, None)
            }
        };
        mounts.push(VolumeMount {
            name,
            mount_path: m.container.clone(),
            sub_path,
            read_only: m.read_only.then_some(true),
            ..Default::default()
        });
    }
    if spec.shm_size_bytes > 0 {
        volumes.push(Volume {
            name: "shm".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: Some(Quantity(spec.shm_size_bytes.to_string())),
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: "shm".into(),
            mount_path: "/dev/shm".into(),
            ..Default::default()
        });
    }

    let mut amounts = BTreeMap::new();
    amounts.insert(
        "cpu".to_string(),
        Quantity(spec.cpuset.len().max(1).to_string()),
    );
    if spec.memory_bytes > 0 {
        amounts.insert(
            "memory".to_string(),
            Quantity(spec.memory_bytes.to_string()),
        );
    }
    let gpus = spec.gpu_uuids.len();
    let mut tolerations = at.tolerations.clone();
    if gpus > 0 {
        amounts.insert(GPU_RESOURCE.to_string(), Quantity(gpus.to_string()));
        if !tolerations
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
    }

    let (uid, gid) = match spec.user.split_once(':') {
        Some((u, g)) => (u.parse::<i64>().ok(), g.parse::<i64>().ok()),
        None => (spec.user.parse::<i64>().ok(), None),
    };
    let labels = BTreeMap::from([
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
        (LABEL_WORKER_ID.to_string(), worker_label(&at.worker_id)),
        (LABEL_BUNDLE_UUID.to_string(), uuid.clone()),
        (LABEL_NETWORK.to_string(), spec.network.to_string()),
    ]);
    let mut env = vec![
        EnvVar {
            name: "HOME".into(),
            value: Some(workdir.clone()),
            ..Default::default()
        },
        EnvVar {
            name: "CODALAB".into(),
            value: Some("true".into()),
            ..Default::default()
        },
    ];
    if gpus == 0 {
        // No GPU even where the node's default runtime is NVIDIA's and the image asks for
        // all (`ENV NVIDIA_VISIBLE_DEVICES=all` in CUDA images).
        env.push(EnvVar {
            name: "NVIDIA_VISIBLE_DEVICES".into(),
            value: Some("void".into()),
            ..Default::default()
        });
    }
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(uuid)),
            namespace: Some(at.namespace.clone()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                ANNOTATION_WORKER_ID.to_string(),
                at.worker_id.clone(),
            )])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            // The scheduler (not the kubelet's admission) decides when the run fits the node.
            affinity: Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_fields: Some(vec![NodeSelectorRequirement {
                                key: "metadata.name".into(),
                                operator: "In".into(),
                                values: Some(vec![at.node.clone()]),
                            }]),
                            ..Default::default()
                        }],
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            tolerations: (!tolerations.is_empty()).then_some(tolerations),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(0),
            security_context: Some(PodSecurityContext {
                run_as_user: uid,
                run_as_group: gid,
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            containers: vec![Container {
                name: "run".into(),
                image: Some(spec.image.clone()),
                // As with Docker: an image already on the node is never pulled again.
                image_pull_policy: Some("IfNotPresent".into()),
                command: Some(wrapped_command(&spec.command)),
                working_dir: Some(workdir),
                env: Some(env),
                resources: Some(ResourceRequirements {
                    limits: Some(amounts.clone()),
                    requests: Some(amounts),
                    ..Default::default()
                }),
                volume_mounts: Some(mounts),
                // The hardening of Docker runs: no privilege escalation (set-user-id files do
                // not raise), the same capabilities dropped. A pids limit is the kubelet's
                // (`podPidsLimit`), not the pod's: see docs/security.md.
                security_context: Some(SecurityContext {
                    allow_privilege_escalation: Some(false),
                    capabilities: Some(Capabilities {
                        drop: Some(dropped_capabilities(spec)),
                        ..Default::default()
                    }),
                    run_as_non_root: spec.no_capabilities.then_some(true),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            volumes: Some(volumes),
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn unix(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> f64 {
    t.0.as_millisecond() as f64 / 1000.0
}

fn run_container(pod: &Pod) -> Option<&ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == "run")
}

/// What a run pod says about its run. A pod that failed without its container ending (evicted,
/// node lost) is stopped with the pod's reason as the failure.
pub fn run_status(pod: &Pod) -> RunStatus {
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending");
    let state = run_container(pod).and_then(|c| c.state.as_ref());
    if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
        return RunStatus {
            running: false,
            exit_code: Some(i64::from(t.exit_code)),
            oom_killed: t.reason.as_deref() == Some("OOMKilled"),
            started_at: t.started_at.as_ref().map(unix),
            finished_at: t.finished_at.as_ref().map(unix),
            failure: None,
        };
    }
    let started_at = state
        .and_then(|s| s.running.as_ref())
        .and_then(|r| r.started_at.as_ref())
        .map(unix);
    if matches!(phase, "Failed" | "Succeeded") {
        let s = pod.status.as_ref();
        let reason = s.and_then(|s| s.reason.as_deref()).unwrap_or(phase);
        let failure = match s.and_then(|s| s.message.as_deref()) {
            Some(m) => format!("Kubernetes pod failed: {reason}: {m}"),
            None => format!("Kubernetes pod failed: {reason}"),
        };
        return RunStatus {
            running: false,
            exit_code: None,
            oom_killed: false,
            started_at,
            finished_at: None,
            failure: Some(failure),
        };
    }
    RunStatus {
        running: true,
        exit_code: None,
        oom_killed: false,
        started_at,
        finished_at: None,
        failure: None,
    }
}

/// Where a just-created run pod stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Startup {
    /// Started (or already ended): the run is the monitor's now.
    Started,
    /// Not yet: the reason to show (e.g. waiting for the scheduler), if any.
    Waiting(Option<String>),
    /// It cannot start: an image that cannot be pulled (`true`) or another cause.
    Failed { image: bool, message: String },
}

/// Waiting reasons that do not resolve by themselves. `ErrImagePull` is the first failed pull,
/// which the kubelet retries once before backing off.
const FATAL_WAITING: &[(&str, bool)] = &[
    ("ImagePullBackOff", true),
    ("InvalidImageName", true),
    ("ErrImageNeverPull", true),
    ("CreateContainerConfigError", false),
    ("CreateContainerError", false),
];

pub fn startup(pod: &Pod) -> Startup {
    let st = run_status(pod);
    if !st.running || st.started_at.is_some() {
        return Startup::Started;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase == Some("Running") {
        return Startup::Started;
    }
    if let Some(w) = run_container(pod)
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.waiting.as_ref())
    {
        let reason = w.reason.as_deref().unwrap_or("");
        let text = match &w.message {
            Some(m) => format!("{reason}: {m}"),
            None => reason.to_owned(),
        };
        if let Some((_, image)) = FATAL_WAITING.iter().find(|(r, _)| *r == reason) {
            return Startup::Failed {
                image: *image,
                message: text,
            };
        }
        return Startup::Waiting((!reason.is_empty()).then_some(text));
    }
    let unscheduled = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| {
            c.iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        })
        .map(|c| {
            format!(
                "Waiting for the cluster to schedule the run on this node: {}",
                c.message.as_deref().unwrap_or("")
            )
        });
    Startup::Waiting(unscheduled)
}

/// A Kubernetes quantity as a number (`500m`, `4`, `8Gi`, `1e3`, `250n`).
pub fn quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    let split = q
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        _ => return None,
    };
    Some(n * mult)
}

/// The memory limit of a run pod's container (0: none).
pub fn memory_limit(pod: &Pod) -> u64 {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == "run"))
        .and_then(|c| c.resources.as_ref()?.limits.as_ref()?.get("memory"))
        .and_then(|q| quantity(&q.0))
        .map_or(0, |b| b as u64)
}

/// A pod's request of `resource`: its containers' requests (limits when there is no
/// request), or its largest init container's when that is more.
fn pod_request(pod: &Pod, resource: &str) -> f64 {
    let Some(spec) = pod.spec.as_ref() else {
        return 0.0;
    };
    let of = |c: &Container| {
        let r = c.resources.as_ref();
        r.and_then(|r| r.requests.as_ref())
            .and_then(|m| m.get(resource))
            .or_else(|| {
                r.and_then(|r| r.limits.as_ref())
                    .and_then(|m| m.get(resource))
            })
            .and_then(|q| quantity(&q.0))
            .unwrap_or(0.0)
    };
    let sum: f64 = spec.containers.iter().map(of).sum();
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(of)
        .fold(0.0, f64::max);
    sum.max(init)
}

/// The node's allocatable resources minus what its other pods request: every pod bound to it
/// that has not ended, the worker's own pod included, except this worker's run pods (the server
/// already deducts the runs it assigned).
pub fn capacity(node: &Node, pods: &[Pod], worker_label: &str) -> Resources {
    let alloc = |r: &str| {
        node.status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get(r))
            .and_then(|q| quantity(&q.0))
            .unwrap_or(0.0)
    };
    let node_name = node.metadata.name.as_deref();
    let others: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == node_name)
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .filter(|p| !is_run_of(p, worker_label))
        .collect();
    let free = |r: &str| {
        let used: f64 = others.iter().map(|p| pod_request(p, r)).sum();
        (alloc(r) - used).max(0.0)
    };
    // `as` saturates: a node larger than u32 CPUs reads as u32::MAX.
    Resources::new(
        (free("cpu") + 1e-9).floor() as u32,
        (free(GPU_RESOURCE) + 1e-9).floor() as u32,
        free("memory") as u64,
    )
}
