"""Broken copies of terraform/kubernetes that open a way out of a run pod, or give the
installation's accounts more than they need: its `terraform test` (tests/isolation.tftest.hcl)
must reject each one, with the assertion that names what broke. Loaded by negative.py.
"""

import re


def cases(Case, TF, TF_TEST):
    def failed(error_message):
        return r"Test assertion failed: " + re.escape(error_message)

    def case(name, file, old, new, error_message):
        return Case(f"kubernetes: {name}", file, old, new, "test", failed(error_message), TF_TEST,
                    module="kubernetes")

    return [
        case("nodes/proxy granted by default", "rbac.tf",
             '  kubelet_stats = var.bundle_runtime == "kubernetes" && var.kubelet_stats\n',
             '  kubelet_stats = var.bundle_runtime == "kubernetes"\n',
             "nodes/proxy must not be granted by default"),
        case("nodes/proxy back in the workers' ClusterRole", "rbac.tf",
             '    { api_groups = [""], resources = ["nodes"], verbs = ["get"], resource_names = [] },\n',
             '    { api_groups = [""], resources = ["nodes", "nodes/proxy"], verbs = ["get"], resource_names = [] },\n',
             "nodes/proxy must not be granted by default"),
        case("metadata address removed from the except list", "network.tf",
             '    "169.254.0.0/16",\n', "",
             "run pods must not reach the metadata address"),
        case("Azure's platform address removed from the except list", "network.tf",
             '    "168.63.129.16/32",\n', "",
             "run pods must not reach the metadata address"),
        case("a private range removed from the except list", "network.tf",
             '    "10.0.0.0/8",\n', "",
             "run pods must not reach private addresses: the NFS server, the nodes, the manager"),
        case("default deny removed", "network.tf",
             '    pod_selector {}\n    policy_types = ["Ingress", "Egress"]\n',
             '    pod_selector {}\n    policy_types = ["Ingress"]\n',
             "the namespace needs a default-deny policy: every pod, ingress and egress, no rule"),
        case("allow-all egress for every run pod", "network.tf",
             '    policy_types = ["Ingress"]\n',
             '    policy_types = ["Ingress", "Egress"]\n\n    egress {}\n',
             "run pods without network must have no egress at all"),
        case("runs without network selected for the internet", "network.tf",
             '  networked_run_pod_labels = merge(local.run_pod_labels, { "codalab.org/network" = "true" })\n',
             '  networked_run_pod_labels = local.run_pod_labels\n',
             "run pods without network must have no egress at all"),
        case("run pods' except list cut to the metadata addresses", "network.tf",
             '          cidr   = "0.0.0.0/0"\n          except = local.internet_except\n',
             '          cidr   = "0.0.0.0/0"\n          except = ["169.254.0.0/16", "168.63.129.16/32"]\n',
             "run pods must not reach private addresses: the NFS server, the nodes, the manager"),
        case("run pods open to the whole namespace", "network.tf",
             '          match_labels = local.worker_pod_labels\n        }\n      }\n    }\n  }\n}\n',
             '          match_labels = {}\n        }\n      }\n    }\n  }\n}\n',
             "run pods accept connections only from the worker pods"),
        case("the metrics port open to every namespace", "network.tf",
             '            match_labels = { "kubernetes.io/metadata.name" = ingress.value }\n',
             '            match_labels = {}\n',
             "the metrics port is open only to the monitoring namespace"),
        case("docker-runtime workers reach the API server", "network.tf",
             '      for_each = var.bundle_runtime == "kubernetes" ? ["api"] : []\n',
             '      for_each = ["api"]\n',
             "docker-runtime workers get no rule for the API server or for other pods"),
        case("run pods get a token", "rbac.tf",
             "    labels    = local.labels\n  }\n  automount_service_account_token = false\n",
             "    labels    = local.labels\n  }\n  automount_service_account_token = true\n",
             "run pods get no service account token"),
    ]
