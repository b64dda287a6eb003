#!/usr/bin/env bash
# Every process started on the machine while the suite runs, with its whole argv, for the
# credentials scan (manager/tests/credentials_scan.rs): the kernel's audit subsystem records each
# execve at the call (Debian's auditd writes the records), so a process that lived a millisecond
# is recorded as surely as one still running at the end. (A proc-connector tool such as forkstat
# reads /proc/<pid>/cmdline after the event and misses processes that have already exited.)
#
#   tests/peers/exec-audit.sh install   # apt: auditd (idempotent; its system service is not used)
#   tests/peers/exec-audit.sh start     # start recording (idempotent); the log restarts empty
#   tests/peers/exec-audit.sh stop      # stop recording, keep the log
#   tests/peers/exec-audit.sh env       # CLW_EXEC_AUDIT_LOG=<the log>
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BASE=${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}/exec-audit
LOG=$BASE/audit.log
KEY=clw-exec

log() { echo "[exec-audit] $*" >&2; }
die() { log "$*"; exit 1; }

install() {
  mkdir -p "$BASE"
  if ! command -v auditctl >/dev/null || ! command -v auditd >/dev/null; then
    log "apt: installing auditd"
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends auditd ||
        { DEBIAN_FRONTEND=noninteractive apt-get update -q &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends auditd; }
    } >"$BASE/install-apt.log" 2>&1 </dev/null || { tail -20 "$BASE/install-apt.log" >&2; die "apt-get failed"; }
  fi
}

running() { [[ -f $BASE/pid ]] && kill -0 "$(cat "$BASE/pid")" 2>/dev/null; }

case ${1:-} in
  install)
    install
    ;;
  start)
    install
    PATH=$PATH:/usr/sbin:/sbin
    if ! running; then
      # The kernel has one audit daemon: a system auditd would get the records instead.
      if pgrep -x auditd >/dev/null; then
        die "an auditd is already running (pid $(pgrep -x auditd | head -1)); stop it first"
      fi
      rm -f "$LOG" "$LOG".*
      cat >"$BASE/auditd.conf" <<EOF
log_file = $LOG
log_format = RAW
flush = INCREMENTAL_ASYNC
freq = 100
num_logs = 5
max_log_file = 1024
max_log_file_action = KEEP_LOGS
space_left = 200
space_left_action = SYSLOG
admin_space_left = 100
admin_space_left_action = SUSPEND
disk_full_action = SUSPEND
disk_error_action = SUSPEND
EOF
      setsid auditd -c "$BASE" -n >"$BASE/auditd.out" 2>&1 </dev/null &
      echo $! >"$BASE/pid"
      for _ in $(seq 50); do
        [[ -f $LOG ]] && break
        sleep 0.1
      done
      [[ -f $LOG ]] || { cat "$BASE/auditd.out" >&2; die "auditd did not start"; }
    fi
    auditctl -b 65536 >/dev/null
    auditctl -D -k "$KEY" >/dev/null 2>&1 || true
    auditctl -a always,exit -F arch=b64 -S execve -k "$KEY" >/dev/null
    auditctl -a always,exit -F arch=b32 -S execve -k "$KEY" >/dev/null
    # A process started now is in the log: the recording works.
    probe="clw-exec-audit-probe-$$-$RANDOM"
    /bin/true "$probe"
    for _ in $(seq 50); do
      grep -q "$probe" "$LOG" 2>/dev/null && { log "recording every execve into $LOG"; exit 0; }
      sleep 0.1
    done
    die "auditd runs but records no execve (is the kernel's audit subsystem available?)"
    ;;
  stop)
    PATH=$PATH:/usr/sbin:/sbin
    auditctl -D -k "$KEY" >/dev/null 2>&1 || true
    if running; then
      kill "$(cat "$BASE/pid")" 2>/dev/null || true
    fi
    rm -f "$BASE/pid"
    ;;
  env)
    echo "export CLW_EXEC_AUDIT_LOG=$LOG"
    ;;
  *)
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
