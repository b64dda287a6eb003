# Service accounts and RBAC: exactly the API calls of the manager (its backend's and its
# lease's) and of the workers' Kubernetes runtime, the same rules as
# examples/kubernetes/rbac.yaml, runtime-rbac.yaml and runtime-rbac-kubelet-stats.yaml (one
# source of truth: the tables in backends/src/kubernetes/rbac.rs and
# worker/src/runtime/kubernetes/rbac.rs; manager/tests/deploy.rs checks these locals against
# them).

locals {
  # `cl-worker-manager kubernetes`, in its namespace: its worker pods, and in its pre-flight
  # check the credentials Secret and the work-dir claim.
  manager_rules = [
    { api_groups = [""], resources = ["pods"], verbs = ["create", "delete", "list"], resource_names = [] },
    { api_groups = [""], resources = ["secrets"], verbs = ["get"], resource_names = [var.credentials_secret_name] },
    { api_groups = [""], resources = ["persistentvolumeclaims"], verbs = ["get"], resource_names = [local.claim_name] },
  ]
  # --lease kubernetes:NAMESPACE/NAME (main.tf): get and update of its Lease by name, and create
  # for the first manager, which finds none (RBAC cannot limit create to a name).
  manager_lease_rules = [
    { api_groups = ["coordination.k8s.io"], resources = ["leases"], verbs = ["create"], resource_names = [] },
    { api_groups = ["coordination.k8s.io"], resources = ["leases"], verbs = ["get", "update"], resource_names = [var.lease_name] },
  ]
  # `cl-worker --bundle-runtime kubernetes`, in the namespace: its run pods and its own pod,
  # and the runs' metrics.
  runtime_rules = [
    { api_groups = [""], resources = ["pods"], verbs = ["create", "delete", "get", "list"], resource_names = [] },
    { api_groups = ["metrics.k8s.io"], resources = ["pods"], verbs = ["get"], resource_names = [] },
  ]
  # ... and cluster-wide: its node's capacity and pods.
  runtime_cluster_rules = [
    { api_groups = [""], resources = ["nodes"], verbs = ["get"], resource_names = [] },
    { api_groups = [""], resources = ["pods"], verbs = ["list"], resource_names = [] },
  ]
  # Only with kubelet_stats, in a ClusterRole of its own: the kubelet's Summary API of the
  # worker's node (no metrics-server). nodes/proxy reaches the whole kubelet API of every node,
  # exec into its pods included: never granted by default.
  runtime_kubelet_stats_rules = [
    { api_groups = [""], resources = ["nodes/proxy"], verbs = ["get"], resource_names = [] },
  ]
  kubelet_stats = var.bundle_runtime == "kubernetes" && var.kubelet_stats
}

# The run pods' account: they name none, so they run as the namespace's `default`, with no
# token (the run pod spec says so too) and no role: nothing binds one to it.
resource "kubernetes_default_service_account_v1" "runs" {
  metadata {
    namespace = local.namespace
    labels    = local.labels
  }
  automount_service_account_token = false
}

resource "kubernetes_service_account_v1" "manager" {
  metadata {
    name      = local.manager_account
    namespace = local.namespace
    labels    = merge(local.labels, { "app.kubernetes.io/name" = "cl-worker-manager" })
  }
  # The manager calls the API with this account's token (in-cluster configuration).
  automount_service_account_token = true
}

resource "kubernetes_service_account_v1" "worker" {
  metadata {
    name      = local.worker_account
    namespace = local.namespace
    labels    = merge(local.labels, { "app.kubernetes.io/name" = "cl-worker" })
  }
  # Only workers that create run pods get a token.
  automount_service_account_token = var.bundle_runtime == "kubernetes"
}

resource "kubernetes_role_v1" "manager" {
  metadata {
    name      = local.manager_account
    namespace = local.namespace
    labels    = merge(local.labels, { "app.kubernetes.io/name" = "cl-worker-manager" })
  }

  dynamic "rule" {
    for_each = concat(local.manager_rules, local.manager_lease_rules)
    content {
      api_groups     = rule.value.api_groups
      resources      = rule.value.resources
      verbs          = rule.value.verbs
      resource_names = length(rule.value.resource_names) > 0 ? rule.value.resource_names : null
    }
  }
}

resource "kubernetes_role_binding_v1" "manager" {
  metadata {
    name      = local.manager_account
    namespace = local.namespace
    labels    = merge(local.labels, { "app.kubernetes.io/name" = "cl-worker-manager" })
  }
  role_ref {
    api_group = "rbac.authorization.k8s.io"
    kind      = "Role"
    name      = kubernetes_role_v1.manager.metadata[0].name
  }
  subject {
    kind      = "ServiceAccount"
    name      = kubernetes_service_account_v1.manager.metadata[0].name
    namespace = local.namespace
  }
}

resource "kubernetes_role_v1" "runtime" {
  count = var.bundle_runtime == "kubernetes" ? 1 : 0

  metadata {
    name      = local.worker_account
    namespace = local.namespace
    labels    = merge(local.labels, { "app.kubernetes.io/name" = "cl-worker" })
  }

  dynamic "rule" {
    for_each = local.runtime_rules
    content {
      api_groups = rule.value.api_groups
      resources  = rule.value.resources
      verbs      = rule.value.verbs
    }
  }
}

resource "kubernetes_role_binding_v1" "runtime" {
  count = var.bundle_runtime == "kubernetes" ? 1 : 0

  metadata {
    name      = local.worker_account
    namespace = local.namespace
    labels    = merge(local.labels, { "app.kubernetes.io/name" = "cl-worker" })
  }
  role_ref {
    api_group = "rbac.authorization.k8s.io"
    kind      = "Role"
    name      = kubernetes_role_v1.runtime[0].metadata[0].name
  }
  subject {
    kind      = "ServiceAccount"
    name      = kubernetes_service_account_v1.worker.metadata[0].name
    namespace = local.namespace
  }
}

resource "kubernetes_cluster_role_v1" "runtime" {
  count = var.bundle_runtime == "kubernetes" ? 1 : 0

  metadata {
    # Cluster-scoped: named after the namespace, so that two installations do not collide.
    name   = "${local.namespace}-${local.worker_account}"
    labels = merge(local.labels, { "app.kubernetes.io/name" = "cl-worker" })
  }

  dynamic "rule" {
    for_each = local.runtime_cluster_rules
    content {
      api_groups = rule.value.api_groups
      resources  = rule.value.resources
      verbs      = rule.value.verbs
    }
  }
}

resource "kubernetes_cluster_role_binding_v1" "runtime" {
  count = var.bundle_runtime == "kubernetes" ? 1 : 0

  metadata {
    name   = "${local.namespace}-${local.worker_account}"
    labels = merge(local.labels, { "app.kubernetes.io/name" = "cl-worker" })
  }
  role_ref {
    api_group = "rbac.authorization.k8s.io"
    kind      = "ClusterRole"
    name      = kubernetes_cluster_role_v1.runtime[0].metadata[0].name
  }
  subject {
    kind      = "ServiceAccount"
    name      = kubernetes_service_account_v1.worker.metadata[0].name
    namespace = local.namespace
  }
}

# --kubernetes-kubelet-stats (kubelet_stats = true): get on nodes/proxy, bound to the workers'
# account only.
resource "kubernetes_cluster_role_v1" "kubelet_stats" {
  count = local.kubelet_stats ? 1 : 0

  metadata {
    name   = "${local.namespace}-${local.worker_account}-kubelet-stats"
    labels = merge(local.labels, { "app.kubernetes.io/name" = "cl-worker" })
  }

  dynamic "rule" {
    for_each = local.runtime_kubelet_stats_rules
    content {
      api_groups = rule.value.api_groups
      resources  = rule.value.resources
      verbs      = rule.value.verbs
    }
  }
}

resource "kubernetes_cluster_role_binding_v1" "kubelet_stats" {
  count = local.kubelet_stats ? 1 : 0

  metadata {
    name   = "${local.namespace}-${local.worker_account}-kubelet-stats"
    labels = merge(local.labels, { "app.kubernetes.io/name" = "cl-worker" })
  }
  role_ref {
    api_group = "rbac.authorization.k8s.io"
    kind      = "ClusterRole"
    name      = kubernetes_cluster_role_v1.kubelet_stats[0].metadata[0].name
  }
  subject {
    kind      = "ServiceAccount"
    name      = kubernetes_service_account_v1.worker.metadata[0].name
    namespace = local.namespace
  }
}
