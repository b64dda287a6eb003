# cl-worker-manager: manager_replicas managers with one --manager-name, under the Kubernetes
# Lease lease_name (--lease, main.tf): only its holder observes, launches and deletes worker
# pods; the others stand by and take over once it has gone unrenewed for 15 s, and a holder
# that gets SIGTERM hands the lease back first. Without the lease two managers with one
# --manager-name would count and delete each other's worker pods; under it they may overlap,
# so the Deployment rolls (RollingUpdate, one pod at a time, a new one ready before an old one
# stops), spreads its pods over nodes where it can, and keeps one through voluntary
# disruptions (PodDisruptionBudget). As the non-root user of its image, with a read-only root
# file system and the credentials Secret mounted read-only.

locals {
  manager_labels = merge(local.labels, { "app.kubernetes.io/name" = "cl-worker-manager" })
}

resource "kubernetes_deployment_v1" "manager" {
  #checkov:skip=CKV_K8S_14:manager_image's validation refuses latest and untagged names; the scanner does not read it when the image is a variable without default (the gke module).
  #checkov:skip=CKV_K8S_43:The image is the operator's own build of docker/Dockerfile; manager_image takes a digest, and its validation refuses latest and untagged names (CKV_K8S_14).
  metadata {
    name      = "cl-worker-manager"
    namespace = local.namespace
    labels    = local.manager_labels
  }

  spec {
    replicas = var.manager_replicas
    strategy {
      type = "RollingUpdate"
      rolling_update {
        max_surge       = 1
        max_unavailable = 0
      }
    }
    selector {
      match_labels = { "app.kubernetes.io/name" = "cl-worker-manager" }
    }

    template {
      metadata {
        # Not the worker pods' labels: the manager lists its workers by those.
        labels = local.manager_labels
      }

      spec {
        service_account_name            = kubernetes_service_account_v1.manager.metadata[0].name
        automount_service_account_token = true
        # SIGTERM: the manager finishes its tick, hands the lease back and exits.
        termination_grace_period_seconds = 60

        # The standbys on other nodes than the holder, where there are some: a lost node then
        # costs one lease period, not a reschedule.
        affinity {
          pod_anti_affinity {
            preferred_during_scheduling_ignored_during_execution {
              weight = 100
              pod_affinity_term {
                topology_key = "kubernetes.io/hostname"
                label_selector {
                  match_labels = { "app.kubernetes.io/name" = "cl-worker-manager" }
                }
              }
            }
          }
        }

        security_context {
          run_as_non_root = true
          run_as_user     = 65532
          run_as_group    = 65532
          # The Secret's files get this group and group read, which lets the non-root manager
          # read them.
          fs_group = 65532
          seccomp_profile {
            type = "RuntimeDefault"
          }
        }

        container {
          name              = "manager"
          image             = var.manager_image
          image_pull_policy = "Always"
          command           = [local.manager_argv[0]]
          args              = slice(local.manager_argv, 1, length(local.manager_argv))

          # No credentials in the environment: they come from the mounted Secret.
          env {
            name  = "RUST_LOG"
            value = "info"
          }

          port {
            name           = "metrics"
            container_port = var.metrics_port
            protocol       = "TCP"
          }

          liveness_probe {
            http_get {
              path = "/healthz"
              port = "metrics"
            }
            initial_delay_seconds = 10
            period_seconds        = 20
            timeout_seconds       = 5
            failure_threshold     = 3
          }
          readiness_probe {
            http_get {
              path = "/healthz"
              port = "metrics"
            }
            period_seconds  = 10
            timeout_seconds = 5
          }

          resources {
            requests = { cpu = "100m", memory = "128Mi" }
            limits   = { cpu = "500m", memory = "256Mi" }
          }

          security_context {
            run_as_non_root            = true
            run_as_user                = 65532
            allow_privilege_escalation = false
            privileged                 = false
            read_only_root_filesystem  = true
            capabilities {
              drop = ["ALL"]
            }
            seccomp_profile {
              type = "RuntimeDefault"
            }
          }

          # --password-file /etc/codalab/credentials: the files `username` and `password`.
          volume_mount {
            name       = "credentials"
            mount_path = "/etc/codalab/credentials"
            read_only  = true
          }
          volume_mount {
            name       = "tmp"
            mount_path = "/tmp"
          }
        }

        volume {
          name = "credentials"
          secret {
            secret_name  = kubernetes_secret_v1.credentials.metadata[0].name
            default_mode = "0400"
          }
        }
        # Scratch space: the root file system is read-only.
        volume {
          name = "tmp"
          empty_dir {
            size_limit = "64Mi"
          }
        }
      }
    }
  }

  # The manager checks the claim before its first tick.
  depends_on = [
    kubernetes_role_binding_v1.manager,
    kubernetes_persistent_volume_claim_v1.nfs,
  ]
}

# With several managers, a node drain or a cluster upgrade evicts them one at a time: a standby
# stays to take the lease over.
resource "kubernetes_pod_disruption_budget_v1" "manager" {
  count = var.manager_replicas > 1 ? 1 : 0

  metadata {
    name      = "cl-worker-manager"
    namespace = local.namespace
    labels    = local.manager_labels
  }
  spec {
    max_unavailable = "1"
    selector {
      match_labels = { "app.kubernetes.io/name" = "cl-worker-manager" }
    }
  }
}
