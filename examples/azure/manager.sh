#!/usr/bin/env bash
# cl-worker-manager for an Azure Batch job on an autoscale pool (autoscale.formula).
#
# The pool's nodes mount a share at /mnt/codalab (Azure Files or NFS): the workers' work dir
# lives there. The CodaLab credentials are a mode-600 file at the same path on this machine and
# on every node, on each one's own disk (the pool's start task writes it from Key Vault with the
# pool's identity, as terraform/azure-batch does), mounted read-only into each worker container.
# Without --password-file the manager would write it on the share, readable by every machine
# that mounts the share.
#
# Secrets stay out of argv: the account key (or nothing: Microsoft Entra ID through the
# machine's managed identity, workload identity or Azure CLI) and the log container's SAS come
# from the environment, the CodaLab password from the credentials file.
#
# --worker-run-as-user: every bundle runs as nobody, owner of its bundle directory only, with no
# capabilities (docs/security.md). Images that expect root (installing packages at run time)
# fail under it. Without it bundles run as their directory's owner, as CodaLab does, unless the
# worker image sets CL_WORKER_RUN_AS_USER (that of docker/Dockerfile sets 65534:65534). On a
# share that squashes root, use the uid root is squashed to: the workers give each bundle
# directory to that user.
set -euo pipefail
credentials=/etc/codalab/worker-credentials
[ -r "$credentials" ] || { echo "$credentials: the username on line 1, the password on line 2, mode 600" >&2; exit 1; }
: "${AZURE_BATCH_LOG_CONTAINER_URL:?https://<storage>.blob.core.windows.net/worker-logs?<SAS with write>}"
# export AZURE_BATCH_ACCOUNT_KEY=...   # SharedKey; leave unset for Entra ID

exec cl-worker-manager \
  --server https://worksheets.example.org \
  --worker-work-dir-prefix /mnt/codalab \
  --max-workers 10 \
  --metrics-addr 127.0.0.1:9464 \
  --worker-run-as-user 65534:65534 \
  azure-batch \
  --account-name codalabbatch \
  --service-url https://codalabbatch.westus2.batch.azure.com \
  --job-id codalab-workers \
  --pool-id codalab-pool \
  --cpus 4 --memory-mb 14336 \
  --worker-image codalab/worker:1.7.5 \
  --password-file "$credentials"
