//! The Kubernetes runtime's whole use of the API, as RBAC rules.
//!
//! In the namespace of `--kubernetes-namespace` it creates, reads, lists (label-selected, after
//! a restart) and deletes its run pods, and reads its own pod (to mount its work dir's volume
//! in run pods). Cluster-wide it reads its node and lists the pods bound to that node (the
//! node's free resources for check-ins). Stats come from `metrics.k8s.io` pods (metrics-server);
//! only with `--kubernetes-kubelet-stats` does the worker also read the kubelet's Summary API
//! through `nodes/proxy`, which [`KUBELET_STATS`] grants apart: `nodes/proxy` reaches the
//! whole kubelet API of every node, and the kubelet authorizes a WebSocket upgrade (exec into
//! any pod of the node) as a `get`, so no worker has it unless the operator asks. Without either source runs report no CPU or memory use. No
//! watch, no `pods/log`, no `pods/exec`.
//!
//! `examples/kubernetes/runtime-rbac.yaml` grants exactly [`NAMESPACED`] and [`CLUSTER`] (the
//! Role and ClusterRole `cl-worker-runs`), `runtime-rbac-kubelet-stats.yaml` exactly
//! [`KUBELET_STATS`] (the ClusterRole `cl-worker-runs-kubelet-stats`), checked by
//! `tests/examples/check-kubernetes.sh`; `terraform/kubernetes/rbac.tf` grants the same,
//! checked by `manager/tests/deploy.rs`.

/// One RBAC rule: `verbs` on `resource` of API group `group`.
#[derive(Debug, Clone, Copy)]
pub struct Permission {
    pub group: &'static str,
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
}

/// In the run pods' namespace (a Role).
#[rustfmt::skip]
pub const NAMESPACED: &[Permission] = &[
    Permission { group: "", resource: "pods", verbs: &["create", "delete", "get", "list"] },
    Permission { group: "metrics.k8s.io", resource: "pods", verbs: &["get"] },
];

/// Cluster-wide (a ClusterRole): the node and what runs on it.
#[rustfmt::skip]
pub const CLUSTER: &[Permission] = &[
    Permission { group: "", resource: "nodes", verbs: &["get"] },
    Permission { group: "", resource: "pods", verbs: &["list"] },
];

/// Cluster-wide, only with `--kubernetes-kubelet-stats` (a ClusterRole of its own): the
/// kubelet's Summary API of the worker's node, for clusters without metrics-server.
#[rustfmt::skip]
pub const KUBELET_STATS: &[Permission] = &[
    Permission { group: "", resource: "nodes/proxy", verbs: &["get"] },
];
