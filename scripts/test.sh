#!/usr/bin/env bash
# The test command: unit tests, and end-to-end tests against the real CodaLab 1.7.5 server and
# real Docker. Starts (installing on first use) the server and builds the local test image.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tests/peers/test-image.sh
bash tests/peers/codalab-server.sh start
cargo test --workspace --all-targets "$@"
