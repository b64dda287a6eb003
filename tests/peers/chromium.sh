#!/usr/bin/env bash
# Headless Chromium (Debian's `chromium` package), the browser the manager's status page is
# checked with.
#
#   tests/peers/chromium.sh install      # apt: chromium (idempotent)
#   tests/peers/chromium.sh path         # the browser's path
#   tests/peers/chromium.sh dump URL     # the DOM of URL after it rendered
#   tests/peers/chromium.sh shot URL PNG # a 1200x900 screenshot of URL into PNG
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BASE=${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}/chromium

log() { echo "[chromium] $*" >&2; }
die() { log "$*"; exit 1; }

browser() {
  local b
  for b in chromium chromium-browser; do
    if command -v "$b" >/dev/null; then command -v "$b"; return 0; fi
  done
  return 1
}

# Headless, no sandbox (root in a container), no GPU, a throw-away profile.
headless() {
  local b profile
  b=$(browser) || die "chromium is not installed: run tests/peers/chromium.sh install"
  profile=$(mktemp -d)
  trap 'rm -rf "$profile"' RETURN
  timeout 60 "$b" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
    --no-first-run --user-data-dir="$profile" "$@" 2>>"$BASE/chromium.log"
}

case ${1:-} in
  install)
    mkdir -p "$BASE"
    if ! browser >/dev/null; then
      log "apt: installing chromium"
      { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium ||
          { DEBIAN_FRONTEND=noninteractive apt-get update -q &&
              DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium; }
      } >"$BASE/install-apt.log" 2>&1 </dev/null || { tail -20 "$BASE/install-apt.log" >&2; die "apt-get failed"; }
    fi
    log "installed: $("$(browser)" --version 2>/dev/null || echo '?')"
    ;;
  path)
    browser || die "chromium is not installed: run tests/peers/chromium.sh install"
    ;;
  dump)
    [[ $# -eq 2 ]] || die "usage: $0 dump URL"
    mkdir -p "$BASE"
    headless --dump-dom "$2"
    ;;
  shot)
    [[ $# -eq 3 ]] || die "usage: $0 shot URL PNG"
    mkdir -p "$BASE"
    headless --hide-scrollbars --window-size=1200,900 --screenshot="$3" "$2" >/dev/null
    [[ -s $3 ]] || die "no screenshot written to $3"
    ;;
  *)
    die "usage: $0 install|path|dump URL|shot URL PNG"
    ;;
esac
