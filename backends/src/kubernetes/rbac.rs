//! The manager's whole use of the Kubernetes API, as RBAC rules.
//!
//! Every call the kubernetes backend makes is listed in [`PERMISSIONS`], all in the one
//! namespace of `--namespace` and all in the core API group: it creates, lists (label-selected,
//! once per tick) and deletes its worker pods, and in its pre-flight check reads the credentials
//! Secret of `--password-secret` and the claim `<nfs-volume-name>-claim` of `--nfs-volume-name`.
//! No nodes, no events, no `pods/log`, no watch.
//!
//! With `--lease kubernetes:[NAMESPACE/]NAME` the manager also keeps its lease in a
//! `coordination.k8s.io/v1` Lease of that namespace: [`LEASE_PERMISSIONS`]. It reads the Lease
//! by name, creates it when it does not exist, and replaces it (with the `resourceVersion` it
//! read) to take, renew or hand it back. RBAC cannot limit `create` by name, so `create` is
//! granted on every Lease of the namespace; `get` and `update` only on the lease's name.
//!
//! The Role `cl-worker-manager` in `examples/kubernetes/rbac.yaml` must grant exactly both
//! tables, with the example's names in `resource_names` (`tests/examples/check-kubernetes.sh`
//! checks it), and so must the locals `manager_rules` and `manager_lease_rules` of
//! `terraform/kubernetes/rbac.tf` (`manager/tests/deploy.rs`).

/// One RBAC rule of the manager: `verbs` on `resource` of the API group `api_group` (`""`: the
/// core group), only on the objects named in `resource_names` when it is not empty.
#[derive(Debug, Clone, Copy)]
pub struct Permission {
    pub api_group: &'static str,
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    pub resource_names: &'static [&'static str],
}

/// The kubernetes backend's whole use of the Kubernetes API; `examples/kubernetes/rbac.yaml`
/// must grant exactly this and [`LEASE_PERMISSIONS`] (checked by
/// `tests/examples/check-kubernetes.sh`), and nothing else.
#[rustfmt::skip]
pub const PERMISSIONS: &[Permission] = &[
    Permission { api_group: "", resource: "pods", verbs: &["create", "delete", "list"], resource_names: &[] },
    Permission { api_group: "", resource: "secrets", verbs: &["get"], resource_names: &["codalab-worker-credentials"] },
    Permission { api_group: "", resource: "persistentvolumeclaims", verbs: &["get"], resource_names: &["nfs-claim"] },
];

/// The name of the examples' Lease (`--lease kubernetes:codalab/cl-worker-manager`), in the
/// `resource_names` of [`LEASE_PERMISSIONS`].
pub const LEASE_NAME: &str = "cl-worker-manager";

/// The manager's calls for `--lease kubernetes:[NAMESPACE/]NAME`, in the lease's namespace:
/// `get` and `update` of the Lease by its name, and `create` (which RBAC cannot restrict to
/// a name) for the first manager, which finds none.
#[rustfmt::skip]
pub const LEASE_PERMISSIONS: &[Permission] = &[
    Permission { api_group: "coordination.k8s.io", resource: "leases", verbs: &["create"], resource_names: &[] },
    Permission { api_group: "coordination.k8s.io", resource: "leases", verbs: &["get", "update"], resource_names: &["cl-worker-manager"] },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_rules_name_the_examples_lease() {
        let named: Vec<_> = LEASE_PERMISSIONS
            .iter()
            .filter(|p| !p.resource_names.is_empty())
            .collect();
        assert_eq!(named.len(), 1);
        assert_eq!(named[0].resource_names, &[LEASE_NAME]);
        // `create` cannot be limited by name: a rule that tried would grant nothing.
        for p in LEASE_PERMISSIONS {
            assert!(
                p.verbs.contains(&"create") == p.resource_names.is_empty(),
                "{p:?}"
            );
        }
    }
}
