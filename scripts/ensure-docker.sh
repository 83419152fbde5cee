#!/usr/bin/env bash
# Makes sure this machine can run the integration suite: a Docker engine that answers, a base image, and the
# broker image built from the current source. Idempotent: when everything is already there it only checks
# (a few seconds). Each step says on stderr what it found and what it did.
#
# On a developer laptop (Docker running, a registry reachable) nothing is installed: the official
# python:3.11-slim base is pulled by `docker build`. On the CI machines (Debian 12, root, no engine, no registry,
# only PyPI and Debian's mirror) it:
#   1. installs Debian's docker.io when `dockerd` is missing (apt-get update only then);
#   2. starts dockerd in the background when `docker info` fails, with a storage driver and network settings the
#      kernel supports (overlay2 when an overlay mount works here, else vfs; --iptables=false when iptables can't
#      be used), logging to $SLUICE_DOCKER_DIR/dockerd.log;
#   3. when python:3.11-slim is neither present nor pullable, builds sluice-base:bookworm once with debootstrap
#      from the Debian mirror named in the machine's apt sources, and imports it (cached: skipped when present;
#      on a fresh machine whose DNS doesn't know Docker's registry, debootstrap starts before step 1, in parallel);
#   4. builds the broker image (scripts/build-image.sh, cached by a hash of the source).
# Environment: SLUICE_DOCKER_DIR (state and logs, default /var/tmp/sluice-docker), BASE_IMAGE (skip the base
# image logic and use this one), SLUICE_SKIP_IMAGE_BUILD=1 (stop after the engine and base image),
# SLUICE_DOCKERD_STORAGE_DRIVER (instead of the probed one; vfs is tried anyway if the engine won't start).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/debian-pins.sh
. scripts/debian-pins.sh

STATE_DIR=${SLUICE_DOCKER_DIR:-/var/tmp/sluice-docker}
OFFICIAL_BASE=python:3.11-slim
LOCAL_BASE=sluice-base:bookworm
# debootstrap always builds bookworm: its python3 is 3.11, the version the host wheelhouse is built for.
LOCAL_BASE_SUITE=bookworm
DOCKERD_START_TIMEOUT_S=60
PULL_TIMEOUT_S=180 # a registry that is absent fails at once (DNS); a slow one gets time for a first pull
mkdir -p "$STATE_DIR"
T0=$(date +%s)

log() { echo "[ensure-docker $(date +%H:%M:%S) +$(($(date +%s) - T0))s] $*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    die "need root to run: $* (install Docker yourself, or run this script as root)"
  fi
}

APT_UPDATED=0
apt_install() {
  command -v apt-get >/dev/null || die "no apt-get: install $* yourself"
  if [ "$APT_UPDATED" -eq 0 ]; then
    log "apt-get update"
    # Third-party sources that are unreachable here make update exit non-zero; Debian's own lists still arrive.
    as_root apt-get update -qq >"$STATE_DIR/apt-update.log" 2>&1 || log "apt-get update reported errors (see $STATE_DIR/apt-update.log); continuing"
    APT_UPDATED=1
  fi
  local pinned
  mapfile -t pinned < <(debian_pinned "$@")
  log "apt-get install ${pinned[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pinned[@]}" \
    >"$STATE_DIR/apt-install.log" 2>&1 || {
    tail -20 "$STATE_DIR/apt-install.log" >&2
    die "apt-get install $* failed (full log: $STATE_DIR/apt-install.log)"
  }
}

apt_mirror() {
  # The Debian mirror the machine already uses: first URI of a source for the main archive (not -security).
  local uri
  uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
    awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^https?:\/\//) { print $i; break } }' |
    grep -E '/debian/?$' | head -1 || true)
  if [ -z "$uri" ]; then
    uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '$1 == "URIs:" { for (i = 2; i <= NF; i++) print $i }' |
      grep -E '/debian/?$' | head -1 || true)
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

# The local base image's root filesystem is built by debootstrap in the background (network-bound, about a minute)
# so that it overlaps the engine's installation on a fresh machine.
ROOTFS="$STATE_DIR/rootfs-$LOCAL_BASE_SUITE"
ROOTFS_PID=""
start_rootfs() {
  command -v debootstrap >/dev/null || apt_install debootstrap
  local mirror
  mirror=$(apt_mirror)
  as_root rm -rf "$ROOTFS"
  log "debootstrap --variant=minbase $LOCAL_BASE_SUITE from $mirror, in the background (log: $STATE_DIR/debootstrap.log)"
  (
    as_root debootstrap --variant=minbase --include=python3,python3-venv,passwd "$LOCAL_BASE_SUITE" "$ROOTFS" \
      "$mirror" >"$STATE_DIR/debootstrap.log" 2>&1 || exit 1
    # Keep the image small: package caches and lists are not needed at run time.
    as_root rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/log/*.log
  ) &
  ROOTFS_PID=$!
}
finish_rootfs() {
  if ! wait "$ROOTFS_PID"; then
    ROOTFS_PID=""
    tail -20 "$STATE_DIR/debootstrap.log" >&2
    die "debootstrap failed (full log: $STATE_DIR/debootstrap.log)"
  fi
  ROOTFS_PID=""
}
stop_rootfs() {
  # On an early exit, the background debootstrap this script started is stopped (by its pids).
  if [ -n "$ROOTFS_PID" ]; then
    as_root pkill -TERM -P "$ROOTFS_PID" 2>/dev/null || true
    kill "$ROOTFS_PID" 2>/dev/null || true
  fi
}
trap stop_rootfs EXIT

# ---- 1. the engine's binaries ---------------------------------------------------------------------------------
engine_answers() { timeout 10 docker info >/dev/null 2>&1; }

if command -v docker >/dev/null && engine_answers; then
  log "Docker engine answers: nothing to install or start"
else
  if ! command -v dockerd >/dev/null || ! command -v containerd >/dev/null; then
    # A fresh machine that can't resolve Docker's registry will need the local base image: start building its
    # root filesystem now, while docker.io installs.
    if [ -z "${BASE_IMAGE:-}" ] && ! getent hosts registry-1.docker.io >/dev/null 2>&1; then
      log "no Docker registry reachable (DNS): the local base image will be needed"
      start_rootfs
    fi
    apt_install docker.io
  else
    log "dockerd and containerd are installed"
  fi
  command -v docker >/dev/null || die "docker CLI still missing after installing docker.io"

  # ---- 2. start dockerd --------------------------------------------------------------------------------------
  # Installing docker.io may have started the engine through its init script; give it a moment first.
  if pgrep -x dockerd >/dev/null; then
    log "a dockerd process exists; waiting for it to answer"
    for _ in $(seq 1 20); do engine_answers && break; sleep 0.5; done
  fi
  if ! engine_answers; then
    pgrep -x dockerd >/dev/null && die "dockerd is running (pid $(pgrep -x dockerd | tr '\n' ' ')) but does not answer; see its log or stop it, then re-run"
    storage_driver=vfs
    # overlay2 needs an overlay mount on the filesystem holding /var/lib/docker (fails on overlay-on-overlay).
    probe=$(mktemp -d /var/lib/sluice-overlay-probe.XXXXXX 2>/dev/null || mktemp -d)
    mkdir -p "$probe"/{lower,upper,work,merged}
    if as_root mount -t overlay overlay -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" \
      "$probe/merged" 2>/dev/null; then
      as_root umount "$probe/merged"
      storage_driver=overlay2
    fi
    rm -rf "$probe"
    storage_driver=${SLUICE_DOCKERD_STORAGE_DRIVER:-$storage_driver}
    net_flags=()
    if ! command -v iptables >/dev/null || ! as_root iptables -t nat -L -n >/dev/null 2>&1; then
      # Without NAT rules published ports are still served by docker-proxy on the host, which is all we use.
      net_flags=(--iptables=false --ip-masq=false)
    fi
    # After an engine was killed (e.g. the shell that started it ended), its pid files may name a dead or
    # zombie process; dockerd would then wait forever for "the running containerd". Drop such stale files.
    for pidfile in /var/run/docker/containerd/containerd.pid /var/run/docker.pid; do
      pid=$(cat "$pidfile" 2>/dev/null || true)
      if [ -n "$pid" ] && { ! kill -0 "$pid" 2>/dev/null || [ "$(ps -o stat= -p "$pid" | cut -c1)" = Z ]; }; then
        log "removing stale $pidfile (process $pid is gone)"
        as_root rm -f "$pidfile"
      fi
    done
    as_root mkdir -p /var/lib/docker
    # The probed settings first; if the engine won't come up with them, the most conservative ones (vfs works on
    # any filesystem, no iptables needs no netfilter modules).
    started=0
    for attempt in "$storage_driver ${net_flags[*]}" "vfs --iptables=false --ip-masq=false"; do
      read -r -a flags <<<"$attempt"
      log "starting dockerd: --storage-driver=${flags[*]} (log: $STATE_DIR/dockerd.log)"
      # setsid + nohup: the engine outlives this script and the test run that started it.
      as_root setsid nohup dockerd --storage-driver="${flags[0]}" "${flags[@]:1}" \
        >>"$STATE_DIR/dockerd.log" 2>&1 </dev/null &
      deadline=$(($(date +%s) + DOCKERD_START_TIMEOUT_S))
      until engine_answers; do
        if [ "$(date +%s)" -ge "$deadline" ] || ! pgrep -x dockerd >/dev/null; then break; fi
        sleep 0.5
      done
      if engine_answers; then
        started=1
        break
      fi
      tail -15 "$STATE_DIR/dockerd.log" >&2
      log "dockerd did not answer with --storage-driver=${flags[*]}"
      # Stop the engine this attempt started (by the pid it wrote; none ran before) before the next attempt.
      pid=$(cat /var/run/docker.pid 2>/dev/null || true)
      if [ -n "$pid" ]; then
        as_root kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      fi
    done
    [ "$started" = 1 ] || die "dockerd did not start (full log: $STATE_DIR/dockerd.log)"
    log "dockerd answers (server $(docker version --format '{{.Server.Version}}' 2>/dev/null))"
  fi
fi

# ---- 3. the base image --------------------------------------------------------------------------------------
image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

if [ -n "${BASE_IMAGE:-}" ]; then
  log "BASE_IMAGE=$BASE_IMAGE given: using it"
elif image_exists "$OFFICIAL_BASE"; then
  BASE_IMAGE=$OFFICIAL_BASE
  log "base image $BASE_IMAGE is present"
elif image_exists "$LOCAL_BASE"; then
  BASE_IMAGE=$LOCAL_BASE
  log "local base image $BASE_IMAGE is present (built earlier with debootstrap)"
elif timeout "$PULL_TIMEOUT_S" docker pull -q "$OFFICIAL_BASE" >"$STATE_DIR/pull.log" 2>&1; then
  BASE_IMAGE=$OFFICIAL_BASE
  log "pulled $BASE_IMAGE"
else
  log "cannot pull $OFFICIAL_BASE ($(tail -1 "$STATE_DIR/pull.log")): building $LOCAL_BASE with debootstrap"
  [ -n "$ROOTFS_PID" ] || start_rootfs
  finish_rootfs
  log "importing $ROOTFS as $LOCAL_BASE"
  as_root tar -C "$ROOTFS" -c . | docker import --change 'CMD ["/bin/bash"]' - "$LOCAL_BASE" >/dev/null
  as_root rm -rf "$ROOTFS"
  BASE_IMAGE=$LOCAL_BASE
fi
if [ -n "$ROOTFS_PID" ]; then
  log "the base image was found after all: discarding the debootstrap root filesystem"
  finish_rootfs
  as_root rm -rf "$ROOTFS"
fi
export BASE_IMAGE

# ---- 4. the broker image ------------------------------------------------------------------------------------
if [ "${SLUICE_SKIP_IMAGE_BUILD:-0}" = 1 ]; then
  log "SLUICE_SKIP_IMAGE_BUILD=1: not building the broker image"
else
  bash scripts/build-image.sh >/dev/null
fi
log "done in $(($(date +%s) - T0))s"
