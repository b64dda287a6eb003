#!/usr/bin/env bash
# Install, start and stop moto's AWS emulator (moto_server, PyPI moto[server]
# 5.2.5) on loopback, as a test peer for the aws-batch worker manager. It
# serves every AWS API moto knows (Batch, IAM, EC2, Secrets Manager, CloudWatch
# Logs, ...) on one port, with in-memory state.
#
#   tests/peers/moto.sh install            # venv with moto[server] + boto3; idempotent, fast when present
#   tests/peers/moto.sh start              # installs if needed; no-op if running
#   eval "$(tests/peers/moto.sh env)"      # AWS_ENDPOINT_URL, AWS_REGION, keys, CLW_MOTO_PYTHON, ...
#   eval "$(tests/peers/moto.sh setup-batch [QUEUE])"  # password from CLW_MOTO_CODALAB_PASSWORD
#                                          # role, compute env, job queue (default codalab-batch-cpu)
#                                          # and a Secrets Manager secret; prints CLW_MOTO_JOB_QUEUE_ARN,
#                                          # CLW_MOTO_SECRET_ARN, ... (idempotent)
#   tests/peers/moto.sh status             # exit 0 iff moto is up and answers
#   tests/peers/moto.sh reset              # drop all AWS state (POST /moto-api/reset), restore the batch mode
#   tests/peers/moto.sh mode [hold|simple|docker]   # show / switch the batch mode of a running moto
#   tests/peers/moto.sh logs [N]           # last N lines of the server log
#   tests/peers/moto.sh stop               # by pid: TERM, then KILL; idempotent
#   tests/peers/moto.sh restart | purge
#
# Batch modes (CLW_MOTO_BATCH_MODE, default hold; switch at runtime with `mode`):
#   hold    No container runs. A submitted job goes SUBMITTED -> PENDING ->
#           RUNNABLE -> STARTING -> RUNNING, one step every CLW_MOTO_STEP_SECONDS
#           (0.1), and stays in CLW_MOTO_HOLD_STATE (RUNNING; RUNNABLE = "no
#           capacity") until TerminateJob (any state) or CancelJob (up to
#           RUNNABLE) makes it FAILED with statusReason = the given reason
#           (container.exitCode 137 if it had started). The job's timeout
#           (attemptDurationSeconds) makes a RUNNING job FAILED with
#           "Job attempt duration exceeded timeout". Per job, through the
#           job's environment (definition or containerOverrides):
#             CLW_MOTO_HOLD_STATE=RUNNABLE|RUNNING|...  where this job stays
#             CLW_MOTO_RUN_SECONDS=N   finish N s after RUNNING, with
#             CLW_MOTO_EXIT_CODE=C     (default 0: SUCCEEDED, else FAILED)
#           This mode is moto's Docker backend with the container step replaced
#           (a small launcher patches moto.batch.models.Job.run).
#   simple  moto's own container-free backend ({"batch":{"use_docker":false}}):
#           SubmitJob returns an already SUCCEEDED job.
#   docker  moto's default: runs the job definition's image (must exist locally;
#           no registry) with the machine's Docker engine, network mode
#           CLW_MOTO_DOCKER_NETWORK_MODE (host).
#           The definition's secrets are resolved from moto's Secrets Manager
#           into the container's environment (as ECS does), never shown by
#           DescribeJobs. A job with a GPU resource requirement gets that many
#           of the instance's GPUs (CLW_MOTO_HOST_GPUS, by default the fake
#           ones of tests/peers/fake-gpu.sh) that no running job holds, by UUID
#           in NVIDIA_VISIBLE_DEVICES, as the ECS agent gives them. TerminateJob of a RUNNING job stops its containers as
#           ECS's StopTask does (SIGTERM, SIGKILL after 30 s; moto kills them at
#           once) and leaves the job FAILED with the reason.
# In every mode the launcher fixes two moto 5.2.5 bugs in DescribeJobs: with
# containerOverrides.environment, container.environment gained one more
# AWS_BATCH_JOB_ID entry per call; container.exitCode was never shown.
# moto's own reset keeps the batch config and state transitions; `reset` here
# restores both (batch mode as started, default transitions).
#
# Everything lives in $CLW_MOTO_BASE, by default
# ${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}/moto: venv/, wheelhouse/,
# run/ (pid, settings of the running server), log/.
# Settings (env, with defaults; a running server keeps the values it was
# started with, saved in run/settings.env):
#   CLW_MOTO_PORT=5055   CLW_MOTO_REGION=us-east-1
#   CLW_MOTO_BATCH_MODE=hold  CLW_MOTO_HOLD_STATE=RUNNING  CLW_MOTO_STEP_SECONDS=0.1
#   CLW_MOTO_DOCKER_NETWORK_MODE=host (docker mode only)
#   CLW_MOTO_START_TIMEOUT=30  CLW_MOTO_STOP_TIMEOUT=10
#   CLW_MOTO_PYTHON_BIN=python3.11 (or another Python >= 3.9 with venv; for install)
#   setup-batch: CLW_MOTO_CE_TYPE=MANAGED|UNMANAGED (MANAGED)  CLW_MOTO_SECRET_NAME=codalab-worker-password
#                CLW_MOTO_INSTANCE_TYPES=optimal (the managed compute environment's, comma-separated)
#                CLW_MOTO_CODALAB_PASSWORD=codalab (the secret's value; never an argument)
set -euo pipefail

# ---------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------
RECIPE_VERSION=1 # bump when the install steps change, to re-run them on old caches
MOTO_VERSION=5.2.5
# boto3/botocore: the versions moto 5.2.5 was verified with.
PIP_SPEC="moto[server]==$MOTO_VERSION boto3==1.44.5 botocore==1.44.5"

if [[ -z ${HOME:-} ]]; then
  HOME=$(getent passwd "$(id -u)" | cut -d: -f6)
  export HOME
fi
CACHE_ROOT=${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}
BASE=${CLW_MOTO_BASE:-$CACHE_ROOT/moto}
BASE=${BASE%/}
VENV=$BASE/venv
PY=$VENV/bin/python
WHEELHOUSE=$BASE/wheelhouse
RUN=$BASE/run
LOG=$BASE/log
PID_FILE=$RUN/moto.pid
SETTINGS_FILE=$RUN/settings.env
SERVER_LOG=$LOG/moto.log
LAUNCHER=$VENV/bin/clw-moto-server
VENV_ID="recipe=$RECIPE_VERSION pip=[$PIP_SPEC]"
VENV_MARKER=$VENV/.clw-complete

PORT=${CLW_MOTO_PORT:-5055}
REGION=${CLW_MOTO_REGION:-us-east-1}
MODE=${CLW_MOTO_BATCH_MODE:-hold}
HOLD_STATE=${CLW_MOTO_HOLD_STATE:-RUNNING}
STEP_SECONDS=${CLW_MOTO_STEP_SECONDS:-0.1}
DOCKER_NETWORK_MODE=${CLW_MOTO_DOCKER_NETWORK_MODE:-host}
START_TIMEOUT=${CLW_MOTO_START_TIMEOUT:-30}
STOP_TIMEOUT=${CLW_MOTO_STOP_TIMEOUT:-10}

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

log() { printf '[moto] %s\n' "$*" >&2; }
die() {
  printf '[moto] ERROR: %s\n' "$*" >&2
  exit 1
}
# shellcheck source=tests/peers/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $PORT =~ ^[0-9]+$ ]] || die "CLW_MOTO_PORT must be a number, not '$PORT'"

check_mode_settings() {
  case $MODE in hold | simple | docker) ;; *) die "CLW_MOTO_BATCH_MODE must be hold, simple or docker, not '$MODE'" ;; esac
  case $HOLD_STATE in SUBMITTED | PENDING | RUNNABLE | STARTING | RUNNING) ;;
  *) die "CLW_MOTO_HOLD_STATE must be one of SUBMITTED PENDING RUNNABLE STARTING RUNNING, not '$HOLD_STATE'" ;;
  esac
  [[ $STEP_SECONDS =~ ^[0-9]+([.][0-9]+)?$ ]] || die "CLW_MOTO_STEP_SECONDS must be a number, not '$STEP_SECONDS'"
}

# Settings of the running server (written by start, removed by stop).
SAVED_PORT='' SAVED_REGION='' SAVED_MODE='' SAVED_HOLD_STATE='' SAVED_STEP_SECONDS=''
load_settings() {
  SAVED_PORT='' SAVED_REGION='' SAVED_MODE='' SAVED_HOLD_STATE='' SAVED_STEP_SECONDS=''
  if [[ -f $SETTINGS_FILE ]]; then
    # shellcheck source=/dev/null
    . "$SETTINGS_FILE"
  fi
}
load_settings

use_saved_settings() {
  PORT=${SAVED_PORT:-$PORT}
  REGION=${SAVED_REGION:-$REGION}
  MODE=${SAVED_MODE:-$MODE}
  HOLD_STATE=${SAVED_HOLD_STATE:-$HOLD_STATE}
  STEP_SECONDS=${SAVED_STEP_SECONDS:-$STEP_SECONDS}
}

url() { echo "http://127.0.0.1:$PORT"; }

# ---------------------------------------------------------------------------
# Process helpers
# ---------------------------------------------------------------------------
# Prints the server's pid if it is running (and really ours), else fails.
server_pid() { live_pid "$PID_FILE" "$LAUNCHER"; }

# True if the moto on $PORT answers its management API.
answers() { curl -sf -m 3 -o /dev/null "$(url)/moto-api/config" 2>/dev/null; }

api() { # api METHOD PATH [JSON BODY]
  curl -sS -f -m 10 -X "$1" -H 'Content-Type: application/json' ${3:+--data "$3"} "$(url)$2"
}

# The JSON for /moto-api/config that selects batch mode $1.
mode_config() {
  case $1 in
  hold) printf '{"batch": {"use_docker": true, "clw_hold": true, "clw_hold_state": "%s", "clw_step_seconds": %s}}' \
    "$HOLD_STATE" "$STEP_SECONDS" ;;
  simple) printf '{"batch": {"use_docker": false}}' ;;
  docker) printf '{"batch": {"use_docker": true, "clw_hold": false}}' ;;
  *) die "unknown batch mode '$1' (hold, simple or docker)" ;;
  esac
}

# ---------------------------------------------------------------------------
# install
# ---------------------------------------------------------------------------
find_python() { find_venv_python CLW_MOTO_PYTHON_BIN; }

is_installed() {
  [[ -f $VENV_MARKER && $(<"$VENV_MARKER") == "$VENV_ID" ]] &&
    "$PY" -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("moto") and u.find_spec("boto3")))' 2>/dev/null
}

# Writes the server launcher (moto_server plus the batch patches) into the venv
# when it is missing or differs.
install_launcher() {
  local tmp=$LAUNCHER.tmp.$$
  {
    echo "#!$PY"
    launcher_source
  } >"$tmp"
  if cmp -s "$tmp" "$LAUNCHER"; then
    rm -f "$tmp"
  else
    chmod 755 "$tmp"
    mv "$tmp" "$LAUNCHER"
  fi
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
    "$VENV/bin/pip" wheel -q -w "$WHEELHOUSE" $PIP_SPEC >>"$LOG/install-pip.log" 2>&1 </dev/null || rc=$?
    if [[ $rc -ne 0 ]]; then
      log_tail "$LOG/install-pip.log"
      die "pip wheel failed (see $LOG/install-pip.log)"
    fi
    printf '%s' "$VENV_ID" >"$WHEELHOUSE/.clw-complete"
  fi
  # shellcheck disable=SC2086 # word splitting of the spec is intended
  "$VENV/bin/pip" install -q --no-index --find-links "$WHEELHOUSE" $PIP_SPEC \
    >>"$LOG/install-pip.log" 2>&1 </dev/null || rc=$?
  if [[ $rc -ne 0 ]]; then
    log_tail "$LOG/install-pip.log"
    die "pip install failed (see $LOG/install-pip.log)"
  fi
  "$PY" -c 'import moto, boto3' 2>>"$LOG/install-pip.log" ||
    die "moto/boto3 do not import in $VENV (see $LOG/install-pip.log)"
  printf '%s' "$VENV_ID" >"$VENV_MARKER"
  install_launcher
  log "installed moto $MOTO_VERSION in $(elapsed "$t0") s ($VENV)"
}

cmd_install() {
  exec </dev/null
  take_lock
  if is_installed; then
    install_launcher
    log "already installed: moto $MOTO_VERSION in $VENV"
    return 0
  fi
  do_install
}

# ---------------------------------------------------------------------------
# start / stop
# ---------------------------------------------------------------------------
cmd_start() {
  exec </dev/null
  check_mode_settings
  take_lock
  local pid
  if pid=$(server_pid); then
    local wanted="$PORT $REGION $MODE $HOLD_STATE $STEP_SECONDS"
    use_saved_settings
    if answers; then
      log "already running (pid $pid, $(url), batch mode $MODE)"
      if [[ $wanted != "$PORT $REGION $MODE $HOLD_STATE $STEP_SECONDS" ]]; then
        log "note: it runs with other settings than requested; use '$0 restart' to apply them"
      fi
      return 0
    fi
    log "pid $pid does not answer on $(url); restarting it"
    stop_server >/dev/null || true
  fi
  local t0=$EPOCHREALTIME
  is_installed || do_install
  install_launcher
  rm -f "$PID_FILE" "$SETTINGS_FILE"
  if port_open "$PORT"; then
    die "cannot start moto: port 127.0.0.1:$PORT is already in use ($(ss -ltnpH "sport = :$PORT" 2>/dev/null | head -1)). Set CLW_MOTO_PORT to another port."
  fi
  mkdir -p "$RUN" "$LOG"
  # Every request is logged: keep one old log, of at most about 50 MB.
  if [[ -f $SERVER_LOG ]] && (($(stat -c %s "$SERVER_LOG") > 50000000)); then
    mv -f "$SERVER_LOG" "$SERVER_LOG.1"
  fi
  printf '\n===== %s: starting moto_server on 127.0.0.1:%s (batch mode %s)\n' "$(date -Is)" "$PORT" "$MODE" >>"$SERVER_LOG"
  env -u MOTO_PORT CLW_MOTO_BATCH_MODE="$MODE" CLW_MOTO_HOLD_STATE="$HOLD_STATE" \
    CLW_MOTO_STEP_SECONDS="$STEP_SECONDS" MOTO_DOCKER_NETWORK_MODE="$DOCKER_NETWORK_MODE" \
    PYTHONUNBUFFERED=1 setsid "$LAUNCHER" -H 127.0.0.1 -p "$PORT" </dev/null >>"$SERVER_LOG" 2>&1 9>&- &
  pid=$!
  echo "$pid" >"$PID_FILE"
  local end=$((SECONDS + START_TIMEOUT))
  until answers; do
    if ! child_alive "$pid"; then
      log_tail "$SERVER_LOG"
      rm -f "$PID_FILE"
      die "moto_server exited during start (log: $SERVER_LOG)"
    fi
    if ((SECONDS >= end)); then
      log_tail "$SERVER_LOG"
      stop_server >/dev/null || true
      die "moto_server did not answer on $(url) within ${START_TIMEOUT} s (log: $SERVER_LOG)"
    fi
    sleep 0.1
  done
  printf 'SAVED_PORT=%s\nSAVED_REGION=%s\nSAVED_MODE=%s\nSAVED_HOLD_STATE=%s\nSAVED_STEP_SECONDS=%s\n' \
    "$PORT" "$REGION" "$MODE" "$HOLD_STATE" "$STEP_SECONDS" >"$SETTINGS_FILE"
  log "up in $(elapsed "$t0") s: moto $MOTO_VERSION pid $pid on $(url), batch mode $MODE$([[ $MODE == hold ]] && echo " (jobs stay $HOLD_STATE)"); eval \"\$($0 env)\""
}

stop_server() {
  local pid
  if ! pid=$(server_pid); then
    rm -f "$PID_FILE" "$SETTINGS_FILE"
    return 1
  fi
  # TERM: the launcher stops running jobs (docker mode: kills their containers) and exits.
  term_then_kill "moto_server" "$pid" "$STOP_TIMEOUT"
  rm -f "$PID_FILE" "$SETTINGS_FILE"
  echo "$pid"
}

# ---------------------------------------------------------------------------
# status / env / reset / mode / logs / purge
# ---------------------------------------------------------------------------
need_running() {
  use_saved_settings
  server_pid >/dev/null && answers || die "moto is not running on $(url) (start it with: $0 start)"
}

cmd_status() {
  use_saved_settings
  local pid
  if ! pid=$(server_pid); then
    echo "moto stopped"
    return 1
  fi
  if ! answers; then
    echo "moto running pid $pid but $(url) does not answer"
    return 1
  fi
  echo "moto running pid $pid $(url) region $REGION batch mode $MODE (started), config $(api GET /moto-api/config)"
}

cmd_env() {
  use_saved_settings
  q() { printf 'export %s=%q\n' "$1" "$2"; }
  echo "# moto AWS emulator test peer (tests/peers/moto.sh); use: eval \"\$(tests/peers/moto.sh env)\""
  q AWS_ENDPOINT_URL "$(url)"
  q AWS_ENDPOINT_URL_BATCH "$(url)"
  q AWS_REGION "$REGION"
  q AWS_DEFAULT_REGION "$REGION"
  q AWS_ACCESS_KEY_ID testing
  q AWS_SECRET_ACCESS_KEY testing
  q AWS_EC2_METADATA_DISABLED true
  q CLW_MOTO_URL "$(url)"
  q CLW_MOTO_PORT "$PORT"
  q CLW_MOTO_BATCH_MODE "$MODE"
  q CLW_MOTO_PYTHON "$PY"
  q CLW_MOTO_LOG "$SERVER_LOG"
}

cmd_reset() {
  exec </dev/null
  need_running
  api POST /moto-api/reset >/dev/null || die "POST $(url)/moto-api/reset failed"
  # Neither the batch config nor state transitions are part of moto's reset.
  api POST /moto-api/config "$(mode_config "$MODE")" >/dev/null || die "POST $(url)/moto-api/config failed"
  api POST /moto-api/state-manager/unset-transition '{"model_name": "batch::job"}' >/dev/null ||
    die "POST $(url)/moto-api/state-manager/unset-transition failed"
  log "reset: all state dropped; batch mode $MODE"
}

cmd_mode() {
  exec </dev/null
  need_running
  if [[ $# -gt 0 ]]; then
    case $1 in hold | simple | docker) ;; *) die "mode must be hold, simple or docker, not '$1'" ;; esac
    check_mode_settings
    api POST /moto-api/config "$(mode_config "$1")" >/dev/null || die "POST $(url)/moto-api/config failed"
    log "batch mode now $1 (until stop or reset)"
  fi
  api GET /moto-api/config
  echo
}

cmd_setup_batch() {
  exec </dev/null
  need_running
  # The password comes from the environment only: argv is readable by every user.
  [[ $# -le 1 ]] || die "setup-batch takes the queue name only; the password comes from CLW_MOTO_CODALAB_PASSWORD"
  local queue=${1:-codalab-batch-cpu} password=${CLW_MOTO_CODALAB_PASSWORD:-codalab}
  [[ $queue =~ ^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$ ]] || die "invalid job queue name '$queue'"
  local t0=$EPOCHREALTIME out
  # Assignments before the command (not `env VAR=…`, whose argv would hold them): bash hands
  # them to Python in its environment.
  out=$(AWS_ENDPOINT_URL="$(url)" AWS_REGION="$REGION" AWS_DEFAULT_REGION="$REGION" \
    AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_EC2_METADATA_DISABLED=true \
    CLW_QUEUE="$queue" CLW_PASSWORD="$password" CLW_CE_TYPE="${CLW_MOTO_CE_TYPE:-MANAGED}" \
    CLW_INSTANCE_TYPES="${CLW_MOTO_INSTANCE_TYPES:-optimal}" \
    CLW_SECRET_NAME="${CLW_MOTO_SECRET_NAME:-codalab-worker-password}" \
    "$PY" -c "$(setup_batch_source)") || die "setup-batch failed"
  printf '%s\n' "$out"
  log "setup-batch in $(elapsed "$t0") s: job queue $queue, secret ${CLW_MOTO_SECRET_NAME:-codalab-worker-password}"
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

# ---------------------------------------------------------------------------
# Python sources
# ---------------------------------------------------------------------------
# setup-batch: IAM roles, compute environment, job queue and secret, via boto3.
setup_batch_source() {
  cat <<'PYEOF'
import json, os, shlex, sys
import boto3
from botocore.exceptions import ClientError

queue, password = os.environ["CLW_QUEUE"], os.environ["CLW_PASSWORD"]
ce_type, secret_name = os.environ["CLW_CE_TYPE"].upper(), os.environ["CLW_SECRET_NAME"]
if ce_type not in ("MANAGED", "UNMANAGED"):
    sys.exit("CLW_MOTO_CE_TYPE must be MANAGED or UNMANAGED")
iam, ec2 = boto3.client("iam"), boto3.client("ec2")
batch, sm = boto3.client("batch"), boto3.client("secretsmanager")

def role(name, service):
    try:
        return iam.get_role(RoleName=name)["Role"]["Arn"]
    except iam.exceptions.NoSuchEntityException:
        doc = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow",
               "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]}
        return iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(doc))["Role"]["Arn"]

service_role = role("clw-batch-service-role", "batch.amazonaws.com")
execution_role = role("clw-batch-execution-role", "ecs-tasks.amazonaws.com")
instance_role = role("clw-batch-instance-role", "ec2.amazonaws.com")
try:
    profile = iam.get_instance_profile(InstanceProfileName="clw-batch-instance-profile")["InstanceProfile"]
except iam.exceptions.NoSuchEntityException:
    profile = iam.create_instance_profile(InstanceProfileName="clw-batch-instance-profile")["InstanceProfile"]
    iam.add_role_to_instance_profile(InstanceProfileName="clw-batch-instance-profile",
                                     RoleName="clw-batch-instance-role")

ce_name = f"{queue}-ce"[:128]
ces = batch.describe_compute_environments(computeEnvironments=[ce_name])["computeEnvironments"]
if ces:
    ce_arn = ces[0]["computeEnvironmentArn"]
else:
    kw = {}
    if ce_type == "MANAGED":
        subnets = [s["SubnetId"] for s in ec2.describe_subnets()["Subnets"]]
        sgs = [g["GroupId"] for g in ec2.describe_security_groups(GroupNames=["default"])["SecurityGroups"]]
        kw["computeResources"] = {"type": "EC2", "minvCpus": 0, "maxvCpus": 64, "desiredvCpus": 0,
                                  "instanceTypes": os.environ["CLW_INSTANCE_TYPES"].split(","), "subnets": subnets[:2],
                                  "securityGroupIds": sgs, "instanceRole": profile["Arn"]}
    ce_arn = batch.create_compute_environment(computeEnvironmentName=ce_name, type=ce_type,
        state="ENABLED", serviceRole=service_role, **kw)["computeEnvironmentArn"]

qs = batch.describe_job_queues(jobQueues=[queue])["jobQueues"]
if qs:
    queue_arn = qs[0]["jobQueueArn"]
else:
    queue_arn = batch.create_job_queue(jobQueueName=queue, state="ENABLED", priority=1,
        computeEnvironmentOrder=[{"order": 1, "computeEnvironment": ce_arn}])["jobQueueArn"]

try:
    secret_arn = sm.describe_secret(SecretId=secret_name)["ARN"]
    sm.put_secret_value(SecretId=secret_name, SecretString=password)
except sm.exceptions.ResourceNotFoundException:
    secret_arn = sm.create_secret(Name=secret_name, SecretString=password,
                                  Description="CodaLab password for cl-worker")["ARN"]

for k, v in [("CLW_MOTO_JOB_QUEUE", queue), ("CLW_MOTO_JOB_QUEUE_ARN", queue_arn),
             ("CLW_MOTO_COMPUTE_ENV_ARN", ce_arn), ("CLW_MOTO_SECRET_NAME", secret_name),
             ("CLW_MOTO_SECRET_ARN", secret_arn), ("CLW_MOTO_SERVICE_ROLE_ARN", service_role),
             ("CLW_MOTO_EXECUTION_ROLE_ARN", execution_role)]:
    print(f"export {k}={shlex.quote(v)}")
PYEOF
}

# The server: moto_server with the "hold" batch mode and two describe fixes.
launcher_source() {
  cat <<'PYEOF'
# moto_server for the cl-worker test peer (written by tests/peers/moto.sh).
# Batch mode from /moto-api/config {"batch": {...}}: "use_docker": false is
# moto's simple backend; "clw_hold": true replaces the Docker step of a job by
# holding it in "clw_hold_state" until it is terminated (see moto.sh).
import atexit
import datetime
import logging
import os
import sys
import threading
import time

from moto.core.models import default_user_config
import moto.batch.models as bm

logger = logging.getLogger("clw.moto")
ORDER = ["SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING"]

_mode = os.environ.get("CLW_MOTO_BATCH_MODE", "hold")
if _mode == "simple":
    default_user_config["batch"] = {"use_docker": False}
elif _mode == "docker":
    default_user_config["batch"] = {"use_docker": True, "clw_hold": False}
else:
    default_user_config["batch"] = {
        "use_docker": True,
        "clw_hold": True,
        "clw_hold_state": os.environ.get("CLW_MOTO_HOLD_STATE", "RUNNING"),
        "clw_step_seconds": float(os.environ.get("CLW_MOTO_STEP_SECONDS", "0.1")),
    }

_orig_run = bm.Job.run
_orig_terminate = bm.Job.terminate
_orig_container_details = bm.Job._container_details
_orig_get_container_property = bm.Job._get_container_property

def _job_env(job):
    props = job.job_definition.container_properties or {}
    env = {e["name"]: e["value"] for e in props.get("environment", [])}
    env.update({e["name"]: e["value"] for e in job.container_overrides.get("environment", [])})
    return env

def _sleep(job, seconds):
    """Sleeps up to `seconds`; True if the job was asked to stop."""
    end = time.monotonic() + seconds
    while not job.stop:
        left = end - time.monotonic()
        if left <= 0:
            return False
        job._clw_wake.wait(min(left, 0.25))
        job._clw_wake.clear()
    return True

def _hold(job, cfg):
    env = _job_env(job)
    hold_state = str(env.get("CLW_MOTO_HOLD_STATE") or cfg.get("clw_hold_state") or "RUNNING").upper()
    target = ORDER.index(hold_state) if hold_state in ORDER else len(ORDER) - 1
    step = float(env.get("CLW_MOTO_STEP_SECONDS") or cfg.get("clw_step_seconds", 0.1))
    for state in ORDER[1 : target + 1]:
        if _sleep(job, step):
            break
        if state == "STARTING":
            job.job_started_at = datetime.datetime.now()
            job.log_stream_name = job._stream_name
            try:
                job._log_backend.ensure_log_group(job._log_group)
                job._log_backend.ensure_log_stream(job._log_group, job.log_stream_name)
            except Exception:  # logs are a nicety
                pass
            job._start_attempt()
        job.status = state
        if state == "PENDING" and job.depends_on and not job._wait_for_dependencies():
            return
    if not job.stop:
        limit = None
        reason = None
        exit_code = None
        if job.status == "RUNNING":
            attempt = job._get_attempt_duration()
            if attempt:
                limit, reason = float(attempt), "Job attempt duration exceeded timeout"
            run = env.get("CLW_MOTO_RUN_SECONDS")
            if run is not None and (limit is None or float(run) < limit):
                limit, reason = float(run), "Essential container in task exited"
                exit_code = int(env.get("CLW_MOTO_EXIT_CODE") or 0)
        if not _sleep(job, limit if limit is not None else float("inf")):
            job.job_stopped_reason = reason
            job.exit_code = exit_code if exit_code is not None else (137 if reason else None)
            job._mark_stopped(success=exit_code == 0)
            return
    if job.status in ("STARTING", "RUNNING"):
        job.exit_code = 137
    job._mark_stopped(success=False)

def run(self):
    cfg = default_user_config.get("batch") or {}
    if not cfg.get("clw_hold"):
        return _orig_run(self)
    self._clw_wake = threading.Event()
    try:
        _hold(self, cfg)
    except Exception as err:
        logger.error("hold mode: job %s failed: %r", self.job_id, err)
        self._mark_stopped(success=False)

def terminate(self, reason):
    cfg = default_user_config.get("batch") or {}
    if (cfg.get("use_docker") and not cfg.get("clw_hold") and not self.stop
            and not getattr(self, "_clw_terminated", False) and self.status == "RUNNING"):
        # Docker mode, as ECS's StopTask stops a Batch job's task on EC2: `docker stop` of its
        # containers (SIGTERM, SIGKILL after ECS_CONTAINER_STOP_TIMEOUT, 30 s), the job FAILED
        # with the reason. (moto kills them at once, which no running job sees on AWS.)
        self._clw_terminated = True
        self.job_stopped_reason = reason
        name = f"{self.job_name}-{self.job_id}"  # "-<i>" added for multi-node jobs

        def graceful():
            try:
                for c in self.docker_client.containers.list():
                    if c.name == name or c.name.startswith(name + "-"):
                        c.stop(timeout=30)
            except Exception as err:  # the job's own loop still ends it
                logger.error("terminate: stopping %s: %r", name, err)
            _orig_terminate(self, reason)

        threading.Thread(target=graceful, daemon=True).start()
        return
    _orig_terminate(self, reason)
    wake = getattr(self, "_clw_wake", None)
    if wake is not None:
        wake.set()

_orig_mark_stopped = bm.Job._mark_stopped

def _mark_stopped(self, success=True):
    # A terminated job failed, even when its container exited 0 on SIGTERM.
    if getattr(self, "_clw_terminated", False):
        success = False
    _orig_mark_stopped(self, success=success)

def _resolved_secrets(job):
    """The definition's `secrets` with their values from moto's Secrets Manager, as ECS resolves
    them with the execution role when it starts the container."""
    from moto.secretsmanager.models import secretsmanager_backends
    out = []
    for s in (job.job_definition.container_properties or {}).get("secrets") or []:
        ref = s["valueFrom"]
        parts = ref.split(":")
        if ref.startswith("arn:") and len(parts) >= 7:
            account, region = parts[4], parts[3]
        else:
            account, region = job.backend.account_id, job.backend.region_name
        value = secretsmanager_backends[account][region].get_secret_value(ref, None, None)
        out.append({"name": s["name"], "value": value["SecretString"]})
    return out

def _get_container_property(self, p, default):
    # moto appends to containerOverrides.environment in place: copy it first.
    if p == "environment" and "environment" in self.container_overrides:
        saved = self.container_overrides
        self.container_overrides = dict(saved, environment=[dict(e) for e in saved["environment"]])
        try:
            env = _orig_get_container_property(self, p, default)
        finally:
            self.container_overrides = saved
    else:
        env = _orig_get_container_property(self, p, default)
    # Docker mode: the container's environment (built in the job's own thread) gets the
    # resolved secrets and, for a job asking for GPUs, the GPUs ECS gives it; DescribeJobs (a
    # request thread) never shows them.
    if p == "environment" and threading.current_thread() is self:
        env = list(env) + _resolved_secrets(self) + _assigned_gpus(self)
    return env

# The instance's GPUs (CLW_MOTO_HOST_GPUS, comma-separated UUIDs; by default the two of
# tests/peers/fake-gpu.sh) and which running job holds each.
HOST_GPUS = [g for g in os.environ.get("CLW_MOTO_HOST_GPUS",
             "GPU-11111111-1111-1111-1111-111111111111,GPU-22222222-2222-2222-2222-222222222222"
             ).split(",") if g]
_gpus_held = {}
_gpus_lock = threading.Lock()

def _assigned_gpus(job):
    """As the ECS agent does for a container with a GPU resource requirement: that many of
    the instance's GPUs no other running container holds, by UUID in NVIDIA_VISIBLE_DEVICES
    (the last free ones first, so that a program which ignores the variable and takes the
    first GPU is seen to)."""
    asked = sum(int(r.get("value") or 0)
                for r in _orig_get_container_property(job, "resourceRequirements", []) or []
                if r.get("type") == "GPU")
    if asked <= 0:
        return []
    with _gpus_lock:
        for other in [t for t in _gpus_held if not t.is_alive()]:
            del _gpus_held[other]
        held = {g for gs in _gpus_held.values() for g in gs}
        free = [g for g in HOST_GPUS if g not in held]
        if len(free) < asked:
            logger.error("job %s asks for %d GPUs, %d free", job.job_id, asked, len(free))
            return []
        given = free[-asked:]
        _gpus_held[job] = given
    logger.info("job %s given GPUs %s", job.job_id, ",".join(given))
    return [{"name": "NVIDIA_VISIBLE_DEVICES", "value": ",".join(given)}]

def _container_details(self):
    details = _orig_container_details(self)
    if self.exit_code is not None:
        details["exitCode"] = self.exit_code
    return details

bm.Job.run = run
bm.Job.terminate = terminate
bm.Job._mark_stopped = _mark_stopped
bm.Job._get_container_property = _get_container_property
bm.Job._container_details = _container_details

@atexit.register
def _stop_jobs():
    # Stop job threads (docker mode: kill and remove their containers) before exit.
    jobs = [t for t in threading.enumerate() if isinstance(t, bm.Job) and t.is_alive()]
    for job in jobs:
        job.stop = True
        wake = getattr(job, "_clw_wake", None)
        if wake is not None:
            wake.set()
    end = time.monotonic() + 8
    for job in jobs:
        job.join(max(0.0, end - time.monotonic()))

from moto.server import main

if __name__ == "__main__":
    sys.exit(main())
PYEOF
}

usage() {
  cat <<EOF
usage: $0 {install|start|stop|restart|status|env|reset|mode [hold|simple|docker]|setup-batch [QUEUE]|logs [N]|purge}
  base dir: $BASE
  moto_server: http://127.0.0.1:$PORT (CLW_MOTO_PORT), region $REGION, batch mode $MODE (CLW_MOTO_BATCH_MODE)
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
  reset) cmd_reset ;;
  mode) cmd_mode "$@" ;;
  setup-batch) cmd_setup_batch "$@" ;;
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
