#!/usr/bin/env bash
# Measures `.ci/run` as a fresh CI machine runs it: first wipes what such a machine would not
# have (the peer cache ~/.cache/cl-worker-peers with the CodaLab server, moto, the Azure and
# Kubernetes stand-ins and Podman's storage; this checkout's target/ with the stand-in's build;
# the project's Docker images and containers), keeping the system's apt packages and cache and
# cargo's downloaded crates, then runs `.ci/run` and prints its phase stamps as a table
# (docs/testing.md).
#
#   scripts/ci-profile.sh [--keep]     # --keep: do not wipe (the warm-cache figure)
#
# Its output, and .ci/run's whole log, go to target-ci-profile/ (outside target/, which it wipes).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
keep=0
[[ ${1:-} == --keep ]] && keep=1
out=$PWD/target-ci-profile
mkdir -p "$out"
log=$out/ci-run-$(date +%Y%m%d-%H%M%S).log

if ((keep == 0)); then
  echo "[ci-profile] wiping the peer cache, target/ and the project's Docker images"
  for p in podman k8s azure-batch moto slurm codalab-server; do
    bash "tests/peers/$p.sh" stop >/dev/null 2>&1 || true
  done
  docker ps -aq --filter label=org.codalab.worker-id | xargs -r docker rm -f >/dev/null 2>&1 || true
  docker ps -aq --filter name=codalab_run_ | xargs -r docker rm -f >/dev/null 2>&1 || true
  docker images --format '{{.Repository}}:{{.Tag}} {{.ID}}' |
    awk '$1 ~ /^(cl-worker-test|cl-worker-build|codalab|clw-|<none>)/ {print $2}' |
    sort -u | xargs -r docker rmi -f >/dev/null 2>&1 || true
  docker network ls --format '{{.Name}}' | grep -E '^(clw_|codalab_worker_network)' |
    xargs -r docker network rm >/dev/null 2>&1 || true
  rm -rf "${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}" target docker/prebuilt/*.src
fi

echo "[ci-profile] .ci/run (log: $log)"
t0=$SECONDS
status=0
bash .ci/run >"$log" 2>&1 || status=$?
total=$((SECONDS - t0))

echo
echo "| phase stamp | at |"
echo "|---|---|"
grep -E '^== \[[0-9]+ min [0-9]+ s\]' "$log" | sed -E 's/^== \[([0-9]+) min ([0-9]+) s\] (.*)$/| \3 | \1 min \2 s |/'
echo
grep -A200 '^== test binaries' "$log" | sed -n '1,200p' || true
echo
echo "[ci-profile] .ci/run exit $status in $((total / 60)) min $((total % 60)) s ($([[ $keep == 1 ]] && echo warm || echo after the wipe))"
exit "$status"
