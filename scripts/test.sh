#!/usr/bin/env bash
# The test command: unit tests, and end-to-end tests against the real CodaLab 1.7.5 server,
# real Docker, a real single-node Slurm 22.05 and moto's AWS Batch. Starts (installing on first
# use) the server, Slurm and moto, and builds the local test image.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tests/peers/test-image.sh
bash tests/peers/codalab-server.sh start
bash tests/peers/slurm.sh start
bash tests/peers/moto.sh start
# One test at a time: the end-to-end tests share one CodaLab server and Docker engine on a
# 2-core machine, and under that load the server can finalize a failed run as `ready` (see
# docs/compatibility.md); serial runs keep the suite deterministic.
cargo test --workspace --all-targets "$@" -- --test-threads=1
