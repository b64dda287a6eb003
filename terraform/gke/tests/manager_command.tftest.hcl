# The manager's command line, and the cluster's shape, with mock providers (no project, no
# cluster, no network).

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

run "manager_command" {
  command = apply

  assert {
    condition     = output.manager_command == "cl-worker-manager --server https://worksheets.example.org --search 'request_gpus>=1' --min-workers 0 --max-workers 4 --worker-work-dir-prefix /var/lib/codalab --worker-max-work-dir-size 10g --worker-idle-seconds 600 --worker-run-as-user 61000:61000 --metrics-addr 0.0.0.0:9464 --lease kubernetes:codalab/cl-worker-manager kubernetes --bundle-runtime kubernetes --namespace codalab --manager-name cl-worker-manager --password-file /etc/codalab/credentials --password-secret codalab-worker-credentials --worker-image us-docker.pkg.dev/acme-research/codalab/worker:0.1.0 --service-account cl-worker-runs --cpus 7 --gpus 1 --memory-mb 26000 --nfs-volume-name nfs --node-selector cloud.google.com/gke-nodepool=codalab-gpu --toleration nvidia.com/gpu=present:NoSchedule"
    error_message = "unexpected manager command: ${output.manager_command}"
  }
  assert {
    condition     = output.filestore_ip == "10.20.0.2"
    error_message = "the workers' NFS volume must be the Filestore instance"
  }
  assert {
    condition     = strcontains(output.manager_command, " --worker-run-as-user 61000:61000 ")
    error_message = "by default the workers run every bundle as the share's owner nfs_owner_uid:gid, with no capabilities (--worker-run-as-user)"
  }
}

run "run_as_user_forwarded_or_left_out" {
  command = apply

  variables {
    nfs_owner_uid = 62000
    nfs_owner_gid = 62001
  }

  assert {
    condition     = strcontains(output.manager_command, " --worker-run-as-user 62000:62001 ")
    error_message = "the default run user follows nfs_owner_uid:gid"
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
    worker_run_as_user = "0"
  }

  expect_failures = [var.worker_run_as_user]
}

run "gpu_pool_scales_from_zero_on_spot" {
  command = apply

  assert {
    condition     = google_container_node_pool.gpu.autoscaling[0].min_node_count == 0 && google_container_node_pool.gpu.autoscaling[0].max_node_count == 4 && google_container_node_pool.gpu.node_config[0].spot
    error_message = "the GPU pool must scale from 0 to max_workers Spot nodes"
  }
  assert {
    condition     = google_container_node_pool.gpu.node_config[0].taint[0].key == "nvidia.com/gpu" && google_container_node_pool.gpu.node_config[0].taint[0].value == "present" && google_container_node_pool.gpu.node_config[0].taint[0].effect == "NO_SCHEDULE"
    error_message = "the GPU pool must carry the taint nvidia.com/gpu=present:NoSchedule"
  }
  assert {
    condition     = google_container_node_pool.gpu.node_config[0].guest_accelerator[0].type == "nvidia-l4" && google_container_node_pool.gpu.node_config[0].guest_accelerator[0].gpu_driver_installation_config[0].gpu_driver_version == "LATEST"
    error_message = "GKE installs the NVIDIA driver on the GPU nodes"
  }
  assert {
    condition     = google_filestore_instance.work.tier == "BASIC_HDD" && google_filestore_instance.work.file_shares[0].capacity_gb == 1024
    error_message = "the cheapest Filestore by default"
  }
}

run "authorized_networks_never_the_internet" {
  command = plan

  variables {
    authorized_networks = ["0.0.0.0/0"]
  }

  expect_failures = [var.authorized_networks]
}

run "gpus_per_node" {
  command = plan

  variables {
    gpus = 3
  }

  expect_failures = [var.gpus]
}
