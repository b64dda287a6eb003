#!/usr/bin/env bash
# A GPU machine for the tests, on an engine with no GPU: the two seams through which the NVIDIA
# Container Toolkit gives Docker its GPUs, each with a stand-in, and the real engine between.
#
#  - `nvidia-container-runtime-hook` on the engine's PATH. Docker (19.03 and later) registers its
#    `nvidia` device driver at start only when that program exists; it then starts containers
#    with GPU device requests (`--gpus`, the worker's runs), setting NVIDIA_VISIBLE_DEVICES from
#    the request and running the program as the container's OCI prestart hook. This one records
#    each call (the container and its NVIDIA_VISIBLE_DEVICES, in $BASE/hook.log) and exposes no
#    device. The engine is restarted once if it started before the hook existed.
#  - `nvidia-smi`, listing this machine's fake GPUs (GPUS below) as NVIDIA_VISIBLE_DEVICES
#    selects them (`all`; indices or UUIDs; `none`/`void`: none; unset: all on the host, none
#    in a container), as the real one lists the GPUs that the toolkit gave its container:
#      * in the image cl-worker-test/fake-cuda:latest (the test image with it), the worker's GPU
#        discovery image in tests (CL_WORKER_GPU_DISCOVERY_IMAGE);
#      * in $BASE/bin (not on PATH): for a test that models a GPU node's own processes (a Slurm
#        job given that PATH).
#
#   tests/peers/fake-gpu.sh install   # (or start) idempotent; restarts the engine at most once
#   tests/peers/fake-gpu.sh env       # export CLW_FAKE_GPU_BIN=… CLW_FAKE_GPU_IMAGE=… CLW_FAKE_GPU_HOOK_LOG=…
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BASE=${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}/fake-gpu
HOOK=/usr/local/bin/nvidia-container-runtime-hook
IMAGE=cl-worker-test/fake-cuda:latest
CUDA_IMAGE=nvidia/cuda:12.2.0-base-ubuntu22.04
GPUS=(
  "0 GPU-11111111-1111-1111-1111-111111111111"
  "1 GPU-22222222-2222-2222-2222-222222222222"
)

log() { echo "[fake-gpu] $*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

# write_nvidia_smi FILE WHERE: on the `host`, the GPUs NVIDIA_VISIBLE_DEVICES selects (all when
# unset), as a GPU node's own nvidia-smi; in a `container`, only the GPUs the engine gave it: what
# the hook wrote into its file system from the device request (never the container's own
# environment, which a program can set without any device; none when the hook never ran).
write_nvidia_smi() {
  local out=$1 where=$2
  {
    cat <<'EOF'
#!/bin/sh
# A fake nvidia-smi (tests/peers/fake-gpu.sh): the machine's fake GPUs this process was given.
# Supports -L and --query-gpu=FIELDS --format=csv[,noheader][,nounits].
EOF
    if [ "$where" = host ]; then
      printf 'sel=${NVIDIA_VISIBLE_DEVICES-all}\n'
    else
      printf 'sel=$(cat /run/fake-gpu/visible 2>/dev/null || echo none)\n'
    fi
    cat <<'EOF'
query='' format='' list=0
for a in "$@"; do
  case $a in
  -L | --list-gpus) list=1 ;;
  --query-gpu=*) query=${a#--query-gpu=} ;;
  --format=*) format=${a#--format=} ;;
  esac
done
found=0
while read -r idx uuid; do
  case ",$sel," in
  *,all,* | *",$idx,"* | *",$uuid,"*) ;;
  *) continue ;;
  esac
  found=1
  if [ "$list" = 1 ]; then
    echo "GPU $idx: Fake GPU (UUID: $uuid)"
  elif [ -n "$query" ]; then
    line=''
    for f in $(echo "$query" | tr ',' ' '); do
      case $f in
      index) v=$idx ;;
      uuid) v=$uuid ;;
      name) v='Fake GPU' ;;
      memory.total) case $format in *nounits*) v=16384 ;; *) v='16384 MiB' ;; esac ;;
      *) v='[N/A]' ;;
      esac
      line=${line:+$line, }$v
    done
    echo "$line"
  else
    echo "| $idx  Fake GPU  $uuid  16384MiB |"
  fi
done <<'GPUS'
EOF
    printf '%s\n' "${GPUS[@]}"
    cat <<'EOF'
GPUS
if [ "$found" = 0 ]; then
  echo "No devices were found"
  exit 6
fi
EOF
  } >"$out"
  chmod 0755 "$out"
}

write_hook() {
  local tmp
  tmp=$(mktemp "$HOOK.XXXXXX")
  cat >"$tmp" <<EOF
#!/bin/sh
# A stand-in for the NVIDIA Container Toolkit's prestart hook (tests/peers/fake-gpu.sh): records
# the container and the devices Docker asked for (the engine appends its NVIDIA_VISIBLE_DEVICES,
# from the device request, after the container's own: the last one), and gives them to the
# container as the toolkit would mount them: in /run/fake-gpu/visible, which the image's
# nvidia-smi lists. No real device.
exec /usr/bin/python3 -c '
import json, os, sys, time
state = json.load(sys.stdin)
env = {}
root = None
try:
    with open(state["bundle"] + "/config.json") as f:
        config = json.load(f)
    for kv in config.get("process", {}).get("env", []):
        k, _, v = kv.partition("=")
        env[k] = v
    root = config.get("root", {}).get("path")
    if root and not root.startswith("/"):
        root = os.path.join(state["bundle"], root)
except OSError:
    pass
given = env.get("NVIDIA_VISIBLE_DEVICES", "")
if root:
    try:
        os.makedirs(root + "/run/fake-gpu", exist_ok=True)
        with open(root + "/run/fake-gpu/visible", "w") as f:
            f.write(given + "\n")
    except OSError:
        pass
with open("$BASE/hook.log", "a") as f:
    f.write("%.3f %s %s NVIDIA_VISIBLE_DEVICES=%s\n" % (time.time(), sys.argv[1:2], state.get("id", "?"), given))
' "\$@"
EOF
  chmod 0755 "$tmp"
  mv -f "$tmp" "$HOOK"
}

gpu_request_works() {
  docker run --rm --gpus all --network none cl-worker-test/base:latest true >/dev/null 2>&1
}

cmd_install() {
  mkdir -p "$BASE/bin"
  exec 9>"$BASE/.lock"
  flock -w 300 9 || die "timed out waiting for $BASE/.lock"
  touch "$BASE/hook.log"
  chmod 0666 "$BASE/hook.log"
  write_nvidia_smi "$BASE/bin/nvidia-smi" host
  write_nvidia_smi "$BASE/image-nvidia-smi" container
  write_hook
  docker image inspect cl-worker-test/base:latest >/dev/null 2>&1 ||
    bash "$HERE/test-image.sh" >/dev/null
  # The image: the test image and the fake nvidia-smi, made without a registry or a builder.
  local cid
  cid=$(docker create cl-worker-test/base:latest true)
  docker cp "$BASE/image-nvidia-smi" "$cid:/usr/bin/nvidia-smi" >/dev/null &&
    docker commit "$cid" "$IMAGE" >/dev/null ||
    { docker rm -f "$cid" >/dev/null 2>&1; die "cannot make $IMAGE"; }
  docker rm -f "$cid" >/dev/null
  # The same under a CUDA image's name, for the runs that ask for one (`cl run
  # --request-docker-image nvidia/cuda:... --request-gpus 1 nvidia-smi`); not the worker's
  # discovery image, which the tests name themselves.
  docker tag "$IMAGE" "$CUDA_IMAGE"
  if ! gpu_request_works; then
    log "the engine has no nvidia device driver yet: restarting it (it registers the driver at start)"
    # fd 9 (the lock) closed: the engine outlives this script.
    bash "$HERE/docker-engine.sh" restart >/dev/null 9>&-
    gpu_request_works || die "the engine still refuses GPU device requests: $(docker run --rm --gpus all --network none cl-worker-test/base:latest true 2>&1 | tail -1)"
  fi
  log "installed: GPU device requests start; $IMAGE lists ${#GPUS[@]} fake GPUs"
}

case ${1:-} in
install | start) cmd_install ;;
env)
  echo "export CLW_FAKE_GPU_BIN=$BASE/bin"
  echo "export CLW_FAKE_GPU_IMAGE=$IMAGE"
  echo "export CLW_FAKE_CUDA_IMAGE=$CUDA_IMAGE"
  echo "export CLW_FAKE_GPU_HOOK_LOG=$BASE/hook.log"
  ;;
*)
  echo "usage: $0 {install|env}" >&2
  exit 2
  ;;
esac
