//! The Kubernetes runtime's whole use of the API, as RBAC rules.
//!
//! In the namespace of `--kubernetes-namespace` it creates, reads, lists (label-selected, after
//! a restart) and deletes its run pods, and reads its own pod (to mount its work dir's volume
//! in run pods). Cluster-wide it reads its node and lists the pods bound to that node (the
//! node's free resources for check-ins). Stats come from `metrics.k8s.io` pods, else from the
//! node's `nodes/proxy` (the kubelet's Summary API); without either, runs report no CPU or
//! memory use. No watch, no `pods/log`, no `pods/exec`. `examples/kubernetes/rbac.yaml` grants
//! exactly this (the Role and ClusterRole `cl-worker-runs`), checked by
//! `tests/examples/check-kubernetes.sh`.

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
    Permission { group: "", resource: "nodes/proxy", verbs: &["get"] },
    Permission { group: "", resource: "pods", verbs: &["list"] },
];
