#!/usr/bin/env bash
# Build a local worker image (what `--worker-image` names on AWS Batch) WITHOUT a registry or a
# Dockerfile build: the test image of test-image.sh (bash, coreutils, glibc) plus a cl-worker
# binary at /usr/local/bin/cl-worker and the shared libraries ldd finds for it, committed with
# `docker commit`. The worker talks to Docker through the socket the job mounts (no docker CLI).
#
#   tests/peers/worker-image.sh BINARY [TAG]   # default tag cl-worker-test/worker:latest
#
# Prints the image id on stdout (last line).
set -euo pipefail

die() {
  echo "[worker-image] error: $*" >&2
  exit 1
}

BIN=${1:-}
TAG=${2:-cl-worker-test/worker:latest}
[[ -n $BIN ]] || die "usage: $0 BINARY [TAG]"
[[ -x $BIN ]] || die "$BIN is not an executable file (build it first: cargo build -p codalab-worker)"
command -v docker >/dev/null || die "docker not found"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bash "$HERE/test-image.sh" >/dev/null

CTX=$(mktemp -d)
CID=
cleanup() {
  rm -rf "$CTX"
  [[ -z $CID ]] || docker rm -f "$CID" >/dev/null 2>&1 || true
}
trap cleanup EXIT

mkdir -p "$CTX/usr/local/bin"
cp "$BIN" "$CTX/usr/local/bin/cl-worker"
chmod 755 "$CTX/usr/local/bin/cl-worker"
# The binary's shared libraries, each in its host directory with symlinks resolved (/lib is a
# symlink to usr/lib in the base image, as on this host; the base image has glibc from here).
while read -r lib; do
  [[ -n $lib ]] || continue
  dir=$(readlink -f "$(dirname "$lib")")
  mkdir -p "$CTX$dir"
  cp -L "$lib" "$CTX$dir/$(basename "$lib")"
done < <(ldd "$BIN" | grep -o '/[^ ]*' | sort -u)

CID=$(docker create cl-worker-test/base:latest true)
tar -C "$CTX" -cf - . | docker cp - "$CID:/"
docker commit \
  --change 'ENTRYPOINT []' \
  --change 'CMD ["/usr/local/bin/cl-worker", "--help"]' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  "$CID" "$TAG" >/dev/null
docker run --rm "$TAG" cl-worker --version >/dev/null ||
  die "the image $TAG cannot run cl-worker --version"
docker image inspect --format '{{.Id}}' "$TAG"
