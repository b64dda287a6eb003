#!/usr/bin/env bash
# Benchmark: staged->ready latency and idle RSS, our cl-worker vs CodaLab's Python cl-worker.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tests/peers/test-image.sh >/dev/null
bash tests/peers/codalab-server.sh start >/dev/null
cargo build --release -q -p codalab-worker
eval "$(bash tests/peers/codalab-server.sh env)"
exec python3 bench/staged_to_ready.py "$PWD/target/release/cl-worker" "$(command -v cl-worker)"
