# What an untrusted run can reach, and what the installation's accounts may do, on the planned
# objects (mock Kubernetes provider: no cluster). A policy "selects" a pod when its pod
# selector's match_labels are all on the pod (match_expressions, which could only narrow it,
# are ignored: the checks err on the side of "selected"). The pods are labelled as the code
# labels them: run pods in worker/src/runtime/kubernetes/pod.rs, worker pods in
# backends/src/kubernetes/pod.rs, the manager in manager.tf.

mock_provider "kubernetes" {}

variables {
  codalab_server = "https://worksheets.example.org"

  # The pods' labels, as created.
  run_offline = {
    "app.kubernetes.io/managed-by" = "cl-worker"
    "codalab.org/worker-id"        = "w1"
    "codalab.org/bundle-uuid"      = "0x1"
    "codalab.org/network"          = "false"
  }
  run_online = {
    "app.kubernetes.io/managed-by" = "cl-worker"
    "codalab.org/worker-id"        = "w1"
    "codalab.org/bundle-uuid"      = "0x2"
    "codalab.org/network"          = "true"
  }
  worker_pod = {
    "app"                          = "cl-worker"
    "app.kubernetes.io/name"       = "cl-worker"
    "app.kubernetes.io/managed-by" = "cl-worker-manager"
    "codalab.org/manager"          = "cl-worker-manager"
    "codalab.org/shape"            = "default"
    "codalab.org/worker-id"        = "w1"
  }
  manager_pod = {
    "app.kubernetes.io/name"    = "cl-worker-manager"
    "app.kubernetes.io/part-of" = "codalab"
  }
  private_ranges = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "127.0.0.0/8"]
}

run "default_deny" {
  command = apply

  assert {
    condition     = try(length(kubernetes_network_policy_v1.default_deny.spec[0].pod_selector[0].match_labels), 0) == 0 && length(kubernetes_network_policy_v1.default_deny.spec[0].pod_selector[0].match_expressions) == 0 && toset(kubernetes_network_policy_v1.default_deny.spec[0].policy_types) == toset(["Ingress", "Egress"]) && length(kubernetes_network_policy_v1.default_deny.spec[0].ingress) == 0 && length(kubernetes_network_policy_v1.default_deny.spec[0].egress) == 0
    error_message = "the namespace needs a default-deny policy: every pod, ingress and egress, no rule"
  }
  assert {
    condition = alltrue([
      for p in [kubernetes_network_policy_v1.default_deny, kubernetes_network_policy_v1.manager, kubernetes_network_policy_v1.workers, kubernetes_network_policy_v1.runs, kubernetes_network_policy_v1.networked_runs] :
      p.metadata[0].namespace == "codalab"
    ])
    error_message = "every NetworkPolicy must be in the installation's namespace"
  }
}

run "runs_without_network_reach_nothing" {
  command = apply

  assert {
    condition = alltrue([
      for p in [kubernetes_network_policy_v1.default_deny, kubernetes_network_policy_v1.manager, kubernetes_network_policy_v1.workers, kubernetes_network_policy_v1.runs, kubernetes_network_policy_v1.networked_runs] :
      length(p.spec[0].egress) == 0 if alltrue([for k, v in try(coalesce(p.spec[0].pod_selector[0].match_labels), {}) : lookup(var.run_offline, k, null) == v])
    ])
    error_message = "run pods without network must have no egress at all"
  }
}

run "runs_with_network_reach_only_dns_and_the_internet" {
  command = apply

  assert {
    condition = alltrue(flatten([
      for p in [kubernetes_network_policy_v1.default_deny, kubernetes_network_policy_v1.manager, kubernetes_network_policy_v1.workers, kubernetes_network_policy_v1.runs, kubernetes_network_policy_v1.networked_runs] : [
        for e in p.spec[0].egress : length(e.to) > 0
      ] if alltrue([for k, v in try(coalesce(p.spec[0].pod_selector[0].match_labels), {}) : lookup(var.run_online, k, null) == v])
    ]))
    error_message = "run pods must not have an allow-all egress rule"
  }
  assert {
    condition = alltrue(flatten([
      for p in [kubernetes_network_policy_v1.default_deny, kubernetes_network_policy_v1.manager, kubernetes_network_policy_v1.workers, kubernetes_network_policy_v1.runs, kubernetes_network_policy_v1.networked_runs] : [
        for e in p.spec[0].egress : [
          for t in e.to : [
            for b in t.ip_block : contains(b.except, "169.254.0.0/16") && contains(b.except, "168.63.129.16/32") && !startswith(b.cidr, "169.254.") && !startswith(b.cidr, "168.63.129.")
          ]
        ]
      ] if alltrue([for k, v in try(coalesce(p.spec[0].pod_selector[0].match_labels), {}) : lookup(var.run_online, k, null) == v])
    ]))
    error_message = "run pods must not reach the metadata address"
  }
  assert {
    condition = alltrue(flatten([
      for p in [kubernetes_network_policy_v1.default_deny, kubernetes_network_policy_v1.manager, kubernetes_network_policy_v1.workers, kubernetes_network_policy_v1.runs, kubernetes_network_policy_v1.networked_runs] : [
        for e in p.spec[0].egress : [
          for t in e.to : [
            for b in t.ip_block : b.cidr == "0.0.0.0/0" && length(setsubtract(var.private_ranges, b.except)) == 0
          ]
        ]
      ] if alltrue([for k, v in try(coalesce(p.spec[0].pod_selector[0].match_labels), {}) : lookup(var.run_online, k, null) == v])
    ]))
    error_message = "run pods must not reach private addresses: the NFS server, the nodes, the manager"
  }
  assert {
    condition = alltrue(flatten([
      for p in [kubernetes_network_policy_v1.default_deny, kubernetes_network_policy_v1.manager, kubernetes_network_policy_v1.workers, kubernetes_network_policy_v1.runs, kubernetes_network_policy_v1.networked_runs] : [
        for e in p.spec[0].egress : [
          for t in e.to : length(t.ip_block) > 0 || (
            jsonencode(try(t.namespace_selector[0].match_labels, null)) == jsonencode({ "kubernetes.io/metadata.name" = "kube-system" }) &&
            jsonencode(try(t.pod_selector[0].match_labels, null)) == jsonencode({ "k8s-app" = "kube-dns" }) &&
            length(e.ports) > 0 && alltrue([for q in e.ports : q.port == "53"])
          )
        ]
      ] if alltrue([for k, v in try(coalesce(p.spec[0].pod_selector[0].match_labels), {}) : lookup(var.run_online, k, null) == v])
    ]))
    error_message = "inside the cluster run pods reach only DNS, port 53 of kube-dns"
  }
  assert {
    condition     = length(kubernetes_network_policy_v1.networked_runs.spec[0].egress) == 2 && jsonencode(kubernetes_network_policy_v1.networked_runs.spec[0].pod_selector[0].match_labels) == jsonencode({ "app.kubernetes.io/managed-by" = "cl-worker", "codalab.org/network" = "true" })
    error_message = "runs that asked for network get DNS and the internet"
  }
}

run "runs_accept_connections_only_from_the_workers" {
  command = apply

  assert {
    condition = alltrue(flatten([
      for p in [kubernetes_network_policy_v1.default_deny, kubernetes_network_policy_v1.manager, kubernetes_network_policy_v1.workers, kubernetes_network_policy_v1.runs, kubernetes_network_policy_v1.networked_runs] : [
        for i in p.spec[0].ingress : length(i.from) > 0 && alltrue([
          for f in i.from : length(f.ip_block) == 0 && length(f.namespace_selector) == 0 && jsonencode(try(f.pod_selector[0].match_labels, null)) == jsonencode({ "app.kubernetes.io/managed-by" = "cl-worker-manager" })
        ])
      ] if alltrue([for k, v in try(coalesce(p.spec[0].pod_selector[0].match_labels), {}) : lookup(var.run_online, k, null) == v]) || alltrue([for k, v in try(coalesce(p.spec[0].pod_selector[0].match_labels), {}) : lookup(var.run_offline, k, null) == v])
    ]))
    error_message = "run pods accept connections only from the worker pods"
  }
}

run "the_metrics_port_only_from_monitoring" {
  command = apply

  assert {
    condition = alltrue(flatten([
      for p in [kubernetes_network_policy_v1.default_deny, kubernetes_network_policy_v1.manager, kubernetes_network_policy_v1.workers, kubernetes_network_policy_v1.runs, kubernetes_network_policy_v1.networked_runs] : [
        for i in p.spec[0].ingress : length(i.from) > 0 && alltrue([
          for f in i.from : length(f.ip_block) == 0 && length(f.pod_selector) == 0 && jsonencode(try(f.namespace_selector[0].match_labels, null)) == jsonencode({ "kubernetes.io/metadata.name" = "monitoring" })
        ]) && jsonencode([for q in i.ports : [q.port, q.protocol]]) == jsonencode([["9464", "TCP"]])
      ] if alltrue([for k, v in try(coalesce(p.spec[0].pod_selector[0].match_labels), {}) : lookup(var.manager_pod, k, null) == v])
    ]))
    error_message = "the metrics port is open only to the monitoring namespace"
  }
  assert {
    condition     = length(kubernetes_network_policy_v1.manager.spec[0].ingress) == 1
    error_message = "the manager's metrics port must be reachable from the monitoring namespace"
  }
}

run "no_monitoring_namespace_no_ingress" {
  command = apply

  variables {
    monitoring_namespace = null
  }

  assert {
    condition     = length(kubernetes_network_policy_v1.manager.spec[0].ingress) == 0
    error_message = "without monitoring_namespace nothing may reach the manager"
  }
}

run "docker_workers_do_not_reach_the_api_server" {
  command = apply

  assert {
    condition = alltrue(flatten([
      for p in [kubernetes_network_policy_v1.default_deny, kubernetes_network_policy_v1.manager, kubernetes_network_policy_v1.workers, kubernetes_network_policy_v1.runs, kubernetes_network_policy_v1.networked_runs] : [
        for e in p.spec[0].egress : !anytrue([for q in e.ports : contains(["443", "6443"], q.port)]) && alltrue([
          for t in e.to : length(t.pod_selector) == 0 || length(t.namespace_selector) > 0
        ])
      ] if alltrue([for k, v in try(coalesce(p.spec[0].pod_selector[0].match_labels), {}) : lookup(var.worker_pod, k, null) == v])
    ]))
    error_message = "docker-runtime workers get no rule for the API server or for other pods"
  }
  assert {
    condition = anytrue([
      for e in kubernetes_network_policy_v1.manager.spec[0].egress :
      toset([for t in e.to : t.ip_block[0].cidr if length(t.ip_block) > 0]) == toset(["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"]) && toset([for q in e.ports : q.port]) == toset(["443", "6443"])
    ])
    error_message = "the manager must reach the API server on its ports"
  }
}

run "kubernetes_workers_reach_the_api_server_and_their_runs" {
  command = apply

  variables {
    bundle_runtime   = "kubernetes"
    api_server_cidrs = ["172.16.0.0/28"]
  }

  assert {
    condition = anytrue([
      for e in kubernetes_network_policy_v1.workers.spec[0].egress :
      jsonencode([for t in e.to : t.ip_block[0].cidr if length(t.ip_block) > 0]) == jsonencode(["172.16.0.0/28"]) && toset([for q in e.ports : q.port]) == toset(["443", "6443"])
    ])
    error_message = "kubernetes-runtime workers must reach the API server on its ports"
  }
  assert {
    condition = anytrue([
      for e in kubernetes_network_policy_v1.workers.spec[0].egress :
      length(e.to) == 1 && jsonencode(try(e.to[0].pod_selector[0].match_labels, null)) == jsonencode({ "app.kubernetes.io/managed-by" = "cl-worker" }) && length(e.to[0].namespace_selector) == 0
    ])
    error_message = "kubernetes-runtime workers must reach their run pods (netcat)"
  }
}

run "codalab_server_on_a_private_address" {
  command = apply

  variables {
    codalab_server_cidrs = ["10.0.5.20/32"]
  }

  assert {
    condition = alltrue([
      for p in [kubernetes_network_policy_v1.manager, kubernetes_network_policy_v1.workers] :
      anytrue([for e in p.spec[0].egress : jsonencode([for t in e.to : t.ip_block[0] if length(t.ip_block) > 0]) == jsonencode([{ cidr = "10.0.5.20/32", except = [] }])])
    ])
    error_message = "the manager and the workers must reach the CodaLab server at codalab_server_cidrs"
  }
  assert {
    condition     = contains(kubernetes_network_policy_v1.networked_runs.spec[0].egress[1].to[0].ip_block[0].except, "10.0.0.0/8")
    error_message = "the CodaLab server's private address must not open private ranges to run pods"
  }
}

run "codalab_server_cidrs_never_hold_the_metadata_address" {
  command = plan

  variables {
    codalab_server_cidrs = ["0.0.0.0/0"]
  }

  expect_failures = [var.codalab_server_cidrs]
}

run "api_server_cidrs_never_hold_the_metadata_address" {
  command = plan

  variables {
    api_server_cidrs = ["169.254.0.0/16"]
  }

  expect_failures = [var.api_server_cidrs]
}

run "nodes_proxy_not_by_default" {
  command = apply

  variables {
    bundle_runtime = "kubernetes"
  }

  assert {
    condition     = !anytrue([for r in kubernetes_cluster_role_v1.runtime[0].rule : anytrue([for x in r.resources : x == "nodes/proxy" || x == "*" || startswith(x, "nodes/")])]) && !anytrue([for r in kubernetes_role_v1.runtime[0].rule : anytrue([for x in r.resources : x == "nodes/proxy" || x == "*"])]) && length(kubernetes_cluster_role_v1.kubelet_stats) == 0 && length(kubernetes_cluster_role_binding_v1.kubelet_stats) == 0
    error_message = "nodes/proxy must not be granted by default"
  }
  assert {
    condition     = !strcontains(output.manager_command, "kubelet-stats")
    error_message = "the workers must not be told to read the kubelet by default"
  }
}

run "nodes_proxy_when_asked" {
  command = apply

  variables {
    bundle_runtime = "kubernetes"
    kubelet_stats  = true
  }

  assert {
    condition     = jsonencode([for r in kubernetes_cluster_role_v1.kubelet_stats[0].rule : [r.api_groups, r.resources, r.verbs]]) == jsonencode([[[""], ["nodes/proxy"], ["get"]]]) && !anytrue([for r in kubernetes_cluster_role_v1.runtime[0].rule : contains(r.resources, "nodes/proxy")])
    error_message = "kubelet_stats grants exactly get on nodes/proxy, in a ClusterRole of its own"
  }
  assert {
    condition     = jsonencode([for s in kubernetes_cluster_role_binding_v1.kubelet_stats[0].subject : [s.kind, s.name, s.namespace]]) == jsonencode([["ServiceAccount", "cl-worker-runs", "codalab"]]) && kubernetes_cluster_role_binding_v1.kubelet_stats[0].role_ref[0].name == kubernetes_cluster_role_v1.kubelet_stats[0].metadata[0].name
    error_message = "nodes/proxy is bound to the workers' account only"
  }
  assert {
    condition     = output.manager_command == "cl-worker-manager --server https://worksheets.example.org --min-workers 0 --max-workers 10 --worker-work-dir-prefix /var/lib/codalab --worker-max-work-dir-size 10g --worker-idle-seconds 600 --worker-run-as-user 65534:65534 --metrics-addr 0.0.0.0:9464 --lease kubernetes:codalab/cl-worker-manager kubernetes --bundle-runtime kubernetes --namespace codalab --manager-name cl-worker-manager --password-file /etc/codalab/credentials --password-secret codalab-worker-credentials --worker-image codalab/worker:0.1.0 --service-account cl-worker-runs --cpus 1 --gpus 0 --memory-mb 2048 --nfs-volume-name nfs --worker-kubelet-stats"
    error_message = "unexpected manager command: ${output.manager_command}"
  }
}

run "kubelet_stats_needs_the_kubernetes_runtime" {
  command = apply

  variables {
    kubelet_stats = true
  }

  assert {
    condition     = length(kubernetes_cluster_role_v1.kubelet_stats) == 0 && !strcontains(output.manager_command, "kubelet-stats")
    error_message = "docker-runtime workers never call the API: no nodes/proxy, no flag"
  }
}

run "run_pods_account_has_no_token_and_no_role" {
  command = apply

  variables {
    bundle_runtime = "kubernetes"
    kubelet_stats  = true
  }

  assert {
    condition     = kubernetes_default_service_account_v1.runs.automount_service_account_token == false && kubernetes_default_service_account_v1.runs.metadata[0].namespace == "codalab"
    error_message = "run pods get no service account token"
  }
  assert {
    condition = !anytrue(flatten([
      for b in concat([kubernetes_role_binding_v1.manager], kubernetes_role_binding_v1.runtime, kubernetes_cluster_role_binding_v1.runtime, kubernetes_cluster_role_binding_v1.kubelet_stats) :
      [for s in b.subject : s.name == "default" || s.kind != "ServiceAccount"]
    ]))
    error_message = "no role is bound to the run pods' account"
  }
}
