# What an untrusted run cannot turn against the operator, with mock providers (no project, no
# cluster, no network): the Filestore share is exported to the nodes only, with root squashed
# to a dedicated owner, and pods see only the GKE metadata server.

mock_provider "google" {
  mock_data "google_compute_subnetwork" {
    defaults = {
      ip_cidr_range      = "10.128.0.0/20"
      secondary_ip_range = [{ range_name = "gke-codalab-pods-0123abcd", ip_cidr_range = "10.64.0.0/14", reserved_internal_range = "" }]
    }
  }
  override_resource {
    target = google_filestore_instance.work
    values = {
      networks = { network = "default", modes = ["MODE_IPV4"], ip_addresses = ["10.20.0.2"], connect_mode = "DIRECT_PEERING", reserved_ip_range = "10.20.0.0/29" }
    }
  }
  override_resource {
    target = google_service_account.nodes
    values = { email = "codalab-gke-nodes@acme-research.iam.gserviceaccount.com" }
  }
}

mock_provider "kubernetes" {}

variables {
  project             = "acme-research"
  codalab_server      = "https://worksheets.example.org"
  authorized_networks = ["203.0.113.0/24"]
  worker_image        = "us-docker.pkg.dev/acme-research/codalab/worker:0.1.0"
  manager_image       = "us-docker.pkg.dev/acme-research/codalab/cl-worker-manager:0.1.0"
}

run "filestore_only_for_the_nodes_with_root_squashed" {
  command = apply

  assert {
    condition     = data.google_compute_subnetwork.nodes.name == "default" && data.google_compute_subnetwork.nodes.region == "us-central1" && data.google_compute_subnetwork.nodes.project == "acme-research"
    error_message = "the nodes' range must be read from the nodes' subnetwork (var.subnetwork in the zone's region)"
  }
  assert {
    condition     = length(google_filestore_instance.work.file_shares[0].nfs_export_options) == 1 && google_filestore_instance.work.file_shares[0].nfs_export_options[0].ip_ranges == tolist(["10.128.0.0/20"])
    error_message = "the Filestore share must be exported to the nodes' range (the subnetwork's primary range) only, not to the pods or the whole network"
  }
  assert {
    condition     = google_filestore_instance.work.file_shares[0].nfs_export_options[0].squash_mode == "ROOT_SQUASH" && google_filestore_instance.work.file_shares[0].nfs_export_options[0].access_mode == "READ_WRITE"
    error_message = "the nodes' export must squash root (ROOT_SQUASH)"
  }
  assert {
    condition     = google_filestore_instance.work.file_shares[0].nfs_export_options[0].anon_uid == 61000 && google_filestore_instance.work.file_shares[0].nfs_export_options[0].anon_gid == 61000
    error_message = "root must be squashed to the share's dedicated owner 61000:61000 (anon_uid, anon_gid)"
  }
  assert {
    condition = alltrue(flatten([
      for e in google_filestore_instance.work.file_shares[0].nfs_export_options : [
        for r in e.ip_ranges : !contains(["0.0.0.0/0", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"], r)
      ]
    ]))
    error_message = "the Filestore share must never be exported to 0.0.0.0/0 or a whole private network"
  }
  assert {
    condition     = output.filestore_export_ip_ranges == ["10.128.0.0/20"]
    error_message = "filestore_export_ip_ranges must show the nodes' range only"
  }
}

run "an_admin_machine_for_the_one_off_chown" {
  command = apply

  variables {
    nfs_admin_ip_ranges = ["10.10.0.5/32"]
  }

  assert {
    condition     = length(google_filestore_instance.work.file_shares[0].nfs_export_options) == 2 && google_filestore_instance.work.file_shares[0].nfs_export_options[0].ip_ranges == tolist(["10.128.0.0/20"]) && google_filestore_instance.work.file_shares[0].nfs_export_options[0].squash_mode == "ROOT_SQUASH"
    error_message = "an admin range must not change the nodes' export"
  }
  assert {
    condition = alltrue([
      for e in google_filestore_instance.work.file_shares[0].nfs_export_options :
      e.squash_mode == "ROOT_SQUASH" || (e.ip_ranges == tolist(["10.10.0.5/32"]) && e.anon_uid == null)
    ])
    error_message = "only the nfs_admin_ip_ranges may be exported without root squash"
  }
}

run "admin_range_never_the_internet" {
  command = plan

  variables {
    nfs_admin_ip_ranges = ["0.0.0.0/0"]
  }

  expect_failures = [var.nfs_admin_ip_ranges]
}

run "admin_range_no_wider_than_a_24" {
  command = plan

  variables {
    nfs_admin_ip_ranges = ["10.10.0.0/16"]
  }

  expect_failures = [var.nfs_admin_ip_ranges]
}

run "admin_range_outside_the_nodes" {
  command = plan

  variables {
    nfs_admin_ip_ranges = ["10.128.3.7/32"]
  }

  expect_failures = [google_filestore_instance.work]
}

run "admin_range_outside_the_pods" {
  command = plan

  variables {
    nfs_admin_ip_ranges = ["10.10.0.5/32", "10.65.1.0/24"]
  }

  expect_failures = [google_filestore_instance.work]
}

run "the_owner_is_never_root" {
  command = plan

  variables {
    nfs_owner_uid = 0
  }

  expect_failures = [var.nfs_owner_uid]
}

run "a_subnetwork_by_self_link" {
  command = plan

  variables {
    subnetwork = "projects/acme-network/regions/us-central1/subnetworks/gke-nodes"
  }

  assert {
    condition     = data.google_compute_subnetwork.nodes.self_link == "projects/acme-network/regions/us-central1/subnetworks/gke-nodes"
    error_message = "a subnetwork given as a self link (Shared VPC) must be read by its self link"
  }
}

run "pods_see_only_the_gke_metadata_server" {
  command = apply

  assert {
    condition     = google_container_node_pool.gpu.node_config[0].workload_metadata_config[0].mode == "GKE_METADATA" && google_container_node_pool.system.node_config[0].workload_metadata_config[0].mode == "GKE_METADATA"
    error_message = "both node pools must run the GKE metadata server (workload_metadata_config GKE_METADATA): pods never reach the node's service account"
  }
  assert {
    condition     = google_container_cluster.this.workload_identity_config[0].workload_pool == "acme-research.svc.id.goog"
    error_message = "Workload Identity must be on (the GKE metadata server answers with the pod's own identity)"
  }
  assert {
    condition     = google_container_node_pool.gpu.node_config[0].metadata["disable-legacy-endpoints"] == "true" && google_container_node_pool.system.node_config[0].metadata["disable-legacy-endpoints"] == "true"
    error_message = "both node pools must disable the legacy metadata endpoints"
  }
}
