#!/usr/bin/env bash
# Podman as a Docker-compatible API without a daemon: Debian's podman 4.3, its
# `podman system service` on a private socket, storage under the peer cache.
#
#   tests/peers/podman.sh install        # apt: podman crun uidmap catatonit (idempotent)
#   tests/peers/podman.sh start          # the service on $CLW_PODMAN_SOCK (~0.2 s)
#   eval "$(tests/peers/podman.sh env)"  # CLW_PODMAN_SOCK, CLW_PODMAN_HOST (unix://…)
#   tests/peers/podman.sh load IMAGE     # copy IMAGE from the Docker engine into Podman's store
#   tests/peers/podman.sh podman ARGS…   # the podman CLI on the same storage
#   tests/peers/podman.sh stop
#
# This VM's cgroup layout is hybrid (v1 controllers plus a cgroup2 mount), which crun refuses:
# podman runs in a private mount namespace where /sys/fs/cgroup is pure cgroup2, with
# cgroups disabled (memory and CPU limits are accepted but not enforced here), and with
# default rlimits the VM's bounding set allows (see docs/compatibility.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BASE=${CLW_PODMAN_BASE:-${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}/podman}
SOCK=$BASE/podman.sock
export CONTAINERS_STORAGE_CONF=$BASE/etc/storage.conf CONTAINERS_CONF=$BASE/etc/containers.conf

log() { echo "[podman] $*" >&2; }

configure() {
  mkdir -p "$BASE/etc" "$BASE/run" "$BASE/root" "$BASE/tmp"
  cat >"$BASE/etc/storage.conf" <<CONF
[storage]
driver = "vfs"
runroot = "$BASE/run"
graphroot = "$BASE/root"
CONF
  cat >"$BASE/etc/containers.conf" <<CONF
[containers]
netns = "host"
cgroups = "disabled"
log_driver = "k8s-file"
default_ulimits = ["nofile=16384:16384", "nproc=16384:16384"]
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$BASE/run/events.log"
runtime = "crun"
tmp_dir = "$BASE/tmp"
CONF
}

# Runs "$@" where crun accepts the cgroup layout.
in_ns() {
  if [[ -d /sys/fs/cgroup/unified ]]; then
    unshare -m --propagation private sh -c 'umount -l /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup && exec "$@"' sh "$@"
  else
    "$@"
  fi
}

up() { [[ -S $SOCK ]] && curl -fsS --unix-socket "$SOCK" http://d/_ping >/dev/null 2>&1; }

case "${1:-}" in
  install)
    if ! command -v podman >/dev/null || ! command -v crun >/dev/null; then
      pkgs="podman crun uidmap catatonit"
      log "apt: installing $pkgs"
      mkdir -p "$BASE"
      # shellcheck disable=SC2086 # the package list splits on purpose
      { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $pkgs ||
          { DEBIAN_FRONTEND=noninteractive apt-get update -q &&
              DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $pkgs; }
      } >"$BASE/install-apt.log" 2>&1 </dev/null || { tail -20 "$BASE/install-apt.log" >&2; log "apt-get failed"; exit 1; }
    fi
    configure
    log "installed: $(podman --version)"
    ;;
  start)
    "$0" install
    if up; then exit 0; fi
    rm -f "$SOCK"
    (in_ns podman system service --time=0 "unix://$SOCK" >"$BASE/service.log" 2>&1 &
     echo $! >"$BASE/service.pid")
    for _ in $(seq 100); do up && break; sleep 0.1; done
    up || { log "the service did not come up:"; tail -20 "$BASE/service.log" >&2; exit 1; }
    log "up: unix://$SOCK"
    ;;
  env)
    echo "export CLW_PODMAN_SOCK=$SOCK"
    echo "export CLW_PODMAN_HOST=unix://$SOCK"
    ;;
  load)
    : "${2:?IMAGE…}"
    shift
    # Every name of the image (the test image is also codalab/default-cpu and -gpu).
    docker save "$@" | in_ns podman load >/dev/null
    log "loaded $*"
    ;;
  podman)
    shift
    in_ns podman "$@"
    ;;
  stop)
    if [[ -f $BASE/service.pid ]]; then
      pkill -TERM -f "podman system service --time=0 unix://$SOCK" 2>/dev/null || true
      rm -f "$BASE/service.pid"
    fi
    rm -f "$SOCK"
    ;;
  *)
    sed -n '2,15p' "$0" >&2
    exit 2
    ;;
esac
