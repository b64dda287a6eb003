#!/usr/bin/env bash
# A private image registry: Debian's `docker-registry` (the CNCF Distribution registry 2.8), on
# 127.0.0.1 where the Docker engine speaks plain HTTP to it by default. The worker's
# `--max-image-size` asks a registry for an image's size before the pull; tests push images here.
#
#   tests/peers/registry.sh install   # apt: docker-registry (idempotent)
#   tests/peers/registry.sh start     # serve on 127.0.0.1:${CLW_REGISTRY_PORT:-5000} (idempotent)
#   tests/peers/registry.sh stop
#   tests/peers/registry.sh env       # CLW_REGISTRY=127.0.0.1:5000
#
# Another CLW_REGISTRY_PORT runs another registry beside it, with its own data. On port 80 its
# images are named without a port (`127.0.0.1/NAME:TAG`: the engine tries HTTPS on 443, then
# plain HTTP on 80, as it does for every loopback registry): CodaLab 1.7.5's worker splits an
# image name at each ':' and cannot pull `127.0.0.1:5000/NAME:TAG` (bench/benchlib/cold.py).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PORT=${CLW_REGISTRY_PORT:-5000}
BASE=${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}/registry
[[ $PORT == 5000 ]] || BASE=$BASE-$PORT
ADDR=127.0.0.1:$PORT
NAME=$ADDR
[[ $PORT == 80 ]] && NAME=127.0.0.1
BIN=/usr/bin/docker-registry

log() { echo "[registry] $*" >&2; }
die() { log "$*"; exit 1; }

up() { curl -fsS -o /dev/null "http://$ADDR/v2/" 2>/dev/null; }

install() {
  mkdir -p "$BASE"
  if [[ ! -x $BIN ]]; then
    log "apt: installing docker-registry"
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker-registry ||
        { DEBIAN_FRONTEND=noninteractive apt-get update -q &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker-registry; }
    } >"$BASE/install-apt.log" 2>&1 </dev/null || { tail -20 "$BASE/install-apt.log" >&2; die "apt-get failed"; }
    # The package starts a system service on :5000; this peer runs its own.
    systemctl disable --now docker-registry >/dev/null 2>&1 || true
    pkill -f "^$BIN serve /etc/docker/registry" 2>/dev/null || true
  fi
}

case ${1:-} in
  install)
    install
    log "installed: $("$BIN" --version 2>/dev/null || echo '?')"
    ;;
  start)
    install
    if up; then exit 0; fi
    mkdir -p "$BASE/data"
    cat >"$BASE/config.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $BASE/data
  delete:
    enabled: true
http:
  addr: $ADDR
EOF
    setsid "$BIN" serve "$BASE/config.yml" >"$BASE/registry.log" 2>&1 </dev/null &
    echo $! >"$BASE/pid"
    for _ in $(seq 100); do
      up && { log "serving on $ADDR"; exit 0; }
      sleep 0.1
    done
    tail -20 "$BASE/registry.log" >&2
    die "the registry did not answer on $ADDR"
    ;;
  stop)
    [[ -f $BASE/pid ]] && kill "$(cat "$BASE/pid")" 2>/dev/null || true
    rm -f "$BASE/pid"
    ;;
  env)
    echo "export CLW_REGISTRY=$NAME"
    ;;
  *)
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
