#!/usr/bin/env bash
# Benchmark: Slurm CLI calls per manager tick with N tracked jobs, ours vs CodaLab's Python
# `cl-worker-manager slurm-batch`, on the same real Slurm (tests/peers/slurm.sh) and server.
# Each manager's Slurm commands go through logging shims on PATH; one tick each is counted.
#   bash bench/slurm_calls.sh [N=20]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
n=${1:-20}
bash tests/peers/codalab-server.sh start >/dev/null
bash tests/peers/slurm.sh start
cargo build -q -p codalab-worker-manager
eval "$(bash tests/peers/codalab-server.sh env)"
eval "$(bash tests/peers/slurm.sh env)"
export CODALAB_USERNAME=$CLW_ROOT_USER CODALAB_PASSWORD=$CLW_ROOT_PASSWORD
python_manager=$(dirname "$(command -v cl)")/cl-worker-manager

work=$(mktemp -d)
trap 'scancel --user root --partition "$CLW_SLURM_PARTITION" >/dev/null 2>&1 || true; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
job_name=clwbench$$
for _ in $(seq 1 "$n"); do
  sbatch --parsable --job-name "root-$job_name-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')" \
    --comment clwm:default --mem 64M --output /dev/null --wrap 'sleep 600' >/dev/null
done
echo "$n jobs named root-$job_name-… submitted" >&2

# Shims that log every Slurm command, then run the real one.
mkdir -p "$work/shims"
for cmd in squeue sacct scontrol sbatch scancel sinfo; do
  real=$(command -v "$cmd")
  printf '#!/bin/sh\necho "%s $*" >> "$CALL_LOG"\nexec %s "$@"\n' "$cmd" "$real" >"$work/shims/$cmd"
  chmod +x "$work/shims/$cmd"
done

# Ours: the start-up `sinfo` check, then one tick (`--once` plans after listing its jobs).
CALL_LOG=$work/ours.log PATH=$work/shims:$PATH target/debug/cl-worker-manager \
  --server "$CLW_SERVER_URL" --min-workers 0 --once --worker-tag "$job_name" --worker-tag-exclusive \
  slurm-batch --partition "$CLW_SLURM_PARTITION" --job-name "$job_name" --user root \
  --slurm-work-dir "$work/scratch" >"$work/plan.json" 2>"$work/ours.err"
tracked=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["total_jobs"])' "$work/plan.json")

# Python's manager imports every cloud SDK at start-up, whichever backend runs. Placeholder
# modules stand in for the Azure Batch and Kubernetes SDKs (the Slurm code path never uses them).
stubs=$work/stubs
for mod in azure/batch/__init__ azure/batch/batch_auth azure/batch/_batch_service_client \
  azure/batch/models kubernetes/__init__ kubernetes/utils/__init__ \
  kubernetes/utils/create_from_yaml; do
  mkdir -p "$stubs/$(dirname "$mod")"
  printf 'def __getattr__(name):\n    return type(name, (Exception,), {})\n' >"$stubs/$mod.py"
done
# `azure` is shared with the Azure Storage SDK the server code needs: extend, not shadow.
echo "__path__ = __import__('pkgutil').extend_path(__path__, __name__)" >"$stubs/azure/__init__.py"
: >"$work/python.log"

# Python: start-up `squeue`, then iterations every --sleep-time; stopped during its first sleep.
(cd "$work" && CALL_LOG=$work/python.log PATH=$work/shims:$PATH PYTHONPATH=$stubs timeout 20 "$python_manager" \
  --server "$CLW_SERVER_URL" --min-workers 0 --sleep-time 600 --worker-tag "$job_name" \
  --worker-tag-exclusive slurm-batch --partition "$CLW_SLURM_PARTITION" --job-name "$job_name" \
  --user root --gpus 0 >"$work/python.out" 2>&1) || true

ours_tick=$(grep -vc '^sinfo' "$work/ours.log" || true)
python_startup=1 # the squeue of load_worker_jobs
python_tick=$(($(wc -l <"$work/python.log") - python_startup))
echo "tracked jobs: ours $tracked, python $(grep -c '^scontrol' "$work/python.log" || true) scontrol calls"
echo "Slurm CLI calls in one tick with $n jobs: ours $ours_tick, python $python_tick ($(awk -v a="$python_tick" -v b="$ours_tick" 'BEGIN { printf "%.0f", a / b }')x)"
echo "--- ours:";   sort "$work/ours.log" | cut -d' ' -f1 | uniq -c
echo "--- python:"; sort "$work/python.log" | cut -d' ' -f1 | uniq -c
