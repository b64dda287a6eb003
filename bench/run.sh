#!/usr/bin/env bash
# One side-by-side benchmark: our cl-worker and cl-worker-manager against CodaLab 1.7.5's Python
# ones, measured in the same run on the same CodaLab server, Docker engine, Slurm, moto and
# machine. Prints one table (row, ours, Python, ratio, unit) and writes it as JSON.
#
#   bash bench/run.sh [--quick] [--json FILE] [--only PARTS]
#
#   --quick       fewer repetitions and smaller payloads (under 10 minutes); the output says which
#   --json FILE   where the JSON goes (default bench/results/<date>-<mode>.json)
#   --only PARTS  comma-separated subset of worker,floor,scale,calls,aws,cpu,tiers,sim,cold
#                 (default: all)
#
# It starts the peers it needs (tests/peers/*.sh start: the CodaLab server, moto, the run image)
# and a private Slurm cluster of its own, and undoes everything it created on exit. The peers
# are shared: run it under the peer lock,
#   flock -o /tmp/clw-peers.lock bash bench/run.sh --quick
# (-o: the peers it starts, moto for one, outlive it and must not inherit the lock.)
# What each row measures and the last full run: docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

for a in "$@"; do
  case $a in
    -h | --help)
      sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
  esac
done

step() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

step "building our binaries (release)"
cargo build --release -q -p codalab-worker -p codalab-worker-manager
# The manager's scale simulation (the `sim` part).
cargo build --release -q -p codalab-worker-manager --example scale_sim
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
export BENCH_OURS_WORKER=$target_dir/release/cl-worker
export BENCH_OURS_MANAGER=$target_dir/release/cl-worker-manager
export BENCH_SCALE_SIM=$target_dir/release/examples/scale_sim

step "peers: CodaLab server, moto, run image"
bash tests/peers/test-image.sh >/dev/null
bash tests/peers/codalab-server.sh start >/dev/null
bash tests/peers/moto.sh start >/dev/null
eval "$(bash tests/peers/codalab-server.sh env)"
eval "$(bash tests/peers/moto.sh env)"

exec python3 bench/bench.py "$@"
