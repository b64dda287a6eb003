#!/usr/bin/env bash
# Checks of the example Prometheus alert rules (examples/prometheus/): `promtool check rules`
# and `promtool test rules alerts.test.yml`. promtool comes from Debian's `prometheus` package,
# downloaded (not installed: no daemon) and unpacked into the peer cache once.
# (`promtool check metrics` is not used: it reads the classic text format, and the binaries
# serve OpenMetrics, whose counters' HELP names the metric without `_total`.)
#
#   tests/examples/check-prometheus.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BASE=${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}/promtool
promtool=$BASE/usr/bin/promtool

if [[ ! -x $promtool ]]; then
  mkdir -p "$BASE/deb"
  (cd "$BASE/deb" && { apt-get download prometheus || { apt-get update -q && apt-get download prometheus; }; }) \
    >"$BASE/download.log" 2>&1 || { tail -20 "$BASE/download.log" >&2; echo "cannot download Debian's prometheus package" >&2; exit 1; }
  debs=("$BASE"/deb/prometheus_*.deb)
  dpkg-deb -x "${debs[0]}" "$BASE"
fi
"$promtool" --version | head -1
cd examples/prometheus
"$promtool" check rules alerts.yml
"$promtool" test rules alerts.test.yml
