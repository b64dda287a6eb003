#!/usr/bin/env bash
# The main job on the embedded default: a local CodaLab server, `cl-worker-manager` with the
# `local` backend, and the example runs of examples/ taken from staged to ready by the workers
# it launches (in Docker, on a locally built image). Prints each run's stdout, then shows the
# manager back at zero workers.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tests/peers/test-image.sh >/dev/null
bash tests/peers/codalab-server.sh start
cargo build --release -p codalab-worker -p codalab-worker-manager
eval "$(bash tests/peers/codalab-server.sh env)"

work=$(mktemp -d)
export CODALAB_STATE=$work/cl-state.json CODALAB_SESSION=demo-$$
export CODALAB_USERNAME=$CLW_ROOT_USER CODALAB_PASSWORD=$CLW_ROOT_PASSWORD
tag=demo-$$
cl work >/dev/null

echo "staging the example runs (examples/runs.sh) on queue $tag..." >&2
staged=$(TAG=$tag bash examples/runs.sh)
mapfile -t runs <<<"$staged"

target/release/cl-worker-manager --server "$CLW_SERVER_URL" \
  --min-workers 0 --max-workers 4 --sleep-time 2 --min-seconds-between-workers 0 \
  --worker-tag "$tag" --worker-tag-exclusive --worker-idle-seconds 10 \
  --worker-executable "$PWD/target/release/cl-worker" \
  --worker-work-dir-prefix "$work/workers" --config examples/manager.toml \
  --metrics-addr 127.0.0.1:0 \
  local --cpus 1 --memory-mb 2048 2>"$work/manager.log" &
manager_pid=$!
cleanup() { kill -TERM "$manager_pid" 2>/dev/null || true; wait "$manager_pid" 2>/dev/null || true; }
trap cleanup EXIT

failed=0
for line in "${runs[@]}"; do
  uuid=${line%% *} name=${line#* }
  state=""
  for _ in $(seq 1 360); do
    state=$(cl info -f state "$uuid")
    case "$state" in ready | failed | killed | worker_offline) break ;; esac
    sleep 0.5
  done
  printf '%-15s %-8s %s\n' "$name" "$state" "$(cl cat "$uuid/stdout" 2>/dev/null | tr '\n' ' ')"
  [ "$state" = ready ] || failed=1
done
if [ "$failed" = 1 ]; then
  echo "--- manager log ---" >&2
  tail -n 40 "$work/manager.log" >&2
  exit 1
fi
grep -E "launched worker|shape .*: launching" "$work/manager.log" | sed 's/^/manager: /' >&2 || true
echo "waiting for idle workers to exit..." >&2
for _ in $(seq 1 90); do
  grep -q worker_id "$work/workers/local-jobs.json" 2>/dev/null || break
  sleep 1
done
addr=$(grep -o 'serving /metrics and /status on http://[0-9.:]*' "$work/manager.log" | sed 's|.*http://||')
curl -fsS "http://$addr/metrics" | grep -E '^cl_worker_manager_(launches_total|workers\{)' >&2 || true
if grep -q worker_id "$work/workers/local-jobs.json" 2>/dev/null; then
  echo "workers still running" >&2
  exit 1
fi
echo "all runs ready; the manager has 0 workers" >&2
