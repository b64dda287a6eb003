#!/usr/bin/env bash
# Kubernetes cluster stand-in for the kubernetes backend and bundle runtime: the
# kube-standin binary (tests/peers/kube-standin: crates.io kube-fake-client's in-memory
# Kubernetes API served over HTTP on 127.0.0.1, plus a node agent that schedules pods on
# fake nodes and runs their containers in the local Docker engine).
#
#   tests/peers/k8s.sh install          # kubectl (apt kubernetes-client if missing), venv with
#                                       # kubernetes-validate + the kubernetes client, cargo build
#   tests/peers/k8s.sh start            # installs if needed; no-op if running
#   eval "$(tests/peers/k8s.sh env)"    # KUBECONFIG, CLW_K8S_URL, CLW_K8S_TOKEN, CLW_K8S_PYTHON, ...
#   kubectl get nodes; kubectl create -f pod.yaml; kubectl get pods -l app=x
#   tests/peers/k8s.sh status           # exit 0 iff up and answering
#   tests/peers/k8s.sh logs [N]         # last N lines of the stand-in's log
#   tests/peers/k8s.sh reset            # restart: drops every object, fault and container
#   tests/peers/k8s.sh stop             # TERM (the stand-in removes its containers), then KILL
#   tests/peers/k8s.sh validate [FILE..] # kubernetes-validate --strict on every object created
#                                       # or replaced since start (or on FILEs); exit 1 on failures
#   tests/peers/k8s.sh selftest         # end-to-end check with kubectl + the Python client, on a
#                                       # private instance (own port and state)
# Fault controls (on the running stand-in; SELECTOR is a label selector, default: every pod):
#   tests/peers/k8s.sh unschedulable on|off [SELECTOR]    # PodScheduled=False, reason Unschedulable
#   tests/peers/k8s.sh image-pull-fail on|off [SELECTOR]  # waiting ErrImagePull -> ImagePullBackOff
#   tests/peers/k8s.sh config-error on|off [SELECTOR]     # waiting CreateContainerConfigError
#   tests/peers/k8s.sh lose-node NODE | restore-node NODE # NotReady; its pods Failed, reason NodeLost
#   tests/peers/k8s.sh unreachable-node NODE              # NotReady; its pods keep running, not Ready
#   tests/peers/k8s.sh faults | clear-faults              # show / drop every fault
#
# Everything lives in ${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}/k8s (CLW_K8S_BASE):
# venv/, run/ (pid, settings, token, kubeconfig), log/, state/ (objects/: the request body of
# every create/replace, for `validate`; pvcs/<ns>/<claim>: claim directories; pods/: volumes).
# Settings (env, with defaults; a running stand-in keeps those it was started with):
#   CLW_K8S_PORT=16443
#   CLW_K8S_NODES='name=node-a,cpu=4,memory=8Gi,gpu=2;name=node-b,cpu=2,memory=4Gi'
#       (';'-separated; keys: name cpu memory gpu pods ip label.K=V taint.K=V:EFFECT)
#   CLW_K8S_NAMESPACES='codalab'  (besides default, kube-system, kube-public, kube-node-lease)
#   CLW_K8S_TOKEN=''  (non-empty: requests must send "Authorization: Bearer <token>", else 401)
#   CLW_K8S_MAX_GRACE=15  (longest deletion grace honoured, seconds; Kubernetes' default pod grace is 30)
#   CLW_K8S_BIN  (the kube-standin binary; default: built here with cargo)
#   CLW_K8S_START_TIMEOUT=30  CLW_K8S_STOP_TIMEOUT=20
set -euo pipefail

RECIPE_VERSION=1
K8S_VERSION=1.36.0 # the API version served (k8s-openapi feature v1_36) and validated against
PIP_SPEC="kubernetes-validate==1.37.0 kubernetes==37.0.2"

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SELF="$ROOT/tests/peers/k8s.sh"
if [[ -z ${HOME:-} ]]; then
  HOME=$(getent passwd "$(id -u)" | cut -d: -f6)
  export HOME
fi
CACHE_ROOT=${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}
BASE=${CLW_K8S_BASE:-$CACHE_ROOT/k8s}
BASE=${BASE%/}
VENV=$BASE/venv
PY=$VENV/bin/python
VENV_ID="recipe=$RECIPE_VERSION pip=[$PIP_SPEC]"
RUN=$BASE/run
LOG=$BASE/log
STATE=$BASE/state
PID_FILE=$RUN/kube-standin.pid
SETTINGS_FILE=$RUN/settings.env
SERVER_LOG=$LOG/kube-standin.log
KUBECONFIG_FILE=$RUN/kubeconfig
TOKEN_FILE=$RUN/token

PORT=${CLW_K8S_PORT:-16443}
NODES=${CLW_K8S_NODES:-name=node-a,cpu=4,memory=8Gi,gpu=2;name=node-b,cpu=2,memory=4Gi}
NAMESPACES=${CLW_K8S_NAMESPACES:-codalab}
TOKEN=${CLW_K8S_TOKEN:-}
MAX_GRACE=${CLW_K8S_MAX_GRACE:-15}
START_TIMEOUT=${CLW_K8S_START_TIMEOUT:-30}
STOP_TIMEOUT=${CLW_K8S_STOP_TIMEOUT:-20}
# The stand-in is its own cargo workspace (see its Cargo.toml). Built under the workspace's own
# target dir by default (one dir to cache and to wipe), in a dir of its own there: a build of
# the workspace never waits for its lock, so scripts/test.sh builds it beside the first tests.
# (Few compiled crates would be shared: kube-fake-client's features differ from the
# workspace's.)
STANDIN_TARGET=${CLW_K8S_TARGET_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/standin}
BIN=${CLW_K8S_BIN:-$STANDIN_TARGET/debug/kube-standin}

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

log() { printf '[k8s] %s\n' "$*" >&2; }
die() {
  printf '[k8s] ERROR: %s\n' "$*" >&2
  exit 1
}
# shellcheck source=tests/peers/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $PORT =~ ^[0-9]+$ ]] || die "CLW_K8S_PORT must be a number, not '$PORT'"

SAVED_PORT='' SAVED_TOKEN='' SAVED_NODES='' SAVED_NAMESPACES=''
load_settings() {
  SAVED_PORT='' SAVED_TOKEN='' SAVED_NODES='' SAVED_NAMESPACES=''
  if [[ -f $SETTINGS_FILE ]]; then
    # shellcheck source=/dev/null
    . "$SETTINGS_FILE"
  fi
}
load_settings

use_saved_settings() {
  PORT=${SAVED_PORT:-$PORT}
  NODES=${SAVED_NODES:-$NODES}
  NAMESPACES=${SAVED_NAMESPACES:-$NAMESPACES}
  if [[ -n $SAVED_PORT ]]; then TOKEN=$SAVED_TOKEN; fi
}

url() { echo "http://127.0.0.1:$PORT"; }

server_pid() { live_pid "$PID_FILE" "--state-dir $STATE"; }

auth_args() { if [[ -n $TOKEN ]]; then printf '%s\n' -H "Authorization: Bearer $TOKEN"; fi; }

answers() {
  local a=()
  mapfile -t a < <(auth_args)
  curl -sf -m 3 -o /dev/null "${a[@]}" "$(url)/version" 2>/dev/null
}

api() { # api METHOD PATH [JSON BODY]
  local a=()
  mapfile -t a < <(auth_args)
  curl -sS -f -m 10 -X "$1" "${a[@]}" -H 'Content-Type: application/json' ${3:+--data "$3"} "$(url)$2"
}

# ---------------------------------------------------------------------------
# install
# ---------------------------------------------------------------------------
find_python() { find_venv_python CLW_K8S_PYTHON_BIN; }

venv_ok() {
  [[ -f $VENV/.clw-complete && $(<"$VENV/.clw-complete") == "$VENV_ID" ]] &&
    "$PY" -c 'import kubernetes, kubernetes_validate' 2>/dev/null
}

install_kubectl() {
  command -v kubectl >/dev/null 2>&1 && return 0
  log "kubectl missing: installing Debian's kubernetes-client"
  if [[ $(id -u) -ne 0 ]]; then die "kubectl is missing and installing it needs root (apt-get install kubernetes-client)"; fi
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >"$LOG/install-apt.log" 2>&1 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends kubernetes-client \
    >>"$LOG/install-apt.log" 2>&1 || { log_tail "$LOG/install-apt.log"; die "apt-get install kubernetes-client failed"; }
}

install_venv() {
  venv_ok && return 0
  mkdir -p "$LOG"
  local py
  py=$(find_python)
  log "installing $PIP_SPEC into $VENV"
  rm -rf "$VENV"
  "$py" -m venv "$VENV" >"$LOG/install-pip.log" 2>&1 </dev/null || { log_tail "$LOG/install-pip.log"; die "venv failed"; }
  # shellcheck disable=SC2086 # word splitting of the spec is intended
  "$VENV/bin/pip" install -q $PIP_SPEC >>"$LOG/install-pip.log" 2>&1 </dev/null ||
    { log_tail "$LOG/install-pip.log"; die "pip install failed (see $LOG/install-pip.log)"; }
  "$PY" -c 'import kubernetes, kubernetes_validate' 2>>"$LOG/install-pip.log" || die "the venv does not import kubernetes/kubernetes_validate"
  printf '%s' "$VENV_ID" >"$VENV/.clw-complete"
}

install_binary() {
  if [[ -n ${CLW_K8S_BIN:-} ]]; then
    [[ -x $BIN ]] || die "CLW_K8S_BIN=$BIN is not an executable"
    return 0
  fi
  # Built and no source newer: done. (A cargo build from inside `cargo test` sees another
  # environment and would rebuild dependencies for minutes.)
  if [[ -x $BIN ]] && [[ -z $(find "$ROOT/tests/peers/kube-standin" \( -name '*.rs' -o -name Cargo.toml -o -name Cargo.lock \) -newer "$BIN" -print -quit) ]]; then
    return 0
  fi
  log "cargo build (tests/peers/kube-standin, into $STANDIN_TARGET)"
  (cd "$ROOT" && CARGO_TARGET_DIR=$STANDIN_TARGET nice -n 10 cargo build -q --locked \
    --manifest-path tests/peers/kube-standin/Cargo.toml) >"$LOG/install-cargo.log" 2>&1 ||
    { log_tail "$LOG/install-cargo.log" 40; die "cargo build of kube-standin failed"; }
  [[ -x $BIN ]] || die "built, but $BIN is missing"
}

do_install() {
  local t0=$EPOCHREALTIME
  mkdir -p "$LOG" "$RUN" "$STATE"
  install_kubectl
  install_venv
  install_binary
  log "installed in $(elapsed "$t0") s: $BIN, kubectl $(kubectl version --client -o json 2>/dev/null | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])' 2>/dev/null || echo '?'), venv $VENV"
}

cmd_install() {
  exec </dev/null
  take_lock
  do_install
}

# ---------------------------------------------------------------------------
# start / stop
# ---------------------------------------------------------------------------
cmd_start() {
  exec </dev/null
  take_lock
  local pid
  if pid=$(server_pid); then
    use_saved_settings
    if answers; then
      log "already running (pid $pid, $(url))"
      return 0
    fi
    log "pid $pid does not answer on $(url); restarting it"
    stop_server >/dev/null || true
  fi
  local t0=$EPOCHREALTIME
  mkdir -p "$LOG" "$RUN" "$STATE"
  if ! venv_ok || ! command -v kubectl >/dev/null 2>&1 || [[ ! -x $BIN ]]; then
    do_install
  elif [[ -z ${CLW_K8S_BIN:-} ]]; then
    install_binary # incremental: quick when nothing changed
  fi
  rm -f "$PID_FILE" "$SETTINGS_FILE"
  if port_open "$PORT"; then
    die "port 127.0.0.1:$PORT is already in use; set CLW_K8S_PORT to another port"
  fi
  local args=(--port "$PORT" --state-dir "$STATE" --max-grace-seconds "$MAX_GRACE")
  local n
  IFS=';' read -r -a node_list <<<"$NODES"
  for n in "${node_list[@]}"; do [[ -n $n ]] && args+=(--node "$n"); done
  for n in $NAMESPACES; do args+=(--namespace "$n"); done
  rm -f "$TOKEN_FILE"
  if [[ -n $TOKEN ]]; then
    (umask 077 && printf '%s\n' "$TOKEN" >"$TOKEN_FILE")
    args+=(--token-file "$TOKEN_FILE")
  fi
  if [[ -f $SERVER_LOG ]] && (($(stat -c %s "$SERVER_LOG") > 20000000)); then
    mv -f "$SERVER_LOG" "$SERVER_LOG.1"
  fi
  printf '\n===== %s: starting kube-standin on 127.0.0.1:%s\n' "$(date -Is)" "$PORT" >>"$SERVER_LOG"
  setsid "$BIN" "${args[@]}" </dev/null >>"$SERVER_LOG" 2>&1 9>&- &
  pid=$!
  echo "$pid" >"$PID_FILE"
  local end=$((SECONDS + START_TIMEOUT))
  until answers; do
    if ! child_alive "$pid"; then
      log_tail "$SERVER_LOG"
      rm -f "$PID_FILE"
      die "kube-standin exited during start (log: $SERVER_LOG)"
    fi
    if ((SECONDS >= end)); then
      log_tail "$SERVER_LOG"
      stop_server >/dev/null || true
      die "kube-standin did not answer on $(url) within ${START_TIMEOUT} s"
    fi
    sleep 0.1
  done
  printf 'SAVED_PORT=%q\nSAVED_TOKEN=%q\nSAVED_NODES=%q\nSAVED_NAMESPACES=%q\n' \
    "$PORT" "$TOKEN" "$NODES" "$NAMESPACES" >"$SETTINGS_FILE"
  write_kubeconfig
  log "up in $(elapsed "$t0") s: kube-standin pid $pid on $(url); eval \"\$($0 env)\""
}

stop_server() {
  local pid
  if ! pid=$(server_pid); then
    rm -f "$PID_FILE" "$SETTINGS_FILE"
    return 1
  fi
  # TERM: the stand-in stops and removes every container it started, then exits.
  term_then_kill "kube-standin" "$pid" "$STOP_TIMEOUT"
  # Containers of a killed stand-in (its next start removes them too).
  local ids
  ids=$(docker ps -aq --filter "label=org.cl-worker-test.kube-standin.state=$STATE" 2>/dev/null || true)
  if [[ -n $ids ]]; then
    # shellcheck disable=SC2086
    docker rm -f $ids >/dev/null 2>&1 || true
  fi
  rm -f "$PID_FILE" "$SETTINGS_FILE"
  echo "$pid"
}

# ---------------------------------------------------------------------------
# status / env / logs / reset
# ---------------------------------------------------------------------------
need_running() {
  use_saved_settings
  server_pid >/dev/null && answers || die "kube-standin is not running on $(url) (start it with: $0 start)"
}

cmd_status() {
  use_saved_settings
  local pid
  if ! pid=$(server_pid); then
    echo "kube-standin stopped"
    return 1
  fi
  if ! answers; then
    echo "kube-standin running pid $pid but $(url) does not answer"
    return 1
  fi
  echo "kube-standin running pid $pid $(url) nodes [$NODES] faults $(api GET /standin/v1/faults)"
}

write_kubeconfig() {
  local user_block="    {}"
  if [[ -n $TOKEN ]]; then user_block="    token: $TOKEN"; fi
  (
    umask 077
    cat >"$KUBECONFIG_FILE.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kube-standin
  cluster:
    server: $(url)
contexts:
- name: kube-standin
  context:
    cluster: kube-standin
    user: kube-standin
    namespace: default
current-context: kube-standin
users:
- name: kube-standin
  user:
$user_block
EOF
    mv -f "$KUBECONFIG_FILE.tmp" "$KUBECONFIG_FILE"
  )
}

cmd_env() {
  use_saved_settings
  mkdir -p "$RUN"
  write_kubeconfig
  q() { printf 'export %s=%q\n' "$1" "$2"; }
  echo "# Kubernetes stand-in test peer (tests/peers/k8s.sh); use: eval \"\$(tests/peers/k8s.sh env)\""
  q KUBECONFIG "$KUBECONFIG_FILE"
  q CLW_K8S_URL "$(url)"
  q CLW_K8S_PORT "$PORT"
  q CLW_K8S_TOKEN "$TOKEN"
  q CLW_K8S_KUBECONFIG "$KUBECONFIG_FILE"
  q CLW_K8S_STATE "$STATE"
  q CLW_K8S_PVC_DIR "$STATE/pvcs"
  q CLW_K8S_PYTHON "$PY"
  q CLW_K8S_LOG "$SERVER_LOG"
}

cmd_logs() {
  local n=${1:-50}
  [[ $n =~ ^[0-9]+$ ]] || die "logs: N must be a number"
  if [[ -s $SERVER_LOG ]]; then
    echo "===== $SERVER_LOG"
    tail -n "$n" "$SERVER_LOG"
  fi
}

cmd_reset() {
  use_saved_settings
  # Restart with the settings it runs with: the in-memory API, faults and containers go.
  CLW_K8S_PORT=$PORT CLW_K8S_TOKEN=$TOKEN CLW_K8S_NODES=$NODES CLW_K8S_NAMESPACES=$NAMESPACES \
    bash -c "'$SELF' stop && '$SELF' start"
  rm -rf "$STATE/pvcs" "$STATE/pods"
  log "reset: every object, fault and container dropped"
}

# ---------------------------------------------------------------------------
# faults
# ---------------------------------------------------------------------------
# set_fault FIELD VALUE_JSON: read-modify-write of /standin/v1/faults.
set_fault() {
  need_running
  local cur new
  cur=$(api GET /standin/v1/faults) || die "cannot read faults"
  new=$(FIELD=$1 VALUE=$2 OP=${3:-set} python3 -c '
import json, os, sys
f = json.loads(sys.stdin.read())
field, value, op = os.environ["FIELD"], json.loads(os.environ["VALUE"]), os.environ["OP"]
if op == "add":
    f[field] = sorted(set(f.get(field, [])) | {value})
elif op == "remove":
    f[field] = [x for x in f.get(field, []) if x != value]
else:
    f[field] = value
print(json.dumps(f))' <<<"$cur")
  api PUT /standin/v1/faults "$new"
  echo
}

pod_fault() { # pod_fault FIELD on|off [SELECTOR]
  local field=$1 onoff=${2:-} sel=${3:-}
  case $onoff in
  on) set_fault "$field" "$(SEL=$sel python3 -c 'import json,os; print(json.dumps(os.environ["SEL"]))')" ;;
  off) set_fault "$field" null ;;
  *) die "usage: $0 ${field} on|off [SELECTOR]" ;;
  esac
}

# ---------------------------------------------------------------------------
# validate
# ---------------------------------------------------------------------------
cmd_validate() {
  venv_ok || { take_lock && install_venv && exec 9>&-; }
  local files=("$@")
  if [[ ${#files[@]} -eq 0 ]]; then
    shopt -s nullglob
    files=("$STATE"/objects/*.json)
    shopt -u nullglob
    if [[ ${#files[@]} -eq 0 ]]; then
      log "validate: no objects recorded in $STATE/objects"
      return 0
    fi
  fi
  local out rc=0
  out=$("$VENV/bin/kubernetes-validate" --strict --quiet --no-warn -k "$K8S_VERSION" "${files[@]}" 2>&1) || rc=$?
  local bad
  bad=$(grep -c '^ERROR' <<<"$out" || true)
  if [[ $rc -ne 0 || $bad -gt 0 ]]; then
    printf '%s\n' "$out"
    log "validate: $bad of ${#files[@]} object(s) do not validate (kubernetes-validate --strict, Kubernetes $K8S_VERSION)"
    return 1
  fi
  log "validate: all ${#files[@]} object(s) valid (kubernetes-validate --strict, Kubernetes $K8S_VERSION)"
}

# ---------------------------------------------------------------------------
# selftest
# ---------------------------------------------------------------------------
cmd_selftest() {
  exec </dev/null
  local sbase=$BASE/selftest sport=${CLW_K8S_SELFTEST_PORT:-16453}
  # A private instance: own state and port; shares this venv and binary.
  take_lock
  do_install
  exec 9>&-
  log "selftest: building the test image"
  bash "$ROOT/tests/peers/test-image.sh" >/dev/null || die "tests/peers/test-image.sh failed"
  mkdir -p "$sbase"
  rm -rf "$sbase/venv"
  ln -sfn "$VENV" "$sbase/venv"
  local env_vars=(CLW_K8S_BASE="$sbase" CLW_K8S_PORT="$sport" CLW_K8S_TOKEN=
    CLW_K8S_NODES='name=node-a,cpu=4,memory=8Gi,gpu=2;name=node-b,cpu=2,memory=4Gi,label.pool=small'
    CLW_K8S_NAMESPACES=codalab CLW_K8S_MAX_GRACE=2 CLW_K8S_BIN="$BIN")
  env "${env_vars[@]}" "$SELF" stop >/dev/null 2>&1 || true
  env "${env_vars[@]}" "$SELF" start || die "selftest: could not start a private instance"
  local rc=0
  env "${env_vars[@]}" CLW_K8S_SELFTEST_INNER=1 bash "$ROOT/tests/peers/k8s-selftest.sh" || rc=$?
  if [[ $rc -ne 0 ]]; then
    env "${env_vars[@]}" "$SELF" logs 60 >&2 || true
  fi
  env "${env_vars[@]}" "$SELF" stop || true
  return $rc
}

usage() {
  cat <<EOF
usage: $0 {install|start|stop|restart|status|env|logs [N]|reset|validate [FILE..]|selftest|
           unschedulable on|off [SEL]|image-pull-fail on|off [SEL]|config-error on|off [SEL]|
           lose-node NODE|unreachable-node NODE|restore-node NODE|faults|clear-faults|purge}
  base dir: $BASE
  API: $(url) (CLW_K8S_PORT), nodes: $NODES (CLW_K8S_NODES)
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
  logs) cmd_logs "$@" ;;
  reset) cmd_reset ;;
  validate) cmd_validate "$@" ;;
  selftest) cmd_selftest ;;
  unschedulable) pod_fault unschedulable "$@" ;;
  image-pull-fail) pod_fault imagePull "$@" ;;
  config-error) pod_fault configError "$@" ;;
  lose-node)
    [[ -n ${1:-} ]] || die "usage: $0 lose-node NODE"
    set_fault lostNodes "\"$1\"" add
    ;;
  unreachable-node)
    [[ -n ${1:-} ]] || die "usage: $0 unreachable-node NODE"
    set_fault unreachableNodes "\"$1\"" add
    ;;
  restore-node)
    [[ -n ${1:-} ]] || die "usage: $0 restore-node NODE"
    set_fault lostNodes "\"$1\"" remove >/dev/null
    set_fault unreachableNodes "\"$1\"" remove
    ;;
  faults)
    need_running
    api GET /standin/v1/faults
    echo
    ;;
  clear-faults)
    need_running
    api PUT /standin/v1/faults '{}'
    echo
    ;;
  purge) cmd_stop && rm -rf "$BASE" ;;
  -h | --help | help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
  esac
}

main "$@"
