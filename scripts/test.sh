#!/usr/bin/env bash
# The test command: unit tests, and end-to-end tests against the real CodaLab 1.7.5 server,
# real Docker, Debian's Podman 4.3 (through its Docker-compatible API, also inside Slurm jobs), a
# real single-node Slurm 22.05, moto's AWS Batch and the Kubernetes stand-in
# (kube-fake-client + a Docker node agent, checked by kubectl and the Python client); the Azure
# Batch stand-in checked with Microsoft's own SDK; the Kubernetes examples checked with
# kubernetes-validate; the project's images built from docker/Dockerfile; the fault suite (the
# REST server, MariaDB, the Docker engine, slurmctld and moto restarted under load, a full work
# dir, 100 concurrent runs) and a credentials scan after it (every process started during the
# suite, from the kernel's audit records); the Terraform modules checked offline (fmt, validate against
# schema-only providers, terraform test, checkov, trivy) with their negative cases. Starts
# (installing on first use) every peer, and builds the local test image.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The tests and the project's images share one build: the binaries of this build are what the
# images carry (tests/peers/images.sh with CLW_IMAGE_BINARIES; docker/Dockerfile's runtime
# stages, as operators build them). Our crates at opt-level 1, as the dependencies already are:
# the worker image then stays the size of a release image (manager/tests/e2e_images.rs).
export CARGO_PROFILE_DEV_OPT_LEVEL=${CARGO_PROFILE_DEV_OPT_LEVEL:-1}
target_dir=${CARGO_TARGET_DIR:-target}
export CLW_IMAGE_BINARIES=${CLW_IMAGE_BINARIES:-$PWD/$target_dir/debug}

# The Terraform checks need no peer and little but CPU in bursts: they run beside the Rust
# build, and their result is reported (and can fail the run) at the end. Their CPU is the
# lanes' leftovers (nice 19: nothing in them is timed, and the lanes wait on peers a lot).
tf_log=$(mktemp)
(
  set -e
  python3 -m unittest discover -s tests/terraform/lib -p 'test_*.py'
  nice -n 19 bash tests/terraform/check.sh
  nice -n 19 bash tests/terraform/negative.sh
  # The AWS workers' container firewall, applied for real in network namespaces.
  bash terraform/aws-batch/tests/container_firewall.sh
) >"$tf_log" 2>&1 &
tf_pid=$!

# The Kubernetes stand-in (built on first use, into target/standin: the workspace's cargo calls
# below never wait for its lock) beside the other peers' start and the head of the suite, which
# need it not. (A build already under way, `.ci/run`'s, is waited for.)
k8s_log=$(mktemp)
CLW_PEER_LOCK_WAIT=3600 bash tests/peers/k8s.sh install >"$k8s_log" 2>&1 &
k8s_pid=$!

bash tests/peers/test-image.sh
bash tests/peers/fake-gpu.sh install
# `.ci/run` has built the test binaries and listed them in CLW_TEST_BINARIES (scripts/lanes.py).
if [[ -z ${CLW_TEST_BINARIES:-} ]]; then
  cargo build --workspace --all-targets --locked "$@"
fi
# The project's images from docker/Dockerfile: the end-to-end tests that launch worker
# containers run this worker image.
bash tests/peers/images.sh build
bash tests/peers/images.sh report
bash tests/peers/codalab-server.sh start
bash tests/peers/slurm.sh start
bash tests/peers/moto.sh start
bash tests/peers/azure-batch.sh start
bash tests/peers/azure-batch.sh selftest
bash tests/peers/podman.sh start
bash tests/peers/registry.sh start
# Every process the suite starts, with its argv, for the credentials scan (run last).
bash tests/peers/exec-audit.sh start
eval "$(bash tests/peers/exec-audit.sh env)"
export CLW_EXEC_AUDIT_LOG

# The test binaries (scripts/lanes.py). First the head: the faults that stop the CodaLab server
# and MariaDB or restart the Docker engine, alone, while the stand-in builds. Then the lanes: the
# binaries of one lane one at a time, each with one test at a time, the lanes together, grouped
# so that lanes running together share only the CodaLab server and the Docker engine; then the
# serial tail (100 runs at once, alone) and the credentials scan last. The logs of our processes
# are kept in target/test-logs for the scan.
rm -rf "$target_dir/test-logs" "$target_dir/fault-report.txt" "$target_dir/test-lanes" \
  "$target_dir/hostile-generated.txt" "$target_dir/documented-commands.txt"
cargo_status=0
python3 scripts/lanes.py run --phase head --log-dir "$target_dir/test-lanes" "$@" || cargo_status=$?

k8s_status=0
wait "$k8s_pid" || k8s_status=$?
cat "$k8s_log"
rm -f "$k8s_log"
if ((k8s_status != 0)); then
  echo "FAILED: the Kubernetes stand-in's install (exit $k8s_status)" >&2
  exit 1
fi
bash tests/peers/k8s.sh start
bash tests/peers/k8s.sh selftest
bash tests/examples/check-kubernetes.sh

python3 scripts/lanes.py run --phase rest --log-dir "$target_dir/test-lanes" "$@" || cargo_status=$?

bash tests/peers/exec-audit.sh stop || true
echo "== fault suite (what each fault cost)"
cat "$target_dir/fault-report.txt" 2>/dev/null || echo "(no fault report)"
echo "== generated hostile suite (seed and trees tried per runtime)"
cat "$target_dir/hostile-generated.txt" 2>/dev/null || echo "(no generated hostile suite ran)"
echo "== the documented commands as they ran, and the GPU each GPU run was given"
cat "$target_dir/documented-commands.txt" 2>/dev/null || echo "(no documented command ran)"

tf_status=0
wait "$tf_pid" || tf_status=$?
echo "== terraform checks (tests/terraform)"
cat "$tf_log"
rm -f "$tf_log"
if ((cargo_status != 0 || tf_status != 0)); then
  echo "FAILED: tests exit $cargo_status, terraform checks exit $tf_status" >&2
  exit 1
fi
