//! State shared by the HTTP front and the node agent.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

/// Fault injections, set through the control endpoint (`/standin/v1/faults`). Each pod fault
/// holds a label selector (`""` = every pod) naming the pods it applies to.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Faults {
    /// Pods the scheduler leaves Pending with PodScheduled=False, reason Unschedulable.
    #[serde(default)]
    pub unschedulable: Option<String>,
    /// Pods whose image "pull" fails: waiting ErrImagePull, then ImagePullBackOff.
    #[serde(default)]
    pub image_pull: Option<String>,
    /// Pods whose containers cannot be configured: waiting CreateContainerConfigError.
    #[serde(default)]
    pub config_error: Option<String>,
    /// Nodes that stopped reporting (NotReady; their pods are failed with reason NodeLost).
    #[serde(default)]
    pub lost_nodes: BTreeSet<String>,
    /// Nodes cut off from the control plane (NotReady, unreachable taints) whose pods keep
    /// running: marked not Ready (reason NodeNotReady) and left as they are, phase Running,
    /// until deleted (their containers are then stopped with the pod's own grace period, as
    /// a kubelet reached again stops orphaned pods, whatever grace the deletion asked for).
    #[serde(default)]
    pub unreachable_nodes: BTreeSet<String>,
}

/// Does the fault's selector pick a pod with these labels?
pub fn fault_selects(selector: &Option<String>, labels: &BTreeMap<String, String>) -> bool {
    match selector.as_deref() {
        None => false,
        Some("") => true,
        Some(sel) => {
            kube_fake_client::label_selector::matches_label_selector(labels, sel).unwrap_or(false)
        }
    }
}

pub struct Shared {
    /// The in-memory API (kube-fake-client), as a kube::Client.
    pub client: kube::Client,
    /// Bearer token every request must carry, if set.
    pub token: Option<String>,
    /// Namespaces that exist (fixed at start).
    pub namespaces: Vec<String>,
    /// Where created/replaced objects are recorded for the validation oracle.
    pub objects_dir: PathBuf,
    /// Where the agent keeps PVC directories and pod volume files.
    pub state_dir: PathBuf,
    pub seq: AtomicU64,
    pub faults: Mutex<Faults>,
    /// Wakes the node agent after a write.
    pub wake: Notify,
    /// gracePeriodSeconds a DELETE asked for, by pod uid.
    pub grace: Mutex<HashMap<String, i64>>,
    /// Label put on every container this instance starts (value: the instance id).
    pub instance: String,
    /// Kubernetes version claimed by /version, e.g. (1, 36).
    pub version: (u32, u32),
    pub port: u16,
}

impl Shared {
    pub fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::SeqCst) + 1
    }

    pub fn faults(&self) -> Faults {
        self.faults.lock().expect("faults lock").clone()
    }
}

/// Container label: which stand-in instance started the container.
pub const LABEL_INSTANCE: &str = "org.cl-worker-test.kube-standin";
/// Container labels naming the pod, as the kubelet's Docker integration set them.
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
