#!/usr/bin/env bash
# Build a small local Docker image for the cl-worker integration tests WITHOUT a
# registry: host binaries (bash, dash as /bin/sh, all of coreutils, tar, gzip,
# grep, sed, find/xargs, mawk) plus the shared libraries ldd finds for them, a
# static busybox (Debian's busybox-static package, for nc/ps/wget/... only where
# no real tool exists), /tmp (1777) and /etc/passwd + /etc/group, imported with
# `docker import`.
#
# Tags: cl-worker-test/base:latest, codalab/default-cpu:latest and
# codalab/default-gpu:latest (CodaLab's default run images, so runs that do not
# ask for an image use this one).
#
# Idempotent: the sha256 of the deterministic rootfs tarball (plus the image
# config) is stored as the label org.cl-worker-test.rootfs-sha256; when an
# image with that label exists, nothing is imported and the tags are just
# (re)pointed at it. Prints the image id on stdout (last line).
#
#   tests/peers/test-image.sh            # build (or reuse) and print the image id
#   tests/peers/test-image.sh --verify   # also run a smoke command in the image
#
# Work files: ${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}/test-image
set -euo pipefail

IMAGE_RECIPE_VERSION=1
TAGS=(cl-worker-test/base:latest codalab/default-cpu:latest codalab/default-gpu:latest)
LABEL_KEY=org.cl-worker-test.rootfs-sha256
CHANGES=(
  'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
  'WORKDIR /'
  'CMD ["/bin/bash"]'
)
# busybox applets linked into /usr/bin only when no real tool of that name exists.
APPLETS=(nc ps wget ping ip netstat nslookup hostname top free pidof kill killall
  less vi xxd which unzip bzip2 bunzip2 xz unxz diff cmp)
# Required tools (beyond the whole coreutils package, which is copied too).
TOOLS=(bash dash tar gzip grep sed find xargs mawk
  cat echo ls head tail dd sleep sha256sum md5sum mkdir rm cp mv wc touch ln chmod
  id env true false seq yes stat du df tee sort)
GZIP_SCRIPTS=(gunzip zcat) # shell scripts from the gzip package

verify=0
for arg in "$@"; do
  case $arg in
  --verify) verify=1 ;;
  -h | --help)
    sed -n '2,21p' "$0"
    exit 0
    ;;
  *)
    echo "usage: $0 [--verify]" >&2
    exit 2
    ;;
  esac
done

log() { printf '[test-image] %s\n' "$*" >&2; }
die() {
  printf '[test-image] ERROR: %s\n' "$*" >&2
  exit 1
}

if [[ -z ${HOME:-} ]]; then
  HOME=$(getent passwd "$(id -u)" | cut -d: -f6)
fi
WORK=${CLW_PEER_CACHE:-$HOME/.cache/cl-worker-peers}/test-image
ROOTFS=$WORK/rootfs
mkdir -p "$WORK"
# One build at a time (test binaries, scripts and CI may call this concurrently).
exec 9>"$WORK/.lock"
flock 9

command -v docker >/dev/null || die "docker CLI not found"
docker info >/dev/null 2>&1 || die "docker engine not reachable (docker info failed)"

# ---------------------------------------------------------------------------
# A static busybox: the host's if it is static, else Debian's busybox-static
# package, downloaded (not installed) into the work dir.
# ---------------------------------------------------------------------------
is_static() { ! ldd "$1" >/dev/null 2>&1; }

find_busybox() {
  local b
  for b in ${CLW_BUSYBOX:-} /bin/busybox /usr/bin/busybox; do
    if [[ -x $b ]] && is_static "$b"; then
      echo "$b"
      return 0
    fi
  done
  b=$WORK/busybox-static/bin/busybox
  if [[ ! -x $b ]]; then
    log "downloading Debian's busybox-static package"
    local dl=$WORK/deb
    rm -rf "$dl" "$WORK/busybox-static"
    mkdir -p "$dl"
    if ! (cd "$dl" && apt-get download busybox-static >/dev/null 2>&1); then
      apt-get update -q >/dev/null 2>&1 || true
      (cd "$dl" && apt-get download busybox-static >/dev/null 2>&1) ||
        die "apt-get download busybox-static failed"
    fi
    dpkg-deb -x "$dl"/busybox-static_*.deb "$WORK/busybox-static"
    rm -rf "$dl"
  fi
  if [[ ! -x $b ]] || ! is_static "$b"; then
    die "no static busybox at $b"
  fi
  echo "$b"
}

# ---------------------------------------------------------------------------
# rootfs (merged /usr like Debian 12: /bin -> usr/bin, /lib -> usr/lib, ...)
# ---------------------------------------------------------------------------
copy_file() { # copy_file HOST_PATH [PATH_IN_ROOTFS]; follows symlinks
  local src=$1 dst=${2:-$1}
  mkdir -p "$ROOTFS$(dirname "$dst")"
  cp -L --preserve=mode "$src" "$ROOTFS$dst"
}

copy_libs() { # the shared libraries (and the loader) of a host binary
  local bin=$1 lib
  if is_static "$bin"; then
    return 0
  fi
  while read -r lib; do
    if [[ -n $lib && -e $lib && ! -e $ROOTFS$lib ]]; then
      copy_file "$lib"
    fi
  done < <(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
}

add_bin() { # add_bin NAME_OR_PATH [NAME_IN_IMAGE]
  local src name
  src=$(command -v "$1" || true)
  [[ -n $src ]] || die "tool not found on the host: $1"
  name=${2:-$(basename "$src")}
  if [[ -e $ROOTFS/usr/bin/$name ]]; then
    return 0
  fi
  copy_file "$src" "/usr/bin/$name"
  copy_libs "$src"
}

build_rootfs() {
  local busybox=$1 f a
  rm -rf "$ROOTFS"
  mkdir -p "$ROOTFS"/{usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,usr/lib64,usr/local/bin}
  mkdir -p "$ROOTFS"/{etc,root,home,dev,proc,sys,run,var/tmp,tmp}
  ln -s usr/bin "$ROOTFS/bin"
  ln -s usr/sbin "$ROOTFS/sbin"
  ln -s usr/lib "$ROOTFS/lib"
  ln -s usr/lib64 "$ROOTFS/lib64"
  chmod 1777 "$ROOTFS/tmp" "$ROOTFS/var/tmp"
  chmod 700 "$ROOTFS/root"

  # all of coreutils (dpkg knows the list), then the rest
  if command -v dpkg >/dev/null; then
    while read -r f; do
      if [[ -f $f && -x $f ]]; then
        add_bin "$f"
      fi
    done < <(dpkg -L coreutils | grep -E '^/(usr/)?s?bin/[^/]+$' | LC_ALL=C sort)
    if [[ -f /usr/libexec/coreutils/libstdbuf.so ]]; then
      copy_file /usr/libexec/coreutils/libstdbuf.so
    fi
  fi
  for f in "${TOOLS[@]}"; do
    add_bin "$f"
  done
  ln -s dash "$ROOTFS/usr/bin/sh"
  ln -s mawk "$ROOTFS/usr/bin/awk"
  for f in "${GZIP_SCRIPTS[@]}"; do
    if command -v "$f" >/dev/null; then copy_file "$(command -v "$f")" "/usr/bin/$f"; fi
  done

  cp "$busybox" "$ROOTFS/usr/bin/busybox"
  chmod 755 "$ROOTFS/usr/bin/busybox"
  local applets
  applets=$("$busybox" --list)
  for a in "${APPLETS[@]}"; do
    if [[ ! -e $ROOTFS/usr/bin/$a ]] && grep -qx "$a" <<<"$applets"; then
      ln -s busybox "$ROOTFS/usr/bin/$a"
    fi
  done

  cat >"$ROOTFS/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/bash
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
EOF
  cat >"$ROOTFS/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
nogroup:x:65534:
EOF
  cat >"$ROOTFS/etc/nsswitch.conf" <<'EOF'
passwd: files
group: files
shadow: files
hosts: files dns
EOF
  printf 'cl-worker-test base image (tests/peers/test-image.sh), recipe %s\n' \
    "$IMAGE_RECIPE_VERSION" >"$ROOTFS/etc/cl-worker-test-image"
  chmod 644 "$ROOTFS"/etc/*
}

# Deterministic tarball: sorted names, fixed owner and mtime.
rootfs_tar() {
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
    -C "$ROOTFS" -cf - .
}

# The image imported for HASH. Images built FROM it inherit its label, so the label alone would
# also find them (the newest first): the import's own message tells it apart.
imported() {
  local c
  for c in $(docker images -q --no-trunc --filter "label=$LABEL_KEY=$1" | sort -u); do
    local comment
    comment=$(docker image inspect -f '{{.Comment}}' "$c" 2>/dev/null || true)
    if [[ $comment == "cl-worker test image, rootfs sha256 $1" ]]; then
      echo "$c"
      return 0
    fi
  done
}

main() {
  local busybox hash id tag
  busybox=$(find_busybox)
  build_rootfs "$busybox"
  hash=$({
    rootfs_tar
    printf '%s\n' "recipe=$IMAGE_RECIPE_VERSION" "${CHANGES[@]}"
  } | sha256sum | cut -d' ' -f1)

  id=$(imported "$hash")
  if [[ -n $id ]]; then
    log "image with $LABEL_KEY=$hash already exists: $id"
  else
    log "importing rootfs ($(du -sh "$ROOTFS" | cut -f1)) as ${TAGS[0]}"
    local change_args=() c
    for c in "${CHANGES[@]}" "LABEL $LABEL_KEY=$hash"; do
      change_args+=(--change "$c")
    done
    rootfs_tar | docker import "${change_args[@]}" \
      --message "cl-worker test image, rootfs sha256 $hash" - "${TAGS[0]}" >/dev/null
    id=$(imported "$hash")
    [[ -n $id ]] || die "docker import did not produce an image with label $LABEL_KEY=$hash"
    verify=1
  fi
  for tag in "${TAGS[@]}"; do
    docker tag "$id" "$tag"
  done
  log "tagged $id as ${TAGS[*]}"

  if [[ $verify -eq 1 ]]; then
    local out
    out=$(docker run --rm --network none "${TAGS[1]}" /bin/bash -c \
      'echo hi; ls / >/dev/null; head -c 1000000 /dev/urandom | sha256sum >/dev/null;
       nc --help 2>&1 | head -1; id -un; test -d /tmp -a -k /tmp && echo tmp-ok') ||
      die "smoke run in ${TAGS[1]} failed: $out"
    [[ $out == *hi*BusyBox*root*tmp-ok* ]] || die "unexpected smoke output: $out"
    log "smoke run ok"
  fi
  echo "$id"
}

main
