# NetworkPolicies: every pod of the namespace is denied all ingress and egress (default-deny),
# then each kind of pod gets only what it needs. The same policies as
# examples/kubernetes/networkpolicy.yaml. They are enforced only where the cluster's network
# plugin enforces NetworkPolicy (GKE Dataplane V2, Calico, Cilium, ...); elsewhere they are
# accepted and ignored.
#
#   manager      DNS; the CodaLab server; the API server. Ingress: the metrics port, from the
#                monitoring namespace only.
#   workers      DNS; the CodaLab server; with bundle_runtime = "kubernetes" the API server and
#                their run pods (netcat), with "docker" the node's Docker networks (netcat).
#   run pods     (untrusted code) ingress only from the workers (netcat); egress only DNS and
#                the public internet for runs that asked for network, nothing at all for the
#                others. Never the cloud's metadata server (169.254.169.254), Azure's
#                168.63.129.16, private ranges (the NFS server, the nodes, the kubelets, the
#                manager, other pods and Services) or the API server.
#
# Pods are selected by the labels the code sets: worker pods `app.kubernetes.io/managed-by =
# cl-worker-manager` (backends/src/kubernetes/pod.rs), run pods `app.kubernetes.io/managed-by
# = cl-worker` and `codalab.org/network = true|false` (worker/src/runtime/kubernetes/pod.rs),
# the manager `app.kubernetes.io/name = cl-worker-manager` (manager.tf);
# manager/tests/deploy.rs checks them against the code.

locals {
  # The IPv4 internet: everything but these (IPv6 is not allowed at all). "This network",
  # private (RFC 1918: nodes, pods, Services, the NFS server, VPC endpoints), shared address
  # space (RFC 6598: carrier NAT, some clusters' pod ranges), loopback, link-local (the
  # metadata servers of GCP, AWS and Azure at 169.254.169.254, GKE's at 169.254.169.252),
  # Azure's platform address 168.63.129.16 (DHCP, DNS, health probes), multicast and reserved.
  internet_except = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "168.63.129.16/32",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
  ]
  # Where the manager and the workers reach the CodaLab server: the internet above unless
  # codalab_server_cidrs names the server's addresses.
  codalab_server_blocks = var.codalab_server_cidrs == null ? [{ cidr = "0.0.0.0/0", except = local.internet_except }] : [for c in var.codalab_server_cidrs : { cidr = c, except = [] }]

  manager_pod_labels = { "app.kubernetes.io/name" = "cl-worker-manager" }
  worker_pod_labels  = { "app.kubernetes.io/managed-by" = "cl-worker-manager" }
  run_pod_labels     = { "app.kubernetes.io/managed-by" = "cl-worker" }
  # Runs that asked for network (`codalab.org/network = "false"` on the others).
  networked_run_pod_labels = merge(local.run_pod_labels, { "codalab.org/network" = "true" })

  dns_namespace_labels = { "kubernetes.io/metadata.name" = "kube-system" }
  dns_pod_labels       = { "k8s-app" = "kube-dns" }
  dns_ports = [
    { port = "53", protocol = "UDP" },
    { port = "53", protocol = "TCP" },
  ]
  api_server_ports = [for p in var.api_server_ports : { port = tostring(p), protocol = "TCP" }]
}

# Nothing in, nothing out, for every pod of the namespace; the policies below add to it.
resource "kubernetes_network_policy_v1" "default_deny" {
  metadata {
    name      = "default-deny"
    namespace = local.namespace
    labels    = local.labels
  }
  spec {
    pod_selector {}
    policy_types = ["Ingress", "Egress"]
  }
}

resource "kubernetes_network_policy_v1" "manager" {
  metadata {
    name      = "cl-worker-manager"
    namespace = local.namespace
    labels    = local.manager_labels
  }
  spec {
    pod_selector {
      match_labels = local.manager_pod_labels
    }
    policy_types = ["Ingress", "Egress"]

    # /metrics, /status, /healthz: Prometheus in the monitoring namespace. The kubelet's probes
    # come from the node, which NetworkPolicy does not filter.
    dynamic "ingress" {
      for_each = var.monitoring_namespace == null ? [] : [var.monitoring_namespace]
      content {
        from {
          namespace_selector {
            match_labels = { "kubernetes.io/metadata.name" = ingress.value }
          }
        }
        ports {
          port     = tostring(var.metrics_port)
          protocol = "TCP"
        }
      }
    }

    egress {
      to {
        namespace_selector {
          match_labels = local.dns_namespace_labels
        }
        pod_selector {
          match_labels = local.dns_pod_labels
        }
      }
      dynamic "ports" {
        for_each = local.dns_ports
        content {
          port     = ports.value.port
          protocol = ports.value.protocol
        }
      }
    }
    egress {
      dynamic "to" {
        for_each = local.codalab_server_blocks
        content {
          ip_block {
            cidr   = to.value.cidr
            except = to.value.except
          }
        }
      }
    }
    egress {
      dynamic "to" {
        for_each = var.api_server_cidrs
        content {
          ip_block {
            cidr = to.value
          }
        }
      }
      dynamic "ports" {
        for_each = local.api_server_ports
        content {
          port     = ports.value.port
          protocol = ports.value.protocol
        }
      }
    }
  }
}

resource "kubernetes_network_policy_v1" "workers" {
  metadata {
    name      = "cl-worker"
    namespace = local.namespace
    labels    = merge(local.labels, { "app.kubernetes.io/name" = "cl-worker" })
  }
  spec {
    pod_selector {
      match_labels = local.worker_pod_labels
    }
    # No ingress: nothing connects to a worker.
    policy_types = ["Ingress", "Egress"]

    egress {
      to {
        namespace_selector {
          match_labels = local.dns_namespace_labels
        }
        pod_selector {
          match_labels = local.dns_pod_labels
        }
      }
      dynamic "ports" {
        for_each = local.dns_ports
        content {
          port     = ports.value.port
          protocol = ports.value.protocol
        }
      }
    }
    egress {
      dynamic "to" {
        for_each = local.codalab_server_blocks
        content {
          ip_block {
            cidr   = to.value.cidr
            except = to.value.except
          }
        }
      }
    }
    # The Kubernetes runtime: the API server (run pods, the node's capacity, metrics), and its
    # run pods' ports (netcat).
    dynamic "egress" {
      for_each = var.bundle_runtime == "kubernetes" ? ["api"] : []
      content {
        dynamic "to" {
          for_each = var.api_server_cidrs
          content {
            ip_block {
              cidr = to.value
            }
          }
        }
        dynamic "ports" {
          for_each = local.api_server_ports
          content {
            port     = ports.value.port
            protocol = ports.value.protocol
          }
        }
      }
    }
    dynamic "egress" {
      for_each = var.bundle_runtime == "kubernetes" ? ["runs"] : []
      content {
        to {
          pod_selector {
            match_labels = local.run_pod_labels
          }
        }
      }
    }
    # The Docker runtime: its runs' containers on the node's Docker networks (netcat).
    dynamic "egress" {
      for_each = var.bundle_runtime == "docker" && length(var.docker_network_cidrs) > 0 ? ["docker"] : []
      content {
        dynamic "to" {
          for_each = var.docker_network_cidrs
          content {
            ip_block {
              cidr = to.value
            }
          }
        }
      }
    }
  }
}

# Every run pod: ingress only from the workers (netcat reaches a port of a run); no egress here.
resource "kubernetes_network_policy_v1" "runs" {
  metadata {
    name      = "codalab-runs"
    namespace = local.namespace
    labels    = local.labels
  }
  spec {
    pod_selector {
      match_labels = local.run_pod_labels
    }
    policy_types = ["Ingress"]

    ingress {
      from {
        pod_selector {
          match_labels = local.worker_pod_labels
        }
      }
    }
  }
}

# Runs that asked for network: DNS and the public internet, nothing private, no metadata server.
resource "kubernetes_network_policy_v1" "networked_runs" {
  metadata {
    name      = "codalab-runs-network"
    namespace = local.namespace
    labels    = local.labels
  }
  spec {
    pod_selector {
      match_labels = local.networked_run_pod_labels
    }
    policy_types = ["Egress"]

    egress {
      to {
        namespace_selector {
          match_labels = local.dns_namespace_labels
        }
        pod_selector {
          match_labels = local.dns_pod_labels
        }
      }
      dynamic "ports" {
        for_each = local.dns_ports
        content {
          port     = ports.value.port
          protocol = ports.value.protocol
        }
      }
    }
    egress {
      to {
        ip_block {
          cidr   = "0.0.0.0/0"
          except = local.internet_except
        }
      }
    }
  }
}
