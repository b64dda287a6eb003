//! The manager's whole use of the Kubernetes API, as RBAC rules.
//!
//! Every call the kubernetes backend makes is listed in [`PERMISSIONS`], all in the one
//! namespace of `--namespace` and all in the core API group: it creates, lists (label-selected,
//! once per tick) and deletes its worker pods, and in its pre-flight check reads the credentials
//! Secret of `--password-secret` and the claim `<nfs-volume-name>-claim` of `--nfs-volume-name`.
//! No nodes, no events, no `pods/log`, no watch. The Role `cl-worker-manager` in
//! `examples/kubernetes/rbac.yaml` must grant exactly this table, with the example's names in
//! `resource_names`; `tests/examples/check-kubernetes.sh` checks it.

/// One RBAC rule of the manager: `verbs` on `resource` of the core API group (`""`), only on
/// the objects named in `resource_names` when it is not empty.
#[derive(Debug, Clone, Copy)]
pub struct Permission {
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    pub resource_names: &'static [&'static str],
}

/// The manager's whole use of the Kubernetes API; `examples/kubernetes/rbac.yaml` must grant
/// exactly this (checked by `tests/examples/check-kubernetes.sh`), and nothing else.
#[rustfmt::skip]
pub const PERMISSIONS: &[Permission] = &[
    Permission { resource: "pods", verbs: &["create", "delete", "list"], resource_names: &[] },
    Permission { resource: "secrets", verbs: &["get"], resource_names: &["codalab-worker-credentials"] },
    Permission { resource: "persistentvolumeclaims", verbs: &["get"], resource_names: &["nfs-claim"] },
];
