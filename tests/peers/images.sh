#!/usr/bin/env bash
# Build the project's two images from docker/Dockerfile on a machine with no image registry.
#
# The Dockerfile's base images are build arguments with public defaults (rust:…-slim-bookworm,
# debian:bookworm-slim). Here no registry can be reached, so this script makes local stand-ins
# for both from Debian's own packages and passes them in; the Dockerfile itself is unchanged:
#
#   base       `debootstrap --variant=minbase bookworm`, trimmed as Debian's -slim images are
#              (no docs, man pages or locales; dpkg told to keep it so), `docker import`ed as
#              cl-worker-build/debian:bookworm-slim
#   toolchain  that base with gcc and libc6-dev from Debian, this machine's Rust toolchain
#              (rustc, cargo and the x86_64 standard library of `rustup`'s active toolchain, no
#              docs) at /usr/local, and the crates of Cargo.lock (`cargo vendor`, as cargo's
#              crates-io source: containers here reach Debian's mirror but not crates.io):
#              cl-worker-build/rust:<version>-bookworm
#   build      `docker build -f docker/Dockerfile --target worker|manager` with both:
#              cl-worker-test/worker:latest and cl-worker-test/manager:latest. With
#              CLW_IMAGE_BINARIES=<dir> (the tests' own build, e.g. target/debug), the binaries
#              there, stripped, instead of a compile in the toolchain image (PREBUILT): the
#              same runtime stages, on the base alone
#
#   tests/peers/images.sh build [worker|manager]...   # default: both; builds base/toolchain
#   tests/peers/images.sh base | toolchain            # only that stand-in
#   tests/peers/images.sh env                         # the image names, as shell assignments
#   tests/peers/images.sh report                      # size and `--version` start time of each
#
# Each step is skipped when its image is current: the base and toolchain by a label holding
# their recipe's hash, the images by Docker's layer cache (a rebuild after a source change
# recompiles our crates only, not the dependencies). One build at a time (a lock).
# Work files: ${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}/images
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SUITE=bookworm
BASE_TAG=cl-worker-build/debian:bookworm-slim
WORKER_TAG=${CLW_WORKER_IMAGE_TAG:-cl-worker-test/worker:latest}
MANAGER_TAG=${CLW_MANAGER_IMAGE_TAG:-cl-worker-test/manager:latest}
RECIPE_LABEL=org.cl-worker-build.recipe
BASE_RECIPE=2
MIRROR=${CLW_DEBIAN_MIRROR:-http://deb.debian.org/debian}

log() { printf '[images] %s\n' "$*" >&2; }
die() {
  printf '[images] error: %s\n' "$*" >&2
  exit 1
}
# shellcheck source=lib.sh
source "$HERE/lib.sh"

[[ -n ${HOME:-} ]] || HOME=$(getent passwd "$(id -u)" | cut -d: -f6)
WORK=${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}/images
mkdir -p "$WORK"
exec 9>"$WORK/.lock"
flock -w 3600 9 || die "timed out waiting for $WORK/.lock"

command -v docker >/dev/null || die "docker CLI not found"
docker info >/dev/null 2>&1 || die "docker engine not reachable (docker info failed)"

recipe_of() { docker image inspect --format "{{index .Config.Labels \"$RECIPE_LABEL\"}}" "$1" 2>/dev/null || true; }

as_root() {
  if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo -n "$@"; fi
}

# --- base: a real Debian bookworm, minimal, trimmed like debian:bookworm-slim.
cmd_base() {
  local recipe="base-$BASE_RECIPE-$SUITE"
  if [[ $(recipe_of "$BASE_TAG") == "$recipe" ]]; then
    return 0
  fi
  if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap (Debian package)"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null ||
      die "cannot install debootstrap"
  fi
  local t0=$EPOCHREALTIME rootfs=$WORK/rootfs
  as_root rm -rf "$rootfs"
  log "debootstrap --variant=minbase $SUITE from $MIRROR (about a minute)"
  as_root debootstrap --variant=minbase "$SUITE" "$rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
    {
      tail -n 20 "$WORK/debootstrap.log" >&2
      die "debootstrap failed (log: $WORK/debootstrap.log)"
    }
  # What debian:*-slim leaves out, and the dpkg configuration that keeps it out of later
  # installs (the same paths as Debian's slim images).
  as_root tee "$rootfs/etc/dpkg/dpkg.cfg.d/docker-slim" >/dev/null <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
EOF
  as_root tee "$rootfs/etc/apt/apt.conf.d/docker-clean" >/dev/null <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  as_root bash -c '
    set -e
    r=$1
    find "$r/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    find "$r/usr/share/doc" -mindepth 1 -type d -empty -delete
    rm -rf "$r/usr/share/man"/* "$r/usr/share/groff"/* "$r/usr/share/info"/* \
      "$r/usr/share/lintian"/* "$r/usr/share/linda"/*
    find "$r/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
    rm -rf "$r/var/lib/apt/lists"/* "$r/var/cache/apt"/*.bin "$r/var/cache/apt/archives"/*.deb \
      "$r/var/log"/*.log "$r/var/log/apt"/* "$r/tmp"/* "$r/root/.bash_history"
    : > "$r/etc/machine-id"
    echo "deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main" > "$r/etc/apt/sources.list"
  ' _ "$rootfs"
  log "docker import as $BASE_TAG"
  as_root tar --numeric-owner -C "$rootfs" -c . |
    docker import \
      --change "LABEL $RECIPE_LABEL=$recipe" \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["bash"]' \
      - "$BASE_TAG" >/dev/null
  as_root rm -rf "$rootfs"
  log "base ready in $(elapsed "$t0") s"
}

# --- toolchain: the base + gcc + this machine's Rust toolchain.
rust_version() { rustc --version | awk '{print $2}'; }

toolchain_tag() { echo "cl-worker-build/rust:$(rust_version)-bookworm"; }

cmd_toolchain() {
  cmd_base
  command -v rustc >/dev/null || die "rustc not found (the toolchain image copies this machine's)"
  local sysroot tag recipe
  sysroot=$(rustc --print sysroot)
  tag=$(toolchain_tag)
  recipe="toolchain-2-$(cat <(rustc -vV) "$ROOT/Cargo.lock" | sha256sum | cut -c1-16)-$(recipe_of "$BASE_TAG")"
  if [[ $(recipe_of "$tag") == "$recipe" ]]; then
    return 0
  fi
  local t0=$EPOCHREALTIME ctx
  ctx=$(mktemp -d)
  # rustc, cargo and the host's standard library; not docs, sources or other targets.
  mkdir -p "$ctx/rust/bin" "$ctx/rust/lib/rustlib" "$ctx/rust/cargo"
  cp -a "$sysroot/bin/rustc" "$sysroot/bin/cargo" "$ctx/rust/bin/"
  [[ -x $sysroot/bin/rustdoc ]] && cp -a "$sysroot/bin/rustdoc" "$ctx/rust/bin/"
  cp -a "$sysroot/lib"/lib*.so* "$ctx/rust/lib/"
  cp -a "$sysroot/lib/rustlib/x86_64-unknown-linux-gnu" "$ctx/rust/lib/rustlib/"
  [[ -d $sysroot/libexec ]] && cp -a "$sysroot/libexec" "$ctx/rust/"
  # The crates of Cargo.lock, served to cargo in the image as its crates-io source.
  (cd "$ROOT" && cargo vendor --locked --versioned-dirs "$ctx/rust/cargo/vendor" >"$ctx/rust/cargo/config.toml" 2>"$WORK/vendor.log") ||
    {
      tail -n 20 "$WORK/vendor.log" >&2
      rm -rf "$ctx"
      die "cargo vendor failed"
    }
  sed -i 's|directory = ".*"|directory = "/usr/local/cargo/vendor"|' "$ctx/rust/cargo/config.toml"
  cat >"$ctx/Dockerfile" <<EOF
FROM $BASE_TAG
RUN set -eu; export DEBIAN_FRONTEND=noninteractive; apt-get update; \
    apt-get install -y --no-install-recommends gcc libc6-dev ca-certificates; \
    apt-get clean; rm -rf /var/lib/apt/lists/*
COPY rust /usr/local
ENV CARGO_HOME=/usr/local/cargo PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN rustc --version && cargo --version
LABEL $RECIPE_LABEL=$recipe
EOF
  log "building $tag from this machine's toolchain ($(rustc --version))"
  docker build -q -t "$tag" "$ctx" >"$WORK/toolchain.log" 2>&1 || {
    tail -n 20 "$WORK/toolchain.log" >&2
    rm -rf "$ctx"
    die "building the toolchain image failed"
  }
  rm -rf "$ctx"
  log "toolchain ready in $(elapsed "$t0") s"
}

# --- the project's images, from docker/Dockerfile. With CLW_IMAGE_BINARIES (a folder holding
# cl-worker and cl-worker-manager, e.g. target/debug of the tests' own build), the build stage
# takes those binaries (stripped) and this machine's CA bundle from docker/prebuilt/ instead of
# compiling, on the Debian base: no toolchain image, no second compile of the workspace.
prepare_prebuilt() {
  local dir=$1 bin ca=/etc/ssl/certs/ca-certificates.crt
  for bin in cl-worker cl-worker-manager; do
    [[ -x $dir/$bin ]] || die "CLW_IMAGE_BINARIES=$dir has no $bin (build the workspace first)"
  done
  [[ -s $ca ]] || die "no CA bundle at $ca (install ca-certificates)"
  mkdir -p "$ROOT/docker/prebuilt"
  for bin in cl-worker cl-worker-manager; do
    # Only when the binary changed: an unchanged folder keeps Docker's layer cache.
    if [[ ! -f $ROOT/docker/prebuilt/$bin.src ]] || ! cmp -s "$dir/$bin" "$ROOT/docker/prebuilt/$bin.src"; then
      cp "$dir/$bin" "$ROOT/docker/prebuilt/$bin.src.tmp"
      strip -o "$ROOT/docker/prebuilt/$bin" "$ROOT/docker/prebuilt/$bin.src.tmp"
      mv "$ROOT/docker/prebuilt/$bin.src.tmp" "$ROOT/docker/prebuilt/$bin.src"
    fi
  done
  cmp -s "$ca" "$ROOT/docker/prebuilt/ca-certificates.crt" || cp "$ca" "$ROOT/docker/prebuilt/ca-certificates.crt"
}

cmd_build() {
  local targets=("$@")
  ((${#targets[@]})) || targets=(worker manager)
  local build_args=()
  if [[ -n ${CLW_IMAGE_BINARIES:-} ]]; then
    cmd_base
    prepare_prebuilt "$CLW_IMAGE_BINARIES"
    build_args=(--build-arg "RUST_IMAGE=$BASE_TAG" --build-arg PREBUILT=1)
  else
    cmd_toolchain
    build_args=(--build-arg "RUST_IMAGE=$(toolchain_tag)")
  fi
  local t target tag rev created version
  rev=$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
  created=$(git -C "$ROOT" log -1 --format=%cI 2>/dev/null || echo unknown)
  version=$(awk -F'"' '/^\[workspace.package\]/ {p = 1} p && /^version/ {print $2; exit}' "$ROOT/Cargo.toml")
  for target in "${targets[@]}"; do
    case $target in
    worker) tag=$WORKER_TAG ;;
    manager) tag=$MANAGER_TAG ;;
    *) die "unknown target '$target' (worker or manager)" ;;
    esac
    t=$EPOCHREALTIME
    if [[ -n ${CLW_IMAGE_BINARIES:-} ]]; then
      log "docker build --target $target -t $tag (binaries of $CLW_IMAGE_BINARIES)"
    else
      log "docker build --target $target -t $tag (the first build compiles every dependency: minutes)"
    fi
    if ! docker build -f "$ROOT/docker/Dockerfile" --target "$target" -t "$tag" \
      "${build_args[@]}" \
      --build-arg "BASE_IMAGE=$BASE_TAG" \
      --build-arg "VERSION=$version" \
      --build-arg "REVISION=$rev" \
      --build-arg "CREATED=$created" \
      "$ROOT" >"$WORK/build-$target.log" 2>&1; then
      tail -n 40 "$WORK/build-$target.log" >&2
      die "docker build --target $target failed (log: $WORK/build-$target.log)"
    fi
    docker run --rm "$tag" "$([[ $target == worker ]] && echo cl-worker || echo cl-worker-manager)" --version >/dev/null ||
      die "$tag cannot run --version"
    log "$tag built in $(elapsed "$t") s"
  done
}

cmd_env() {
  printf 'CLW_WORKER_IMAGE=%q\nCLW_MANAGER_IMAGE=%q\n' "$WORKER_TAG" "$MANAGER_TAG"
}

cmd_report() {
  local tag bin t0 i
  for tag in "$WORKER_TAG" "$MANAGER_TAG"; do
    bin=cl-worker
    [[ $tag == "$MANAGER_TAG" ]] && bin=cl-worker-manager
    docker image inspect "$tag" >/dev/null 2>&1 || die "$tag not built (tests/peers/images.sh build)"
    docker run --rm "$tag" "$bin" --version >/dev/null
    t0=$EPOCHREALTIME
    for i in 1 2 3 4 5; do docker run --rm "$tag" "$bin" --version >/dev/null; done
    printf '%s: %s MB, `docker run --rm %s %s --version` %s s (mean of 5), %s\n' "$tag" \
      "$(docker image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.1f", $1 / 1e6}')" \
      "$tag" "$bin" "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.2f", (b - a) / 5}')" \
      "$(docker run --rm "$tag" "$bin" --version)"
  done
}

cmd=${1:-build}
shift || true
case $cmd in
base) cmd_base ;;
toolchain) cmd_toolchain ;;
build) cmd_build "$@" ;;
env) cmd_env ;;
report) cmd_report ;;
-h | --help) sed -n '2,27p' "$0" ;;
*) die "usage: $0 build [worker|manager]... | base | toolchain | env | report" ;;
esac
