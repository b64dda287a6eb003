"""Broken copies of terraform/gke that the offline suite must reject: each undoes one property
that keeps an untrusted run from turning the installation against its operator (the Filestore
share exported to the nodes only, root squashed to a dedicated owner, pods seeing only the GKE
metadata server). Loaded by negative.py."""

import re


def _test(Case, TF_TEST, name, file, old, new, message):
    return Case(f"gke isolation: {name}", file, old, new, "test",
                r"Test assertion failed: " + re.escape(message), TF_TEST, module="gke")


def cases(Case, TF, TF_TEST):
    t = lambda *a: _test(Case, TF_TEST, *a)  # noqa: E731
    missing = r"Missing expected failure"
    return [
        # --- the Filestore share
        t("NO_ROOT_SQUASH for the nodes", "main.tf",
          '      squash_mode = "ROOT_SQUASH"\n', '      squash_mode = "NO_ROOT_SQUASH"\n',
          "the nodes' export must squash root (ROOT_SQUASH)"),
        t("exported to 10.0.0.0/8 (the pods too)", "main.tf",
          "      ip_ranges   = [local.node_ip_range]\n", '      ip_ranges   = ["10.0.0.0/8"]\n',
          "the Filestore share must never be exported to 0.0.0.0/0 or a whole private network"),
        t("exported to 0.0.0.0/0", "main.tf",
          "      ip_ranges   = [local.node_ip_range]\n", '      ip_ranges   = ["0.0.0.0/0"]\n',
          "the Filestore share must never be exported to 0.0.0.0/0 or a whole private network"),
        t("exported to the nodes and the pods' range", "main.tf",
          "      ip_ranges   = [local.node_ip_range]\n",
          '      ip_ranges   = [local.node_ip_range, "10.64.0.0/14"]\n',
          "the Filestore share must be exported to the nodes' range (the subnetwork's primary "
          "range) only, not to the pods or the whole network"),
        t("root squashed to root", "main.tf",
          "      anon_uid    = var.nfs_owner_uid\n", "      anon_uid    = 0\n",
          "root must be squashed to the share's dedicated owner 61000:61000 (anon_uid, anon_gid)"),
        t("the admin export with root squash off for every range", "main.tf",
          '        squash_mode = "NO_ROOT_SQUASH"\n'
          "      }\n"
          "    }\n",
          '        squash_mode = "NO_ROOT_SQUASH"\n'
          "      }\n"
          "    }\n"
          "    nfs_export_options {\n"
          '      ip_ranges   = ["10.99.0.0/16"]\n'
          '      access_mode = "READ_WRITE"\n'
          '      squash_mode = "NO_ROOT_SQUASH"\n'
          "    }\n",
          "the Filestore share must be exported to the nodes' range (the subnetwork's primary "
          "range) only, not to the pods or the whole network"),
        Case("gke isolation: admin ranges of any width", "variables.tf",
             "tonumber(split(\"/\", r)[1]) >= 24 &&", "tonumber(split(\"/\", r)[1]) >= 8 &&",
             "test", missing + r".*var\.nfs_admin_ip_ranges", TF_TEST, module="gke"),
        Case("gke isolation: admin ranges among the nodes", "main.tf",
             "      condition     = length(local.nfs_admin_overlaps) == 0\n",
             "      condition     = length(local.nfs_admin_overlaps) >= 0\n",
             "test", missing + r".*google_filestore_instance\.work", TF_TEST, module="gke"),
        Case("gke isolation: admin ranges among the pods", "main.tf",
             "  subnetwork_ranges = concat([local.node_ip_range], "
             "[for r in data.google_compute_subnetwork.nodes.secondary_ip_range : r.ip_cidr_range])\n",
             "  subnetwork_ranges = [local.node_ip_range]\n",
             "test", missing + r".*google_filestore_instance\.work", TF_TEST, module="gke"),
        Case("gke isolation: root squashed to a uid that may be root", "variables.tf",
             "    condition     = var.nfs_owner_uid >= 1 &&",
             "    condition     = var.nfs_owner_uid >= 0 &&",
             "test", missing + r".*var\.nfs_owner_uid", TF_TEST, module="gke"),
        # --- metadata
        t("the GPU pool on the node's metadata", "main.tf",
          '      effect = "NO_SCHEDULE"\n'
          "    }\n"
          "\n"
          "    workload_metadata_config {\n"
          '      mode = "GKE_METADATA"\n',
          '      effect = "NO_SCHEDULE"\n'
          "    }\n"
          "\n"
          "    workload_metadata_config {\n"
          '      mode = "GCE_METADATA"\n',
          "both node pools must run the GKE metadata server (workload_metadata_config "
          "GKE_METADATA): pods never reach the node's service account"),
    ]
