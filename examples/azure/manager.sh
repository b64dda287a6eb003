#!/usr/bin/env bash
# cl-worker-manager for an Azure Batch job on an autoscale pool (autoscale.formula).
#
# The pool's nodes and this machine mount the same share at /mnt/codalab (Azure Files or NFS):
# the workers' work dirs live there, and so does the mode-600 credentials file the manager
# writes for them (.worker-password), mounted read-only into each worker container.
#
# Secrets stay out of argv: the account key (or nothing: Microsoft Entra ID through the
# machine's managed identity, workload identity or Azure CLI) and the log container's SAS come
# from the environment, the CodaLab password from CODALAB_PASSWORD.
set -euo pipefail
: "${CODALAB_USERNAME:?}" "${CODALAB_PASSWORD:?}"
: "${AZURE_BATCH_LOG_CONTAINER_URL:?https://<storage>.blob.core.windows.net/worker-logs?<SAS with write>}"
# export AZURE_BATCH_ACCOUNT_KEY=...   # SharedKey; leave unset for Entra ID

exec cl-worker-manager \
  --server https://worksheets.example.org \
  --worker-work-dir-prefix /mnt/codalab \
  --max-workers 10 \
  --metrics-addr 127.0.0.1:9464 \
  azure-batch \
  --account-name codalabbatch \
  --service-url https://codalabbatch.westus2.batch.azure.com \
  --job-id codalab-workers \
  --pool-id codalab-pool \
  --cpus 4 --memory-mb 14336 \
  --worker-image codalab/worker:1.7.5
