#!/usr/bin/env bash
# Azure Batch test peers for the azure-batch worker manager (no Azure Batch
# emulator exists):
#   - a venv with Microsoft's official data-plane SDK (PyPI azure-batch
#     15.1.0, API version 2025-06-01) and azure-storage-blob, pinned;
#   - tests/peers/azure/golden.py: what that SDK sends for each operation
#     (recorded on a local capture server; fixed date, exact SharedKey);
#   - tests/peers/azure/parse.py: what that SDK parses from a response;
#   - tests/peers/azure/batch_standin.py: the project's stateful stand-in for
#     the Batch service (SharedKey/bearer auth, jobs, pools, tasks that run in
#     the local Docker engine) plus a minimal Blob service for output files,
#     both on 127.0.0.1.
#
#   tests/peers/azure-batch.sh install        # venv (pinned, from PyPI); idempotent, fast when present
#   tests/peers/azure-batch.sh start          # installs if needed; no-op if running
#   eval "$(tests/peers/azure-batch.sh env)"  # CLW_AZBATCH_URL, _ACCOUNT, _KEY, _JOB, _POOL, _CONTAINER_URL, ...
#   tests/peers/azure-batch.sh status         # exit 0 iff the stand-in is up and answers
#   tests/peers/azure-batch.sh state          # the stand-in's tasks, nodes and controls (JSON)
#   tests/peers/azure-batch.sh requests       # the last 500 Batch requests it served (JSON)
#   tests/peers/azure-batch.sh journal        # every request since install, resets too (JSON lines)
#   tests/peers/azure-batch.sh blobs          # every blob uploaded to the Blob stand-in
#   tests/peers/azure-batch.sh ctl JSON       # POST /_clw/control, e.g. '{"hold": true}',
#                                             #   '{"throttle": {"count": 2, "status": 429, "retry_after": 1}}',
#                                             #   '{"job_missing": true}', '{"nodes": 2, "slots_per_node": 2}'
#   tests/peers/azure-batch.sh reset          # kill task containers, drop tasks, blobs, controls, request log
#   tests/peers/azure-batch.sh selftest       # the official SDK against the running stand-in (~30 s)
#   tests/peers/azure-batch.sh golden [ARGS]  # golden.py with the venv's Python (see its --help)
#   tests/peers/azure-batch.sh parse [ARGS]   # parse.py with the venv's Python (stdin: response JSON)
#   tests/peers/azure-batch.sh logs [N]       # last N lines of the stand-in's log
#   tests/peers/azure-batch.sh stop           # by pid: TERM, then KILL; idempotent
#   tests/peers/azure-batch.sh restart | purge
#
# Everything lives in $CLW_AZBATCH_BASE, by default
# ${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}/azure-batch: venv/,
# wheelhouse/, run/ (pid, settings of the running server, bearer token file),
# log/, state/ (node and task directories of the tasks).
# Settings (env, with defaults; a running stand-in keeps the values it was
# started with, saved in run/settings.env):
#   CLW_AZBATCH_PORT=10100  CLW_AZBATCH_BLOB_PORT=10101
#   CLW_AZBATCH_ACCOUNT=clwtestacct  CLW_AZBATCH_KEY=<fixed base64 test key>
#   CLW_AZBATCH_TOKEN=clw-test-entra-token   (bearer token accepted instead of SharedKey)
#   CLW_AZBATCH_JOB=codalab-job  CLW_AZBATCH_POOL=codalab-pool
#   CLW_AZBATCH_NODES=1  CLW_AZBATCH_SLOTS=1  CLW_AZBATCH_LOW_PRIORITY_NODES=0
#   CLW_AZBATCH_CONTAINER=worker-logs  CLW_AZBATCH_SAS='sv=2022-11-02&sp=rcwl&sig=clw-test-sas'
#   CLW_AZBATCH_NETWORK=host  (docker --network of task containers unless containerRunOptions has one)
#   CLW_AZBATCH_KILL_AFTER=5  (terminate: seconds from SIGTERM to SIGKILL)
#   CLW_AZBATCH_START_TIMEOUT=30  CLW_AZBATCH_STOP_TIMEOUT=15
#   CLW_AZBATCH_PYTHON_BIN=python3.11 (or another Python >= 3.9 with venv; for install)
set -euo pipefail

# ---------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------
RECIPE_VERSION=1 # bump when the install steps change, to re-run them on old caches
AZURE_BATCH_VERSION=15.1.0
# Every package of the venv, pinned (pip freeze of a working install).
PIP_SPEC="azure-batch==$AZURE_BATCH_VERSION azure-core==1.41.0 azure-storage-blob==12.31.1 isodate==0.7.2
typing_extensions==4.16.0 requests==2.34.2 urllib3==2.8.0 certifi==2026.10.18 charset-normalizer==3.5.2
idna==3.20 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12"
PIP_SPEC=$(echo $PIP_SPEC) # one line

if [[ -z ${HOME:-} ]]; then
  HOME=$(getent passwd "$(id -u)" | cut -d: -f6)
  export HOME
fi
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PEER_DIR=$HERE/azure
STANDIN=$PEER_DIR/batch_standin.py
CACHE_ROOT=${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}
BASE=${CLW_AZBATCH_BASE:-$CACHE_ROOT/azure-batch}
BASE=${BASE%/}
VENV=$BASE/venv
PY=$VENV/bin/python
WHEELHOUSE=$BASE/wheelhouse
RUN=$BASE/run
LOG=$BASE/log
STATE=$BASE/state
PID_FILE=$RUN/standin.pid
SETTINGS_FILE=$RUN/settings.env
TOKEN_FILE=$RUN/bearer-token
SERVER_LOG=$LOG/standin.log
VENV_ID="recipe=$RECIPE_VERSION pip=[$PIP_SPEC]"
VENV_MARKER=$VENV/.clw-complete

PORT=${CLW_AZBATCH_PORT:-10100}
BLOB_PORT=${CLW_AZBATCH_BLOB_PORT:-10101}
ACCOUNT=${CLW_AZBATCH_ACCOUNT:-clwtestacct}
KEY=${CLW_AZBATCH_KEY:-Y2wtd29ya2VyIHRlc3Qga2V5IC0gbm90IGEgc2VjcmV0IQ==}
TOKEN=${CLW_AZBATCH_TOKEN:-clw-test-entra-token}
JOB=${CLW_AZBATCH_JOB:-codalab-job}
POOL=${CLW_AZBATCH_POOL:-codalab-pool}
NODES=${CLW_AZBATCH_NODES:-1}
SLOTS=${CLW_AZBATCH_SLOTS:-1}
LP_NODES=${CLW_AZBATCH_LOW_PRIORITY_NODES:-0}
CONTAINER=${CLW_AZBATCH_CONTAINER:-worker-logs}
SAS=${CLW_AZBATCH_SAS:-sv=2022-11-02&sp=rcwl&sig=clw-test-sas}
NETWORK=${CLW_AZBATCH_NETWORK-host}
KILL_AFTER=${CLW_AZBATCH_KILL_AFTER:-5}
START_TIMEOUT=${CLW_AZBATCH_START_TIMEOUT:-30}
STOP_TIMEOUT=${CLW_AZBATCH_STOP_TIMEOUT:-15}

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

log() { printf '[azure-batch] %s\n' "$*" >&2; }
die() {
  printf '[azure-batch] ERROR: %s\n' "$*" >&2
  exit 1
}
# shellcheck source=tests/peers/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

check_settings() {
  local v
  for v in PORT BLOB_PORT NODES SLOTS LP_NODES KILL_AFTER; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "CLW_AZBATCH_$v must be a number, not '${!v}'"
  done
  [[ $PORT != "$BLOB_PORT" ]] || die "CLW_AZBATCH_PORT and CLW_AZBATCH_BLOB_PORT must differ"
  ((SLOTS >= 1)) || die "CLW_AZBATCH_SLOTS must be at least 1"
  [[ $ACCOUNT =~ ^[a-z0-9]{3,24}$ ]] || die "CLW_AZBATCH_ACCOUNT must be 3-24 lower-case letters or digits"
  [[ $KEY =~ ^[A-Za-z0-9+/]+=*$ ]] || die "CLW_AZBATCH_KEY must be base64"
  [[ $JOB =~ ^[A-Za-z0-9_-]{1,64}$ ]] || die "invalid CLW_AZBATCH_JOB '$JOB'"
  [[ $POOL =~ ^[A-Za-z0-9_-]{1,64}$ ]] || die "invalid CLW_AZBATCH_POOL '$POOL'"
  [[ $CONTAINER =~ ^[a-z0-9][a-z0-9-]{2,62}$ ]] || die "invalid CLW_AZBATCH_CONTAINER '$CONTAINER'"
}

SAVED_VARS="PORT BLOB_PORT ACCOUNT KEY TOKEN JOB POOL NODES SLOTS LP_NODES CONTAINER SAS NETWORK KILL_AFTER"
load_settings() {
  local v
  for v in $SAVED_VARS; do eval "SAVED_$v=''"; done
  if [[ -f $SETTINGS_FILE ]]; then
    # shellcheck source=/dev/null
    . "$SETTINGS_FILE"
  fi
}
load_settings

use_saved_settings() {
  local v s
  for v in $SAVED_VARS; do
    s=SAVED_$v
    if [[ -n ${!s} ]]; then eval "$v=\${$s}"; fi
  done
}

save_settings() {
  local v
  for v in $SAVED_VARS; do printf 'SAVED_%s=%q\n' "$v" "${!v}"; done >"$SETTINGS_FILE"
}

url() { echo "http://127.0.0.1:$PORT"; }
blob_url() { echo "http://127.0.0.1:$BLOB_PORT"; }

# ---------------------------------------------------------------------------
# Process helpers
# ---------------------------------------------------------------------------
# Prints the server's pid if it is running (and really ours), else fails.
server_pid() { live_pid "$PID_FILE" "$STANDIN --state-dir $STATE "; }

answers() { curl -sf -m 3 -o /dev/null "$(url)/_clw/state" 2>/dev/null; }

api() { # api METHOD PATH [JSON BODY]
  curl -sS -f -m 30 -X "$1" -H 'Content-Type: application/json' ${3:+--data "$3"} "$(url)$2"
}

# ---------------------------------------------------------------------------
# install
# ---------------------------------------------------------------------------
find_python() { find_venv_python CLW_AZBATCH_PYTHON_BIN; }

is_installed() {
  [[ -f $VENV_MARKER && $(<"$VENV_MARKER") == "$VENV_ID" ]] &&
    "$PY" -c 'import azure.batch, azure.storage.blob' 2>/dev/null
}

do_install() {
  local t0=$EPOCHREALTIME py rc=0
  mkdir -p "$LOG" "$RUN"
  py=$(find_python)
  log "installing $PIP_SPEC into $VENV with $py"
  rm -rf "$VENV"
  "$py" -m venv "$VENV" >"$LOG/install-pip.log" 2>&1 </dev/null ||
    { log_tail "$LOG/install-pip.log"; die "$py -m venv $VENV failed"; }
  # Keep every wheel in the cache dir: a venv rebuild then needs no network.
  if [[ ! -f $WHEELHOUSE/.clw-complete || $(<"$WHEELHOUSE/.clw-complete") != "$VENV_ID" ]]; then
    rm -rf "$WHEELHOUSE"
    mkdir -p "$WHEELHOUSE"
    # shellcheck disable=SC2086 # word splitting of the spec is intended
    nice -n 10 "$VENV/bin/pip" wheel -q --no-deps -w "$WHEELHOUSE" $PIP_SPEC >>"$LOG/install-pip.log" 2>&1 </dev/null || rc=$?
    if [[ $rc -ne 0 ]]; then
      log_tail "$LOG/install-pip.log"
      die "pip wheel failed (see $LOG/install-pip.log)"
    fi
    printf '%s' "$VENV_ID" >"$WHEELHOUSE/.clw-complete"
  fi
  # shellcheck disable=SC2086 # word splitting of the spec is intended
  nice -n 10 "$VENV/bin/pip" install -q --no-index --find-links "$WHEELHOUSE" $PIP_SPEC \
    >>"$LOG/install-pip.log" 2>&1 </dev/null || rc=$?
  if [[ $rc -ne 0 ]]; then
    log_tail "$LOG/install-pip.log"
    die "pip install failed (see $LOG/install-pip.log)"
  fi
  "$PY" -c 'import azure.batch, azure.storage.blob' 2>>"$LOG/install-pip.log" ||
    die "azure-batch/azure-storage-blob do not import in $VENV (see $LOG/install-pip.log)"
  printf '%s' "$VENV_ID" >"$VENV_MARKER"
  log "installed azure-batch $AZURE_BATCH_VERSION in $(elapsed "$t0") s ($VENV)"
}

cmd_install() {
  exec </dev/null
  take_lock
  if is_installed; then
    log "already installed: azure-batch $AZURE_BATCH_VERSION in $VENV"
    return 0
  fi
  do_install
}

# Runs a Python tool of the peer with the venv (installing it if needed).
need_venv() {
  if ! is_installed; then
    (take_lock && { is_installed || do_install; }) </dev/null
  fi
}

# ---------------------------------------------------------------------------
# start / stop
# ---------------------------------------------------------------------------
cmd_start() {
  exec </dev/null
  check_settings
  command -v docker >/dev/null || die "the docker CLI is needed (tasks run in the local Docker engine)"
  take_lock
  local pid
  if pid=$(server_pid); then
    local wanted
    wanted=$(for v in $SAVED_VARS; do printf '%s ' "${!v}"; done)
    use_saved_settings
    if answers; then
      log "already running (pid $pid, $(url), blob $(blob_url))"
      if [[ $wanted != "$(for v in $SAVED_VARS; do printf '%s ' "${!v}"; done)" ]]; then
        log "note: it runs with other settings than requested; use '$0 restart' to apply them"
      fi
      return 0
    fi
    log "pid $pid does not answer on $(url); restarting it"
    stop_server >/dev/null || true
  fi
  local t0=$EPOCHREALTIME
  is_installed || do_install
  rm -f "$PID_FILE" "$SETTINGS_FILE"
  local p
  for p in "$PORT" "$BLOB_PORT"; do
    if port_open "$p"; then
      die "cannot start: port 127.0.0.1:$p is already in use ($(ss -ltnpH "sport = :$p" 2>/dev/null | head -1)). Set CLW_AZBATCH_PORT / CLW_AZBATCH_BLOB_PORT."
    fi
  done
  mkdir -p "$RUN" "$LOG" "$STATE"
  (umask 077 && printf '%s\n' "$TOKEN" >"$TOKEN_FILE")
  if [[ -f $SERVER_LOG ]] && (($(stat -c %s "$SERVER_LOG") > 50000000)); then
    mv -f "$SERVER_LOG" "$SERVER_LOG.1"
  fi
  printf '\n===== %s: starting the Azure Batch stand-in on 127.0.0.1:%s (blob %s)\n' "$(date -Is)" "$PORT" "$BLOB_PORT" >>"$SERVER_LOG"
  PYTHONUNBUFFERED=1 setsid "$PY" "$STANDIN" --state-dir "$STATE" --host 127.0.0.1 --port "$PORT" \
    --blob-port "$BLOB_PORT" --account-name "$ACCOUNT" --account-key "$KEY" --token-file "$TOKEN_FILE" \
    --job-id "$JOB" --pool-id "$POOL" --nodes "$NODES" --slots-per-node "$SLOTS" \
    --low-priority-nodes "$LP_NODES" --blob-container "$CONTAINER" --sas-token "$SAS" \
    --container-network "$NETWORK" --kill-after "$KILL_AFTER" \
    </dev/null >>"$SERVER_LOG" 2>&1 9>&- &
  pid=$!
  echo "$pid" >"$PID_FILE"
  local end=$((SECONDS + START_TIMEOUT))
  until answers; do
    if ! child_alive "$pid"; then
      log_tail "$SERVER_LOG"
      rm -f "$PID_FILE"
      die "the stand-in exited during start (log: $SERVER_LOG)"
    fi
    if ((SECONDS >= end)); then
      log_tail "$SERVER_LOG"
      stop_server >/dev/null || true
      die "the stand-in did not answer on $(url) within ${START_TIMEOUT} s (log: $SERVER_LOG)"
    fi
    sleep 0.1
  done
  save_settings
  log "up in $(elapsed "$t0") s: pid $pid, Batch $(url) (account $ACCOUNT, job $JOB, pool $POOL, $NODES node(s) x $SLOTS slot(s)), Blob $(blob_url)/$CONTAINER; eval \"\$($0 env)\""
}

stop_server() {
  local pid
  if ! pid=$(server_pid); then
    rm -f "$PID_FILE" "$SETTINGS_FILE"
    return 1
  fi
  # TERM: the stand-in removes its task containers and exits.
  term_then_kill "the stand-in" "$pid" "$STOP_TIMEOUT"
  rm -f "$PID_FILE" "$SETTINGS_FILE"
  echo "$pid"
}

# ---------------------------------------------------------------------------
# status / env / state / requests / blobs / ctl / reset / logs / purge
# ---------------------------------------------------------------------------
need_running() {
  use_saved_settings
  server_pid >/dev/null && answers || die "the Azure Batch stand-in is not running on $(url) (start it with: $0 start)"
}

cmd_status() {
  use_saved_settings
  local pid
  if ! pid=$(server_pid); then
    echo "azure-batch stand-in stopped"
    return 1
  fi
  if ! answers; then
    echo "azure-batch stand-in running pid $pid but $(url) does not answer"
    return 1
  fi
  echo "azure-batch stand-in running pid $pid Batch $(url) Blob $(blob_url) account $ACCOUNT job $JOB pool $POOL nodes $NODES slots $SLOTS"
}

cmd_env() {
  use_saved_settings
  q() { printf 'export %s=%q\n' "$1" "$2"; }
  echo "# Azure Batch stand-in test peer (tests/peers/azure-batch.sh); use: eval \"\$(tests/peers/azure-batch.sh env)\""
  q CLW_AZBATCH_URL "$(url)"
  q CLW_AZBATCH_ACCOUNT "$ACCOUNT"
  q CLW_AZBATCH_KEY "$KEY"
  q CLW_AZBATCH_TOKEN "$TOKEN"
  q CLW_AZBATCH_TOKEN_FILE "$TOKEN_FILE"
  q CLW_AZBATCH_JOB "$JOB"
  q CLW_AZBATCH_POOL "$POOL"
  q CLW_AZBATCH_BLOB_URL "$(blob_url)"
  q CLW_AZBATCH_CONTAINER "$CONTAINER"
  q CLW_AZBATCH_SAS "$SAS"
  q CLW_AZBATCH_CONTAINER_URL "$(blob_url)/$CONTAINER?$SAS"
  q CLW_AZBATCH_CONTROL_URL "$(url)/_clw"
  q CLW_AZBATCH_API_VERSION 2025-06-01
  q CLW_AZBATCH_PYTHON "$PY"
  q CLW_AZBATCH_LOG "$SERVER_LOG"
}

pretty() { if [[ -x $PY ]]; then "$PY" -m json.tool; else cat; fi; }

cmd_state() {
  need_running
  api GET /_clw/state | pretty
}

cmd_requests() {
  need_running
  api GET /_clw/requests | pretty
}

cmd_journal() {
  cat "$STATE/journal.jsonl" 2>/dev/null || true
}

cmd_blobs() {
  need_running
  curl -sS -f -m 10 "$(blob_url)/_clw/blobs" | pretty
}

cmd_ctl() {
  [[ $# -eq 1 ]] || die "usage: $0 ctl JSON   e.g. '{\"hold\": true}'"
  need_running
  api POST /_clw/control "$1" || die "control request refused (see $0 logs)"
  echo
}

cmd_reset() {
  exec </dev/null
  need_running
  api POST /_clw/reset >/dev/null || die "POST $(url)/_clw/reset failed"
  log "reset: tasks, blobs and controls dropped"
}

cmd_logs() {
  local n=${1:-50}
  [[ $n =~ ^[0-9]+$ ]] || die "logs: N must be a number"
  if [[ -s $SERVER_LOG ]]; then
    echo "===== $SERVER_LOG"
    tail -n "$n" "$SERVER_LOG"
  fi
}

cmd_purge() {
  cmd_stop
  log "removing $BASE"
  rm -rf "$BASE"
}

cmd_py() { # cmd_py SCRIPT ARGS...
  need_venv
  exec "$PY" "$PEER_DIR/$1" "${@:2}"
}

cmd_selftest() {
  need_running
  exec </dev/null
  local image=${CLW_AZBATCH_IMAGE:-cl-worker-test/base:latest}
  docker image inspect "$image" >/dev/null 2>&1 ||
    die "selftest: the image $image is not in the local Docker engine (build it with: bash $HERE/test-image.sh)"
  CLW_AZBATCH_URL=$(url) CLW_AZBATCH_ACCOUNT=$ACCOUNT CLW_AZBATCH_KEY=$KEY CLW_AZBATCH_TOKEN=$TOKEN \
    CLW_AZBATCH_JOB=$JOB CLW_AZBATCH_POOL=$POOL CLW_AZBATCH_BLOB_URL=$(blob_url) \
    CLW_AZBATCH_CONTAINER=$CONTAINER CLW_AZBATCH_SAS=$SAS CLW_AZBATCH_NODES=$NODES \
    CLW_AZBATCH_SLOTS=$SLOTS CLW_AZBATCH_IMAGE=$image \
    "$PY" "$PEER_DIR/selftest.py"
}

usage() {
  cat <<EOF
usage: $0 {install|start|stop|restart|status|env|state|requests|blobs|ctl JSON|reset|selftest|golden [ARGS]|parse [ARGS]|logs [N]|purge}
  base dir: $BASE
  Batch stand-in: http://127.0.0.1:$PORT (CLW_AZBATCH_PORT), Blob: http://127.0.0.1:$BLOB_PORT (CLW_AZBATCH_BLOB_PORT)
EOF
}

main() {
  local cmd=${1:-}
  [[ $# -gt 0 ]] && shift
  case $cmd in
  install) cmd_install ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  restart) cmd_stop && cmd_start ;;
  status) cmd_status ;;
  env) cmd_env ;;
  state) cmd_state ;;
  requests) cmd_requests ;;
  journal) cmd_journal ;;
  blobs) cmd_blobs ;;
  ctl) cmd_ctl "$@" ;;
  reset) cmd_reset ;;
  selftest) cmd_selftest ;;
  golden) cmd_py golden.py "$@" ;;
  parse) cmd_py parse.py "$@" ;;
  logs) cmd_logs "$@" ;;
  purge) cmd_purge ;;
  -h | --help | help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
  esac
}

main "$@"
