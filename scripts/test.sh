#!/usr/bin/env bash
# The test command: unit tests, and end-to-end tests against the real CodaLab 1.7.5 server,
# real Docker, Debian's Podman 4.3 (through its Docker-compatible API, also inside Slurm jobs), a
# real single-node Slurm 22.05, moto's AWS Batch and the Kubernetes stand-in
# (kube-fake-client + a Docker node agent, checked by kubectl and the Python client); the Azure
# Batch stand-in checked with Microsoft's own SDK; the Kubernetes examples checked with
# kubernetes-validate; the project's images built from docker/Dockerfile; the fault suite (the
# REST server, MariaDB, the Docker engine, slurmctld and moto restarted under load, a full work
# dir, 100 concurrent runs) and a credentials scan after it; the Terraform modules checked offline (fmt, validate against
# schema-only providers, terraform test, checkov, trivy) with their negative cases. Starts
# (installing on first use) every peer, and builds the local test image.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The Terraform checks need no peer and little but CPU in bursts: they run beside the Rust
# build, and their result is reported (and can fail the run) at the end.
tf_log=$(mktemp)
(
  set -e
  python3 -m unittest discover -s tests/terraform/lib -p 'test_*.py'
  bash tests/terraform/check.sh
  bash tests/terraform/negative.sh
) >"$tf_log" 2>&1 &
tf_pid=$!

bash tests/peers/test-image.sh
# The project's images from docker/Dockerfile: the end-to-end tests that launch worker
# containers run this worker image.
bash tests/peers/images.sh build
bash tests/peers/images.sh report
bash tests/peers/codalab-server.sh start
bash tests/peers/slurm.sh start
bash tests/peers/moto.sh start
bash tests/peers/azure-batch.sh start
bash tests/peers/azure-batch.sh selftest
bash tests/peers/k8s.sh start
bash tests/peers/k8s.sh selftest
bash tests/peers/podman.sh start
bash tests/examples/check-kubernetes.sh

# One test at a time: the end-to-end tests share one CodaLab server and Docker engine on a
# 2-core machine, and under that load the server can finalize a failed run as `ready` (see
# docs/compatibility.md); serial runs keep the suite deterministic. The fault suite
# (worker/tests/faults.rs, manager/tests/faults.rs) stops and restarts peers: it needs this too.
# The logs of our processes are kept in target/test-logs for the credentials scan, which runs
# last, after the whole suite.
rm -rf "${CARGO_TARGET_DIR:-target}/test-logs" "${CARGO_TARGET_DIR:-target}/fault-report.txt"
cargo_status=0
cargo test --workspace --all-targets "$@" -- --test-threads=1 --skip after_the_whole_suite || cargo_status=$?
# `--workspace` as above: the same feature set, so nothing is compiled again.
cargo test --workspace --test credentials_scan "$@" -- --test-threads=1 || cargo_status=$?

echo "== fault suite (what each fault cost)"
cat "${CARGO_TARGET_DIR:-target}/fault-report.txt" 2>/dev/null || echo "(no fault report)"

tf_status=0
wait "$tf_pid" || tf_status=$?
echo "== terraform checks (tests/terraform)"
cat "$tf_log"
rm -f "$tf_log"
if ((cargo_status != 0 || tf_status != 0)); then
  echo "FAILED: cargo test exit $cargo_status, terraform checks exit $tf_status" >&2
  exit 1
fi
