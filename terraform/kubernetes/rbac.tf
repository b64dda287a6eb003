# Service accounts and RBAC: exactly the API calls of the manager and of the workers' Kubernetes
# runtime, the same rules as examples/kubernetes/rbac.yaml and runtime-rbac.yaml (one source of
# truth: the tables in backends/src/kubernetes/rbac.rs and worker/src/runtime/kubernetes/rbac.rs;
# manager/tests/deploy.rs checks these locals against them).

locals {
  # `cl-worker-manager kubernetes`, in its namespace: its worker pods, and in its pre-flight
  # check the credentials Secret and the work-dir claim.
  manager_rules = [
    { api_groups = [""], resources = ["pods"], verbs = ["create", "delete", "list"], resource_names = [] },
    { api_groups = [""], resources = ["secrets"], verbs = ["get"], resource_names = [var.credentials_secret_name] },
    { api_groups = [""], resources = ["persistentvolumeclaims"], verbs = ["get"], resource_names = [local.claim_name] },
  ]
  # `cl-worker --bundle-runtime kubernetes`, in the namespace: its run pods and its own pod,
  # and the runs' metrics.
  runtime_rules = [
    { api_groups = [""], resources = ["pods"], verbs = ["create", "delete", "get", "list"], resource_names = [] },
    { api_groups = ["metrics.k8s.io"], resources = ["pods"], verbs = ["get"], resource_names = [] },
  ]
  # ... and cluster-wide: its node's capacity and pods, and the kubelet's stats.
  runtime_cluster_rules = [
    { api_groups = [""], resources = ["nodes"], verbs = ["get"], resource_names = [] },
    { api_groups = [""], resources = ["nodes/proxy"], verbs = ["get"], resource_names = [] },
    { api_groups = [""], resources = ["pods"], verbs = ["list"], resource_names = [] },
  ]
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
    for_each = local.manager_rules
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
