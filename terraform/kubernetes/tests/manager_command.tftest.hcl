# The manager's command line, and what must hold around it, with a mock Kubernetes provider (no
# cluster, no network).

mock_provider "kubernetes" {}

variables {
  codalab_server = "https://worksheets.example.org"
}

run "manager_command" {
  command = apply

  assert {
    condition     = output.manager_command == "cl-worker-manager --server https://worksheets.example.org --min-workers 0 --max-workers 10 --worker-work-dir-prefix /var/lib/codalab --worker-max-work-dir-size 10g --worker-idle-seconds 600 --worker-run-as-user 65534:65534 --metrics-addr 0.0.0.0:9464 --lease kubernetes:codalab/cl-worker-manager kubernetes --bundle-runtime docker --namespace codalab --manager-name cl-worker-manager --password-file /etc/codalab/credentials --password-secret codalab-worker-credentials --worker-image codalab/worker:0.1.0 --service-account cl-worker --cpus 1 --gpus 0 --memory-mb 2048 --nfs-volume-name nfs"
    error_message = "unexpected manager command: ${output.manager_command}"
  }
  assert {
    condition     = jsonencode(concat(kubernetes_deployment_v1.manager.spec[0].template[0].spec[0].container[0].command, kubernetes_deployment_v1.manager.spec[0].template[0].spec[0].container[0].args)) == jsonencode(output.manager_argv)
    error_message = "the Deployment does not run the manager_command"
  }
  assert {
    condition     = kubernetes_deployment_v1.manager.spec[0].replicas == "2" && kubernetes_deployment_v1.manager.spec[0].strategy[0].type == "RollingUpdate"
    error_message = "by default two managers run (a holder and a standby), rolled one at a time"
  }
  assert {
    condition     = strcontains(output.manager_command, " --lease kubernetes:codalab/cl-worker-manager kubernetes ") && length([for a in output.manager_argv : a if a == "--lease"]) == 1
    error_message = "the managers must share the Lease cl-worker-manager of their namespace (--lease, a global flag, once)"
  }
  assert {
    condition     = kubernetes_deployment_v1.manager.spec[0].strategy[0].rolling_update[0].max_unavailable == "0" && kubernetes_deployment_v1.manager.spec[0].strategy[0].rolling_update[0].max_surge == "1"
    error_message = "a rollout starts a new manager before it stops an old one"
  }
  assert {
    condition     = length(kubernetes_pod_disruption_budget_v1.manager) == 1 && kubernetes_pod_disruption_budget_v1.manager[0].spec[0].max_unavailable == "1" && kubernetes_pod_disruption_budget_v1.manager[0].spec[0].selector[0].match_labels == tomap({ "app.kubernetes.io/name" = "cl-worker-manager" })
    error_message = "with two managers a drain evicts one at a time (PodDisruptionBudget)"
  }
  assert {
    condition     = kubernetes_persistent_volume_claim_v1.nfs.metadata[0].name == "nfs-claim" && length(kubernetes_persistent_volume_v1.nfs) == 0
    error_message = "without nfs_server the claim nfs-claim binds to the existing volume nfs"
  }
  assert {
    condition     = strcontains(output.manager_command, " --worker-run-as-user 65534:65534 ")
    error_message = "by default the workers run every bundle as nobody (--worker-run-as-user 65534:65534)"
  }
}

run "run_as_user_left_out" {
  command = apply

  variables {
    worker_run_as_user = ""
  }

  assert {
    condition     = !strcontains(output.manager_command, "--worker-run-as-user")
    error_message = "worker_run_as_user = \"\" must leave --worker-run-as-user out"
  }
}

run "run_as_user_never_root" {
  command = plan

  variables {
    worker_run_as_user = "1000:0"
  }

  expect_failures = [var.worker_run_as_user]
}

run "password_only_in_the_secret" {
  command = apply

  assert {
    condition     = length([for e in kubernetes_deployment_v1.manager.spec[0].template[0].spec[0].container[0].env : e if strcontains(upper(e.name), "PASSWORD")]) == 0
    error_message = "no password variable in the manager's environment"
  }
  assert {
    condition     = kubernetes_secret_v1.credentials.data == tomap({ username = "codalab" })
    error_message = "Terraform writes the username only; the password is set out of band"
  }
  assert {
    condition     = anytrue([for m in kubernetes_deployment_v1.manager.spec[0].template[0].spec[0].container[0].volume_mount : m.name == "credentials" && m.read_only && m.mount_path == "/etc/codalab/credentials"])
    error_message = "--password-file must be a read-only mount of the Secret"
  }
  assert {
    condition     = kubernetes_service_account_v1.worker.automount_service_account_token == false && length(kubernetes_role_v1.runtime) == 0 && length(kubernetes_cluster_role_v1.runtime) == 0
    error_message = "docker-runtime workers get no token and no role"
  }
}

run "manager_role_is_exactly_its_calls" {
  command = apply

  assert {
    condition = jsonencode([for r in kubernetes_role_v1.manager.rule : [r.api_groups, r.resources, r.verbs]]) == jsonencode([
      [[""], ["pods"], ["create", "delete", "list"]],
      [[""], ["secrets"], ["get"]],
      [[""], ["persistentvolumeclaims"], ["get"]],
      [["coordination.k8s.io"], ["leases"], ["create"]],
      [["coordination.k8s.io"], ["leases"], ["get", "update"]],
    ]) && jsonencode(kubernetes_role_v1.manager.rule[1].resource_names) == jsonencode(["codalab-worker-credentials"]) && jsonencode(kubernetes_role_v1.manager.rule[2].resource_names) == jsonencode(["nfs-claim"])
    error_message = "the manager's Role must grant exactly its calls"
  }
  # The create rule names nothing (RBAC cannot limit create by name): manager/tests/deploy.rs
  # checks the local, as resource_names is computed and the mock fills it in.
  assert {
    condition     = jsonencode(kubernetes_role_v1.manager.rule[4].resource_names) == jsonencode(["cl-worker-manager"])
    error_message = "the manager may get and update only its own Lease"
  }
}

run "one_manager_still_under_the_lease" {
  command = apply

  variables {
    manager_replicas = 1
    lease_name       = "codalab-gpu"
  }

  assert {
    condition     = kubernetes_deployment_v1.manager.spec[0].replicas == "1" && length(kubernetes_pod_disruption_budget_v1.manager) == 0
    error_message = "manager_replicas = 1: one replica, and no PodDisruptionBudget (it would block every drain)"
  }
  assert {
    condition     = strcontains(output.manager_command, " --lease kubernetes:codalab/codalab-gpu kubernetes ")
    error_message = "one manager keeps the lease: a rollout runs the new pod beside the old one"
  }
  assert {
    condition     = jsonencode(kubernetes_role_v1.manager.rule[4].resource_names) == jsonencode(["codalab-gpu"])
    error_message = "the Role may get and update the Lease lease_name only"
  }
}

run "no_manager" {
  command = plan

  variables {
    manager_replicas = 0
  }

  expect_failures = [var.manager_replicas]
}

run "bad_lease_name" {
  command = plan

  variables {
    lease_name = "Leader_Lease"
  }

  expect_failures = [var.lease_name]
}

run "gke_gpu_workers_with_the_kubernetes_runtime" {
  command = apply

  variables {
    bundle_runtime       = "kubernetes"
    cpus                 = 8
    gpus                 = 1
    memory_mb            = 30000
    max_workers          = 4
    node_selector        = { "cloud.google.com/gke-nodepool" = "gpu" }
    tolerations          = ["nvidia.com/gpu=present:NoSchedule"]
    create_nfs_volume    = true
    nfs_server           = "10.0.0.2"
    nfs_path             = "/codalab"
    search               = ["request_gpus>=1"]
    worker_tag           = "gpu pool"
    worker_tag_exclusive = true
    worker_image         = "europe-docker.pkg.dev/acme/codalab/worker:0.1.0"
  }

  assert {
    condition     = output.manager_command == "cl-worker-manager --server https://worksheets.example.org --search 'request_gpus>=1' --min-workers 0 --max-workers 4 --worker-work-dir-prefix /var/lib/codalab --worker-max-work-dir-size 10g --worker-idle-seconds 600 --worker-tag 'gpu pool' --worker-tag-exclusive --worker-run-as-user 65534:65534 --metrics-addr 0.0.0.0:9464 --lease kubernetes:codalab/cl-worker-manager kubernetes --bundle-runtime kubernetes --namespace codalab --manager-name cl-worker-manager --password-file /etc/codalab/credentials --password-secret codalab-worker-credentials --worker-image europe-docker.pkg.dev/acme/codalab/worker:0.1.0 --service-account cl-worker-runs --cpus 8 --gpus 1 --memory-mb 30000 --nfs-volume-name nfs --node-selector cloud.google.com/gke-nodepool=gpu --toleration nvidia.com/gpu=present:NoSchedule"
    error_message = "unexpected manager command: ${output.manager_command}"
  }
  assert {
    condition     = kubernetes_service_account_v1.worker.automount_service_account_token && length(kubernetes_role_v1.runtime) == 1 && length(kubernetes_cluster_role_binding_v1.runtime) == 1
    error_message = "kubernetes-runtime workers get a token, their Role and their ClusterRole"
  }
  assert {
    condition     = kubernetes_persistent_volume_v1.nfs[0].spec[0].persistent_volume_source[0].nfs[0].server == "10.0.0.2" && kubernetes_persistent_volume_claim_v1.nfs.spec[0].volume_name == "nfs"
    error_message = "with nfs_server the module creates the volume nfs and binds the claim to it"
  }
}

run "bad_toleration" {
  command = plan

  variables {
    tolerations = ["nvidia.com/gpu:Sometimes"]
  }

  expect_failures = [var.tolerations]
}

run "bad_runtime" {
  command = plan

  variables {
    bundle_runtime = "podman"
  }

  expect_failures = [var.bundle_runtime]
}

run "nfs_volume_needs_a_server" {
  command = plan

  variables {
    create_nfs_volume = true
  }

  expect_failures = [kubernetes_persistent_volume_v1.nfs]
}
