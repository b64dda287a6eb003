# CodaLab workers as pods, and cl-worker-manager as a Deployment (manager_replicas, one leader
# under a Kubernetes Lease), in one namespace.
#
#   manager (Deployment, ServiceAccount cl-worker-manager) --creates--> worker pods
#     worker pods mount the claim <nfs_volume_name>-claim at shared_work_dir and the credentials
#     Secret read-only; with bundle_runtime = "kubernetes" they create one pod per bundle.
#
# The CodaLab password is only in the Secret (set out of band, or write-only); no pod spec, env
# or argument holds it.

locals {
  labels = merge(var.labels, { "app.kubernetes.io/part-of" = "codalab" })

  namespace = var.create_namespace ? kubernetes_namespace_v1.this[0].metadata[0].name : var.namespace

  manager_account = "cl-worker-manager"
  # The workers' account: with the docker runtime they never call the API (no Role, no token);
  # with the kubernetes runtime they create their runs' pods (runtime Role and ClusterRole).
  worker_account = var.bundle_runtime == "kubernetes" ? "cl-worker-runs" : "cl-worker"
  claim_name     = "${var.nfs_volume_name}-claim"

  # cl-worker-manager's command line: global flags, then `kubernetes` and its flags. Only flags
  # of cl-worker-manager (`cl-worker-manager kubernetes --help`; checked by a test).
  manager_global_args = concat(
    ["--server", var.codalab_server],
    length(var.search) > 0 ? concat(["--search"], var.search) : [],
    [
      "--min-workers", tostring(var.min_workers),
      "--max-workers", tostring(var.max_workers),
      "--worker-work-dir-prefix", var.shared_work_dir,
      "--worker-max-work-dir-size", var.worker_max_work_dir_size,
      "--worker-idle-seconds", tostring(var.worker_idle_seconds),
    ],
    var.worker_tag != null ? ["--worker-tag", var.worker_tag] : [],
    var.worker_tag_exclusive ? ["--worker-tag-exclusive"] : [],
    var.worker_run_as_user != "" ? ["--worker-run-as-user", var.worker_run_as_user] : [],
    ["--metrics-addr", "0.0.0.0:${var.metrics_port}"],
    # Always, with one replica too: a rollout (RollingUpdate) starts the new pod before the old
    # one stops, and the lease is what keeps the two from launching and deleting worker pods at
    # once. It costs one small Lease object and a write every 5 s.
    ["--lease", "kubernetes:${local.namespace}/${var.lease_name}"],
  )
  manager_backend_args = concat(
    [
      "kubernetes",
      "--bundle-runtime", var.bundle_runtime,
      "--namespace", local.namespace,
      "--manager-name", var.manager_name,
      "--password-file", "/etc/codalab/credentials",
      "--password-secret", kubernetes_secret_v1.credentials.metadata[0].name,
      "--worker-image", var.worker_image,
      "--service-account", local.worker_account,
      "--cpus", tostring(var.cpus),
      "--gpus", tostring(var.gpus),
      "--memory-mb", tostring(var.memory_mb),
      "--nfs-volume-name", var.nfs_volume_name,
    ],
    flatten([for k in sort(keys(var.node_selector)) : ["--node-selector", "${k}=${var.node_selector[k]}"]]),
    flatten([for t in var.tolerations : ["--toleration", t]]),
    local.kubelet_stats ? ["--worker-kubelet-stats"] : [],
  )
  manager_argv = concat(["cl-worker-manager"], local.manager_global_args, local.manager_backend_args)
  # The same as one shell line: arguments with characters outside a safe set are single-quoted.
  manager_command = join(" ", [
    for a in local.manager_argv :
    can(regex("^[A-Za-z0-9_./:=@%+,-]+$", a)) ? a : "'${replace(a, "'", "'\\''")}'"
  ])
}

resource "kubernetes_namespace_v1" "this" {
  count = var.create_namespace ? 1 : 0

  metadata {
    name   = var.namespace
    labels = local.labels
  }
}

# The credentials the manager and the workers read: keys `username` and `password`. The
# password is never in Terraform's configuration or state: it is written with kubectl
# (output set_password_command).
resource "kubernetes_secret_v1" "credentials" {
  metadata {
    name      = var.credentials_secret_name
    namespace = local.namespace
    labels    = local.labels
  }
  type = "Opaque"
  data = { username = var.codalab_username }

  lifecycle {
    # `kubectl create secret … --dry-run=client -o yaml | kubectl apply -f -` adds the
    # password after apply; Terraform must not take it away again.
    ignore_changes = [data]
  }
}
