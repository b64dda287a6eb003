#!/usr/bin/env bash
# Install, start and stop a REAL single-node Slurm 22.05 cluster (Debian 12
# packages: slurmctld, slurmd, slurm-client, munge; plus slurmdbd and a private
# MariaDB for sacct) on loopback, as a test peer for the Slurm worker manager.
#
#   tests/peers/slurm.sh install          # apt packages; idempotent, no-op when present
#   tests/peers/slurm.sh start            # installs if needed; fresh cluster; no-op if running
#   eval "$(tests/peers/slurm.sh env)"    # SLURM_CONF, CLW_SLURM_PARTITION, ...
#   tests/peers/slurm.sh status           # exit 0 iff every daemon is up and the node usable
#   tests/peers/slurm.sh logs [N]         # last N lines of each daemon log
#   tests/peers/slurm.sh stop             # cancels all jobs, stops every daemon; idempotent
#   tests/peers/slurm.sh restart          # stop + start
#   tests/peers/slurm.sh reset            # stop, wipe all state (job ids, accounting DB), start
#   tests/peers/slurm.sh purge            # stop and delete the whole base dir
#
# Everything (config, state, logs, sockets, accounting DB, fake GPU devices,
# a scratch dir for job output) lives in $CLW_SLURM_BASE, by default
# ${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}/slurm. Runs as root.
#
# Settings (env, with defaults; the values used by a running cluster are saved
# in $CLW_SLURM_BASE/run/settings.env and win while it runs):
#   CLW_SLURM_PORT_BASE=6917 (or PORT_BASE)  slurmctld=+0 slurmd=+1 slurmdbd=+2
#   CLW_SLURM_ACCT=1 (or ACCT)   1: slurmdbd + private MariaDB (unix socket only,
#                                no TCP port), so sacct works; 0: no sacct
#   CLW_SLURM_CPUS=max(nproc,4)      CLW_SLURM_MEMORY_MB=16384 (declared)
#   CLW_SLURM_GPUS=2 (fake)      CLW_SLURM_MIN_JOB_AGE=600 (s a finished job stays in squeue)
#   CLW_SLURM_KILL_WAIT=30 (s between SIGTERM and SIGKILL, Slurm's default)
#   CLW_SLURM_GRACE_TIME=10 (s a preempted "spot" job runs on after its SIGTERM, as sites give
#                           preempted jobs time to checkpoint; Slurm's default 0 kills it at once)
#   CLW_SLURM_JOB_REQUEUE=0      (0: a node failure ends a job in NODE_FAIL; 1: requeue it)
#   CLW_SLURM_PROCTRACK=pgid     (pgid also kills a job's orphaned background processes;
#                                linuxproc loses them once their parent exits)
#   CLW_SLURM_CGROUP=0           1: task/cgroup (cgroup v1 memory controller needed) enforces
#                                --mem; a job above it ends OUT_OF_MEMORY. 0: no cgroups, --mem
#                                is only scheduled, not enforced.
#   CLW_SLURM_OVER_MEMORY_KILL=0 1: without cgroups, poll job RSS every 2 s and SIGKILL jobs
#                                above --mem (they end FAILED 0:9, not OUT_OF_MEMORY)
#   CLW_SLURM_START_TIMEOUT=60   CLW_SLURM_STOP_TIMEOUT=15
# Partitions: "debug" (Default=YES), "spot" (the same with GraceTime) and "urgent" (Default=NO,
# higher PriorityTier): a job in "urgent" preempts (PreemptMode=CANCEL) debug jobs at once ->
# PREEMPTED, and spot jobs after SIGTERM and GraceTime (Slurm 22.05 then records TIMEOUT).
# Job ids keep increasing across stop/start (only `reset` restarts them at 1).
set -euo pipefail

# ---------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------
if [[ -z ${HOME:-} ]]; then
  HOME=$(getent passwd "$(id -u)" | cut -d: -f6)
  export HOME
fi
export PATH="$PATH:/usr/sbin:/sbin"
CACHE_ROOT=${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}
BASE=${CLW_SLURM_BASE:-$CACHE_ROOT/slurm}
BASE=${BASE%/}

ETC=$BASE/etc
RUN=$BASE/run
LOG=$BASE/log
MUNGE_DIR=$BASE/munge
MSOCK=$MUNGE_DIR/munge.socket
DB_DIR=$BASE/mysql
DB_SOCK=$RUN/mysql.sock
JOBS_DIR=$BASE/jobs
DEV_DIR=$BASE/dev
SETTINGS_FILE=$RUN/settings.env
CONF=$ETC/slurm.conf
export SLURM_CONF=$CONF

CLUSTER=clw
PARTITION=debug
URGENT_PARTITION=urgent
NODE=clw-node
MARKER=CLW_SLURM_PEER # env var set on every daemon we start, to find them again

# Settings of the running cluster (written by start, removed by stop).
load_settings() {
  SAVED_PORT_BASE='' SAVED_ACCT='' SAVED_CPUS='' SAVED_MEMORY_MB='' SAVED_GPUS='' SAVED_CGROUP=''
  if [[ -f $SETTINGS_FILE ]]; then
    # shellcheck source=/dev/null
    . "$SETTINGS_FILE"
  fi
}
load_settings

# 16384 MB declared (SlurmdParameters=config_overrides: Slurm takes the node as declared), so
# that CodaLab's documented worker shape, `--cpus 4 --gpus 1 --memory-mb 16000`, fits the node as
# written; nothing enforces it without CLW_SLURM_CGROUP=1.
default_memory_mb() {
  echo 16384
}

PORT_BASE=${CLW_SLURM_PORT_BASE:-${PORT_BASE:-6917}}
ACCT=${CLW_SLURM_ACCT:-${ACCT:-1}}
# At least 4 CPUs (overcommitted on a 2-core machine): tests run several 1-CPU workers at once.
CPUS=${CLW_SLURM_CPUS:-$(($(nproc) > 4 ? $(nproc) : 4))}
MEMORY_MB=${CLW_SLURM_MEMORY_MB:-$(default_memory_mb)}
GPUS=${CLW_SLURM_GPUS:-2}
MIN_JOB_AGE=${CLW_SLURM_MIN_JOB_AGE:-600}
KILL_WAIT=${CLW_SLURM_KILL_WAIT:-30}
GRACE_TIME=${CLW_SLURM_GRACE_TIME:-10}
JOB_REQUEUE=${CLW_SLURM_JOB_REQUEUE:-0}
OVER_MEMORY_KILL=${CLW_SLURM_OVER_MEMORY_KILL:-0}
PROCTRACK=${CLW_SLURM_PROCTRACK:-pgid}
CGROUP=${CLW_SLURM_CGROUP:-0}
START_TIMEOUT=${CLW_SLURM_START_TIMEOUT:-60}
STOP_TIMEOUT=${CLW_SLURM_STOP_TIMEOUT:-15}

APT_BASE=(slurmctld slurmd slurm-client munge)
APT_ACCT=(slurmdbd mariadb-server)

log() { printf '[slurm] %s\n' "$*" >&2; }
die() {
  printf '[slurm] ERROR: %s\n' "$*" >&2
  exit 1
}
# shellcheck source=tests/peers/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $(id -u) -eq 0 ]] || die "must run as root (the daemons and jobs run as root)"
[[ $ACCT == 0 || $ACCT == 1 ]] || die "CLW_SLURM_ACCT must be 0 or 1, not '$ACCT'"
[[ $PORT_BASE =~ ^[0-9]+$ ]] || die "CLW_SLURM_PORT_BASE must be a number, not '$PORT_BASE'"

# When a cluster is running, its saved settings describe it (env/status/stop).
use_saved_settings() {
  PORT_BASE=${SAVED_PORT_BASE:-$PORT_BASE}
  ACCT=${SAVED_ACCT:-$ACCT}
  CPUS=${SAVED_CPUS:-$CPUS}
  MEMORY_MB=${SAVED_MEMORY_MB:-$MEMORY_MB}
  GPUS=${SAVED_GPUS:-$GPUS}
  CGROUP=${SAVED_CGROUP:-$CGROUP}
}

set_ports() {
  CTLD_PORT=$PORT_BASE
  SLURMD_PORT=$((PORT_BASE + 1))
  DBD_PORT=$((PORT_BASE + 2))
}
set_ports

# Serialise install/start/stop between concurrent callers. Daemons are started
# with fd 9 closed so that they never inherit the lock.
take_lock() {
  mkdir -p "$BASE"
  exec 9>"$BASE/.lock"
  flock -w 300 9 || die "timed out waiting for $BASE/.lock"
  load_settings # another caller may have started or stopped the cluster meanwhile
}

# ---------------------------------------------------------------------------
# Process helpers
# ---------------------------------------------------------------------------
SERVICES=(munged mariadb slurmdbd slurmctld slurmd) # start order; stop is reversed

pid_file() { echo "$RUN/$1.pid"; }

# True if pid $1 is alive (not a zombie) and was started by this script for this BASE.
is_ours() {
  local pid=$1 state
  [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/environ ]] || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ $state != Z ]] || return 1
  { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -qxF "$MARKER=$BASE"
}

# Prints the pid of service $1 if it is running, else fails.
service_pid() {
  local f pid
  f=$(pid_file "$1")
  [[ -f $f ]] || return 1
  pid=$(<"$f")
  is_ours "$pid" || return 1
  echo "$pid"
}

# Every live process started by this script for this BASE (daemons, slurmstepd),
# and, with "jobs", also the processes of jobs run by this cluster (their
# environment names our slurm.conf and node; clients like squeue have no
# SLURMD_NODENAME).
our_pids() {
  local p e nl=$'\n'
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [[ $p == "$$" || $p == "$BASHPID" ]] && continue
    e=$({ tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null) || continue
    e=$nl$e$nl
    if [[ $e == *"${nl}$MARKER=$BASE${nl}"* ]] ||
      [[ ${1:-} == jobs && $e == *"${nl}SLURM_CONF=$CONF${nl}"* &&
        $e == *"${nl}SLURMD_NODENAME=$NODE${nl}"* && $e == *"${nl}SLURM_JOB_ID="* ]]; then
      [[ $(awk '{print $3}' "/proc/$p/stat" 2>/dev/null) == Z ]] || echo "$p"
    fi
  done
  return 0
}

# launch NAME CMD...: run CMD in the foreground of its own session, in the background.
launch() {
  local name=$1
  shift
  printf '\n===== %s: starting %s\n' "$(date -Is)" "$name" >>"$LOG/$name.out"
  env "$MARKER=$BASE" SLURM_CONF="$CONF" setsid "$@" </dev/null >>"$LOG/$name.out" 2>&1 9>&- &
  echo $! >"$(pid_file "$name")"
}

# wait_for SECONDS CMD...: poll CMD (quietly) every 0.2 s.
wait_for() {
  local t=$1
  shift
  local end=$((SECONDS + t))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS >= end)) && return 1
    sleep 0.2
  done
}

wait_gone() { # pid seconds
  local pid=$1 i
  for ((i = 0; i < $2 * 10; i++)); do
    is_ours "$pid" || return 0
    sleep 0.1
  done
  return 1
}

stop_service() {
  local name=$1 pid
  if ! pid=$(service_pid "$name"); then
    rm -f "$(pid_file "$name")"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  if ! wait_gone "$pid" "$STOP_TIMEOUT"; then
    log "$name (pid $pid) did not stop after TERM; sending KILL"
    kill -KILL "$pid" 2>/dev/null || true
    wait_gone "$pid" 3 || true
  fi
  rm -f "$(pid_file "$name")"
}

check_port_free() {
  local name=$1 port=$2
  if port_open "$port" || ss -ltnH "sport = :$port" 2>/dev/null | grep -q .; then
    die "cannot start $name: port $port is already in use ($(ss -ltnpH "sport = :$port" 2>/dev/null | head -1)). Set CLW_SLURM_PORT_BASE to another base port."
  fi
}

munge_ok() { munge -S "$MSOCK" -n </dev/null | unmunge -S "$MSOCK" >/dev/null; }
db() { mariadb --no-defaults --socket="$DB_SOCK" -uroot "$@"; }
node_usable() { sinfo -h -n "$NODE" -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)$'; }

# ---------------------------------------------------------------------------
# install
# ---------------------------------------------------------------------------
wanted_packages() {
  echo "${APT_BASE[@]}"
  [[ $ACCT == 1 ]] && echo "${APT_ACCT[@]}"
  return 0
}

missing_packages() {
  local p
  for p in $(wanted_packages); do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
  done
}

do_install() {
  local missing
  missing=$(missing_packages | tr '\n' ' ')
  missing=${missing% }
  [[ -z $missing ]] && return 0
  command -v apt-get >/dev/null || die "apt-get not found; install by hand: $missing"
  mkdir -p "$LOG"
  log "apt: installing $missing"
  # Never let the packages start the system's own munge/slurm/mariadb services.
  local policy=/usr/sbin/policy-rc.d made_policy=0 rc=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    made_policy=1
  fi
  # shellcheck disable=SC2086 # word splitting of the package list is intended
  {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold $missing ||
      {
        DEBIAN_FRONTEND=noninteractive apt-get update -q &&
          DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold $missing
      }
  } >"$LOG/install-apt.log" 2>&1 </dev/null || rc=$?
  [[ $made_policy -eq 1 ]] && rm -f "$policy"
  if [[ $rc -ne 0 ]]; then
    log_tail "$LOG/install-apt.log"
    die "apt-get failed (see $LOG/install-apt.log)"
  fi
}

cmd_install() {
  exec </dev/null
  take_lock
  if [[ -z $(missing_packages) ]]; then
    log "already installed: $(wanted_packages | tr '\n' ' ')"
    return 0
  fi
  do_install
  log "installed"
}

# ---------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------
write_config() {
  local h acct comm='' gpu_last reqs last_id
  h=$(hostname -s)
  # Bind to the loopback address only when the host name resolves to it
  # (NoCtldInAddrAny binds to what the host name resolves to).
  if [[ $(getent ahostsv4 "$h" 2>/dev/null | awk '{print $1; exit}') == 127.0.0.1 ]]; then
    comm='CommunicationParameters=NoCtldInAddrAny,NoInAddrAny'
  fi
  acct='AccountingStorageType=accounting_storage/none'
  if [[ $ACCT == 1 ]]; then
    acct="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$MSOCK
AccountingStorageTRES=gres/gpu
AccountingStoreFlags=job_comment"
  fi
  reqs="JobAcctGatherParams=NoShared"
  [[ $OVER_MEMORY_KILL == 1 ]] && reqs="JobAcctGatherParams=NoShared,OverMemoryKill"
  last_id=$(last_job_id)
  gpu_last=$((GPUS - 1))

  cat >"$CONF" <<EOF
# Generated by tests/peers/slurm.sh; rewritten on every start.
ClusterName=$CLUSTER
SlurmctldHost=$h(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MSOCK
$comm
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
StateSaveLocation=$BASE/spool/ctld
SlurmdSpoolDir=$BASE/spool/d
SlurmctldPidFile=$RUN/slurmctld.daemon.pid
SlurmdPidFile=$RUN/slurmd.daemon.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
FirstJobId=$((last_id + 1))
MailProg=/bin/true
ProctrackType=proctrack/$PROCTRACK
TaskPlugin=task/$([[ $CGROUP == 1 ]] && echo cgroup || echo none)
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=2
$reqs
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG/jobcomp.txt
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=256
GresTypes=gpu
MinJobAge=$MIN_JOB_AGE
KillWait=$KILL_WAIT
OverTimeLimit=0
InactiveLimit=0
JobRequeue=$JOB_REQUEUE
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
$acct
NodeName=$NODE NodeHostname=$h NodeAddr=127.0.0.1 CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEMORY_MB Gres=gpu:$GPUS State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE PriorityTier=1 State=UP
PartitionName=spot Nodes=$NODE Default=NO MaxTime=INFINITE PriorityTier=1 GraceTime=$GRACE_TIME State=UP
PartitionName=$URGENT_PARTITION Nodes=$NODE Default=NO MaxTime=INFINITE PriorityTier=10 State=UP
EOF

  if [[ $CGROUP == 1 ]]; then
    cat >"$ETC/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
CgroupAutomount=no
ConstrainCores=no
ConstrainRAMSpace=yes
ConstrainSwapSpace=no
ConstrainDevices=no
EOF
  else
    rm -f "$ETC/cgroup.conf"
  fi
  {
    echo "AutoDetect=off"
    if ((GPUS > 0)); then
      echo "NodeName=$NODE Name=gpu File=$DEV_DIR/nvidia[0-$gpu_last]"
    fi
  } >"$ETC/gres.conf"
  if ((GPUS == 0)); then
    sed -i -e 's/ Gres=gpu:0//' "$CONF"
  fi

  if [[ $ACCT == 1 ]]; then
    cat >"$ETC/slurmdbd.conf" <<EOF
# Generated by tests/peers/slurm.sh
AuthType=auth/munge
AuthInfo=socket=$MSOCK
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
LogFile=$LOG/slurmdbd.log
PidFile=$RUN/slurmdbd.daemon.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$ETC/slurmdbd.conf"
  fi
}

# Highest job id ever handed out by this BASE, so that ids keep increasing
# across stop/start (slurmctld starts with -c, i.e. from an empty state).
last_job_id() {
  local m=0 v
  if [[ -f $LOG/jobcomp.txt ]]; then
    v=$(grep -o 'JobId=[0-9]*' "$LOG/jobcomp.txt" | cut -d= -f2 | sort -n | tail -1)
    [[ -n $v ]] && ((v > m)) && m=$v
  fi
  if [[ -f $RUN/last-job-id ]]; then
    v=$(<"$RUN/last-job-id")
    [[ $v =~ ^[0-9]+$ ]] && ((v > m)) && m=$v
  fi
  if [[ $ACCT == 1 ]] && service_pid mariadb >/dev/null; then
    v=$(db -N -e "SELECT COALESCE(MAX(id_job),0) FROM slurm_acct_db.${CLUSTER}_job_table" 2>/dev/null || true)
    [[ $v =~ ^[0-9]+$ ]] && ((v > m)) && m=$v
  fi
  echo "$m"
}

# ---------------------------------------------------------------------------
# start
# ---------------------------------------------------------------------------
start_munged() {
  service_pid munged >/dev/null && return 0
  mkdir -p "$MUNGE_DIR"
  chmod 711 "$MUNGE_DIR"
  if [[ ! -s $MUNGE_DIR/munge.key ]]; then
    head -c 1024 /dev/urandom >"$MUNGE_DIR/munge.key"
  fi
  chmod 400 "$MUNGE_DIR/munge.key"
  rm -f "$MSOCK" "$MSOCK.lock"
  launch munged munged --foreground --force --socket="$MSOCK" --key-file="$MUNGE_DIR/munge.key" \
    --pid-file="$RUN/munged.daemon.pid" --log-file="$LOG/munged.log" --seed-file="$MUNGE_DIR/munged.seed"
  wait_for 10 munge_ok || fail_start munged
}

start_mariadb() {
  service_pid mariadb >/dev/null && return 0
  if [[ ! -f $DB_DIR/.clw-initialised ]]; then
    rm -rf "$DB_DIR"
    mkdir -p "$DB_DIR"
    if ! mariadb-install-db --no-defaults --user=root --datadir="$DB_DIR" \
      --auth-root-authentication-method=socket --skip-test-db \
      >"$LOG/mariadb-install-db.log" 2>&1 </dev/null; then
      log_tail "$LOG/mariadb-install-db.log"
      die "mariadb-install-db failed"
    fi
    touch "$DB_DIR/.clw-initialised"
  fi
  rm -f "$DB_SOCK"
  # Unix socket only (no TCP port); speed over durability.
  launch mariadb mariadbd --no-defaults --user=root --datadir="$DB_DIR" --socket="$DB_SOCK" \
    --skip-networking --pid-file="$RUN/mariadb.daemon.pid" --log-error="$LOG/mariadb.log" \
    --innodb-buffer-pool-size=64M --innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0 \
    --innodb-lock-wait-timeout=900 --skip-log-bin
  wait_for 30 db -e 'SELECT 1' || fail_start mariadb
}

start_slurmdbd() {
  service_pid slurmdbd >/dev/null && return 0
  check_port_free slurmdbd "$DBD_PORT"
  # StorageHost=localhost + MYSQL_UNIX_PORT: the MariaDB client library uses our socket.
  launch slurmdbd env MYSQL_UNIX_PORT="$DB_SOCK" slurmdbd -D
  wait_for 60 sacctmgr -n list cluster || fail_start slurmdbd
  if ! sacctmgr -n -P list cluster format=cluster 2>/dev/null | grep -qx "$CLUSTER"; then
    sacctmgr -i add cluster "$CLUSTER" >>"$LOG/slurmdbd.out" 2>&1 || fail_start slurmdbd
  fi
}

start_slurmctld() {
  service_pid slurmctld >/dev/null && return 0
  check_port_free slurmctld "$CTLD_PORT"
  # -c: empty state (no old jobs, no saved DOWN/DRAIN node state)
  launch slurmctld slurmctld -D -c -f "$CONF"
  wait_for 30 scontrol ping || fail_start slurmctld
}

start_slurmd() {
  service_pid slurmd >/dev/null && return 0
  check_port_free slurmd "$SLURMD_PORT"
  launch slurmd slurmd -D -f "$CONF" -N "$NODE"
}

fail_start() {
  local s
  log "$1 did not come up"
  for s in "${SERVICES[@]}"; do
    log_tail "$LOG/$s.out" 15
  done
  log_tail "$LOG/slurmctld.log" 30
  log_tail "$LOG/slurmd.log" 30
  log_tail "$LOG/slurmdbd.log" 30
  log_tail "$LOG/mariadb.log" 15
  stop_all >/dev/null 2>&1 || true
  die "start failed ($1); logs in $LOG"
}

wanted_services() {
  echo munged
  [[ $ACCT == 1 ]] && echo mariadb slurmdbd
  echo slurmctld slurmd
}

all_up() {
  local s
  for s in $(wanted_services); do
    service_pid "$s" >/dev/null || return 1
  done
  node_usable
}

cmd_start() {
  exec </dev/null
  take_lock
  if [[ -n $SAVED_ACCT ]] && service_pid slurmctld >/dev/null; then
    local wanted="$PORT_BASE $ACCT $CPUS $MEMORY_MB $GPUS $CGROUP"
    use_saved_settings
    set_ports
    if all_up; then
      log "already running (SLURM_CONF=$CONF)"
      if [[ $wanted != "$PORT_BASE $ACCT $CPUS $MEMORY_MB $GPUS $CGROUP" ]]; then
        log "note: it runs with other settings than requested; use '$0 restart' to apply them"
      fi
      return 0
    fi
  fi
  if [[ $CGROUP == 1 && ! -d /sys/fs/cgroup/memory ]]; then
    die "CLW_SLURM_CGROUP=1 needs the cgroup v1 memory controller at /sys/fs/cgroup/memory"
  fi
  local t0=$EPOCHREALTIME
  [[ -z $(missing_packages) ]] || do_install
  stop_all # leftovers of an earlier, interrupted run; stale pid files
  (( ${#MSOCK} < 100 && ${#DB_SOCK} < 100 )) || die "base dir path too long for unix sockets: $BASE; set CLW_SLURM_BASE"
  mkdir -p "$ETC" "$RUN" "$LOG" "$BASE/spool/ctld" "$BASE/spool/d" "$DEV_DIR" "$JOBS_DIR"
  chmod 1777 "$JOBS_DIR"
  rm -rf "$BASE/spool/d"/* # stale step sockets of killed jobs
  local i
  for ((i = 0; i < GPUS; i++)); do
    [[ -c $DEV_DIR/nvidia$i ]] || { rm -f "$DEV_DIR/nvidia$i"; mknod -m 666 "$DEV_DIR/nvidia$i" c 1 3; }
  done
  rm -f "$SETTINGS_FILE"
  start_munged
  if [[ $ACCT == 1 ]]; then
    start_mariadb
  fi
  write_config # after MariaDB: FirstJobId also looks at the accounting DB
  if [[ $ACCT == 1 ]]; then
    start_slurmdbd
  fi
  start_slurmctld
  start_slurmd
  wait_for "$START_TIMEOUT" node_usable || fail_start "slurmd (node $NODE not idle: $(sinfo -h -n "$NODE" -o '%T %E' 2>&1 | head -1))"
  printf 'SAVED_PORT_BASE=%s\nSAVED_ACCT=%s\nSAVED_CPUS=%s\nSAVED_MEMORY_MB=%s\nSAVED_GPUS=%s\nSAVED_CGROUP=%s\n' \
    "$PORT_BASE" "$ACCT" "$CPUS" "$MEMORY_MB" "$GPUS" "$CGROUP" >"$SETTINGS_FILE"
  log "up in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}') s: node $NODE (${CPUS} CPUs, ${MEMORY_MB} MB, ${GPUS} fake GPUs), partition $PARTITION, ports $CTLD_PORT-$((CTLD_PORT + 1 + ACCT)), sacct $([[ $ACCT == 1 ]] && echo on || echo off); SLURM_CONF=$CONF"
}

# ---------------------------------------------------------------------------
# stop
# ---------------------------------------------------------------------------
active_jobs() { squeue -h -t PD,R,CG,S,CF,RQ,RS,RH,SI,SO,ST -o %i 2>/dev/null; }

stop_all() {
  local ids pid i left
  if service_pid slurmctld >/dev/null && scontrol ping >/dev/null 2>&1; then
    # Remember the highest job id; the next start continues after it.
    ids=$(squeue -h -t all -o %i 2>/dev/null | sed 's/_.*//' | sort -n | tail -1 || true)
    [[ $ids =~ ^[0-9]+$ ]] && echo "$ids" >"$RUN/last-job-id"
    # Cancel every job so that no job process or slurmstepd outlives the cluster.
    ids=$(active_jobs | tr '\n' ' ')
    if [[ -n ${ids// /} ]]; then
      # shellcheck disable=SC2086 # one argument per job id
      scancel $ids >/dev/null 2>&1 || true
      wait_for $((KILL_WAIT + 10)) sh -c '[ -z "$(squeue -h -t R,CG,S,CF,SI,SO,ST -o %i 2>/dev/null)" ]' || true
    fi
    # Let slurmctld hand its queued job records to slurmdbd first.
    if service_pid slurmdbd >/dev/null; then
      wait_for 15 sh -c "sdiag 2>/dev/null | grep -q 'DBD Agent queue size: 0'" || true
    fi
  fi
  for ((i = ${#SERVICES[@]} - 1; i >= 0; i--)); do
    stop_service "${SERVICES[$i]}"
  done
  # Anything else we started (slurmstepd and job processes left by a crashed
  # or killed cluster, daemons whose pid file was lost).
  left=$(our_pids jobs)
  if [[ -n $left ]]; then
    for pid in $left; do
      log "killing leftover process $pid: $({ tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null)"
      kill -TERM "$pid" 2>/dev/null || true
    done
    for ((i = 0; i < 20; i++)); do
      [[ -z $(our_pids jobs) ]] && break
      sleep 0.1
    done
    for pid in $(our_pids jobs); do kill -KILL "$pid" 2>/dev/null || true; done
  fi
  # Empty job cgroups left by task/cgroup (CLW_SLURM_CGROUP=1).
  find /sys/fs/cgroup/*/"slurm_$NODE" -depth -type d -exec rmdir {} + 2>/dev/null || true
  rm -f "$RUN"/*.daemon.pid "$SETTINGS_FILE" "$MSOCK" "$DB_SOCK"
}

cmd_stop() {
  take_lock
  use_saved_settings
  set_ports
  stop_all
  log "stopped"
}

# ---------------------------------------------------------------------------
# status / env / logs / reset / purge
# ---------------------------------------------------------------------------
cmd_status() {
  use_saved_settings
  set_ports
  local s pid ok=0 port
  for s in "${SERVICES[@]}"; do
    case $s in
    slurmctld) port=127.0.0.1:$CTLD_PORT ;;
    slurmd) port=127.0.0.1:$SLURMD_PORT ;;
    slurmdbd) port=127.0.0.1:$DBD_PORT ;;
    mariadb) port=$DB_SOCK ;;
    munged) port=$MSOCK ;;
    esac
    if pid=$(service_pid "$s"); then
      printf '%-10s running  pid %-7s %s\n' "$s" "$pid" "$port"
    elif [[ $ACCT == 0 && ($s == mariadb || $s == slurmdbd) ]]; then
      printf '%-10s off      (accounting disabled)\n' "$s"
    else
      printf '%-10s stopped\n' "$s"
      ok=1
    fi
  done
  if service_pid slurmctld >/dev/null; then
    printf '%-10s %s\n' node "$(sinfo -h -n "$NODE" -o '%N %T cpus=%c mem=%m gres=%G %E' 2>&1 | head -1)"
    node_usable || ok=1
  fi
  return $ok
}

cmd_env() {
  use_saved_settings
  q() { printf 'export %s=%q\n' "$1" "$2"; }
  echo "# single-node Slurm test peer (tests/peers/slurm.sh); use: eval \"\$(tests/peers/slurm.sh env)\""
  q SLURM_CONF "$CONF"
  q CLW_SLURM_BASE "$BASE"
  q CLW_SLURM_PARTITION "$PARTITION"
  q CLW_SLURM_URGENT_PARTITION "$URGENT_PARTITION"
  q CLW_SLURM_NODE "$NODE"
  q CLW_SLURM_CLUSTER "$CLUSTER"
  q CLW_SLURM_JOBS_DIR "$JOBS_DIR"
  q CLW_SLURM_ACCT "$ACCT"
  q CLW_SLURM_CPUS "$CPUS"
  q CLW_SLURM_MEMORY_MB "$MEMORY_MB"
  q CLW_SLURM_GPUS "$GPUS"
  q CLW_SLURM_CGROUP "$CGROUP"
  q CLW_SLURM_LOG_DIR "$LOG"
}

cmd_logs() {
  local n=${1:-50} f
  for f in munged.log mariadb.log slurmdbd.log slurmctld.log slurmd.log \
    munged.out mariadb.out slurmdbd.out slurmctld.out slurmd.out; do
    [[ -s $LOG/$f ]] || continue
    echo "===== $LOG/$f"
    tail -n "$n" "$LOG/$f"
  done
}

wipe_state() {
  rm -rf "$BASE/spool" "$DB_DIR" "$RUN" "$LOG" "$JOBS_DIR"
}

# Fault injection: slurmctld alone goes down (SIGTERM: it saves its state) and comes back
# from that saved state (no -c), as a controller restart on a real cluster does. Running jobs
# stay with slurmd; the controller's clients fail or retry while it is down.
cmd_stop_controller() {
  take_lock
  use_saved_settings
  set_ports
  stop_service slurmctld
}

cmd_start_controller() {
  take_lock
  use_saved_settings
  set_ports
  service_pid slurmctld >/dev/null && return 0
  launch slurmctld slurmctld -D -f "$CONF"
  wait_for 30 scontrol ping || fail_start slurmctld
  log "slurmctld up again (state recovered from $BASE/spool/ctld)"
}

cmd_reset() {
  (cmd_stop)
  (
    take_lock
    wipe_state
  )
  SAVED_ACCT=''
  cmd_start
}

cmd_purge() {
  cmd_stop
  log "removing $BASE"
  rm -rf "$BASE"
}

usage() {
  cat <<EOF
usage: $0 {install|start|stop|restart|stop-controller|start-controller|status|env|logs [N]|reset|purge}
  base dir: $BASE
  ports: slurmctld $CTLD_PORT, slurmd $SLURMD_PORT, slurmdbd $DBD_PORT (CLW_SLURM_PORT_BASE)
  accounting (sacct): CLW_SLURM_ACCT=$ACCT
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
  stop-controller) cmd_stop_controller ;;
  start-controller) cmd_start_controller ;;
  status) cmd_status ;;
  env) cmd_env ;;
  logs) cmd_logs "$@" ;;
  reset) cmd_reset ;;
  purge) cmd_purge ;;
  -h | --help | help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
  esac
}

main "$@"
