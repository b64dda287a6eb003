#!/usr/bin/env bash
# Fault injection for the fault suite: restarts the machine's Docker engine the way an
# operator's `systemctl restart docker` does (SIGTERM: running containers are stopped, then the
# engine starts again with the same command line, environment and configuration).
#   tests/peers/docker-engine.sh restart   # prints the seconds the engine was unreachable
#   tests/peers/docker-engine.sh status
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

LOG_FILE=${CLW_DOCKERD_LOG:-/var/log/clw-dockerd.log}
TIMEOUT=${CLW_DOCKERD_TIMEOUT:-90}

log() { printf '[docker-engine] %s\n' "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

engine_pid() {
  local pid
  for pid in $(pgrep -x dockerd || true); do
    echo "$pid"
    return 0
  done
  return 1
}

answers() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

wait_answers() {
  local deadline=$((SECONDS + TIMEOUT))
  until answers; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

cmd_restart() {
  local t0 pid
  t0=$EPOCHREALTIME
  if [[ -d /run/systemd/system ]] && systemctl is-active --quiet docker 2>/dev/null; then
    systemctl restart docker
  else
    pid=$(engine_pid) || die "no dockerd process to restart"
    # Its own argv and environment, read before it goes away.
    local -a argv env
    mapfile -d '' argv <"/proc/$pid/cmdline"
    mapfile -d '' env <"/proc/$pid/environ"
    kill -TERM "$pid"
    local deadline=$((SECONDS + TIMEOUT))
    while [[ -e /proc/$pid ]]; do
      ((SECONDS < deadline)) || die "dockerd (pid $pid) did not stop within ${TIMEOUT}s"
      sleep 0.2
    done
    rm -f /var/run/docker.pid
    printf '\n===== %s: started by %s\n' "$(date -Is)" "$0" >>"$LOG_FILE"
    # A new session, not a child of ours: the engine outlives this script and the tests.
    setsid -f env -i "${env[@]}" "${argv[@]}" </dev/null >>"$LOG_FILE" 2>&1
  fi
  wait_answers || die "the Docker engine did not answer within ${TIMEOUT}s after the restart (log: $LOG_FILE)"
  local secs
  secs=$(elapsed "$t0")
  log "restarted in ${secs}s"
  echo "$secs"
}

cmd_status() {
  if answers; then
    echo "dockerd running (pid $(engine_pid || echo '?')), answering"
  else
    echo "dockerd not answering"
    return 1
  fi
}

case ${1:-} in
restart) cmd_restart ;;
status) cmd_status ;;
*)
  echo "usage: $0 {restart|status}" >&2
  exit 2
  ;;
esac
