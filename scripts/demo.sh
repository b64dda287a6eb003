#!/usr/bin/env bash
# The main job on the embedded default: a local CodaLab server, one cl-worker, and
# `cl run 'echo hello'` taken from staged to ready in Docker; prints the run's stdout.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tests/peers/test-image.sh >/dev/null
bash tests/peers/codalab-server.sh start
cargo build --release -p codalab-worker
eval "$(bash tests/peers/codalab-server.sh env)"

work=$(mktemp -d)
state=$work/cl-state.json
export CODALAB_STATE=$state CODALAB_SESSION=demo-$$
cl_root() { CODALAB_USERNAME=$CLW_ROOT_USER CODALAB_PASSWORD=$CLW_ROOT_PASSWORD cl "$@"; }

pwfile=$work/password
umask 077
printf '%s\n%s\n' "$CLW_ROOT_USER" "$CLW_ROOT_PASSWORD" >"$pwfile"
umask 022
worker_id=demo-worker-$$
tag=demo-$$
target/release/cl-worker --server "$CLW_SERVER_URL" --ws-server "$CLW_WS_URL" \
  --password-file "$pwfile" --work-dir "$work/worker" --id "$worker_id" \
  --tag "$tag" --tag-exclusive 2>"$work/worker.log" &
worker_pid=$!
# The worker's networks (default prefix) are shared by workers on this machine and stay.
cleanup() { kill "$worker_pid" 2>/dev/null || true; wait "$worker_pid" 2>/dev/null || true; }
trap cleanup EXIT

cl_root work >/dev/null
uuid=$(cl_root run --request-queue "$tag" 'echo hello' | tail -n 1)
echo "submitted run bundle $uuid; waiting for it to be ready..." >&2
state=""
for _ in $(seq 1 240); do
  state=$(cl_root info -f state "$uuid")
  case "$state" in ready | failed | killed | worker_offline) break ;; esac
  sleep 0.5
done
echo "bundle $uuid: $state" >&2
if [ "$state" != ready ]; then
  echo "--- worker log ---" >&2
  tail -n 50 "$work/worker.log" >&2
  exit 1
fi
cl_root cat "$uuid/stdout"
