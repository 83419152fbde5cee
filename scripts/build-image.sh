#!/usr/bin/env bash
# Builds the broker image from the current source and prints its tag on stdout (progress goes to stderr).
#
# The image is installed from a wheelhouse prepared on the host (`pip wheel`: sluice + its runtime dependencies,
# not pyspark) with `pip install --no-index`, so building needs no network inside the image and no registry
# beyond the base image. Both are cached under .docker-build/:
#   - the dependency wheels by a hash of the runtime lock (requirements/runtime.txt) and the target Python (3.11);
#   - the image by a hash of the source, Dockerfile and base image: an unchanged tree is not rebuilt
#     (sluice-broker:src-<hash>), and sluice-broker:latest points at the newest build.
# Environment: BASE_IMAGE (default: python:3.11-slim, or sluice-base:bookworm when only that one is present, as
# scripts/ensure-docker.sh leaves it), IMAGE_NAME (default sluice-broker), PYTHON (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE_NAME=${IMAGE_NAME:-sluice-broker}
PYTHON=${PYTHON:-.venv/bin/python}
# Both base images run CPython 3.11 (python:3.11-slim and Debian bookworm's python3).
IMAGE_PYTHON_VERSION=3.11
WORK=.docker-build
mkdir -p "$WORK"
T0=$(date +%s)
log() { echo "[build-image $(date +%H:%M:%S) +$(($(date +%s) - T0))s] $*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

command -v docker >/dev/null || die "no docker CLI (run scripts/ensure-docker.sh)"
docker info >/dev/null 2>&1 || die "the Docker engine does not answer (run scripts/ensure-docker.sh)"
[ -x "$PYTHON" ] || die "no $PYTHON (run make venv)"

# One build at a time: concurrent test runs share the cache.
exec 9>"$WORK/lock"
flock 9

if [ -z "${BASE_IMAGE:-}" ]; then
  if ! docker image inspect python:3.11-slim >/dev/null 2>&1 && docker image inspect sluice-base:bookworm >/dev/null 2>&1; then
    BASE_IMAGE=sluice-base:bookworm
  else
    BASE_IMAGE=python:3.11-slim
  fi
fi
base_id=$(docker image inspect --format '{{.Id}}' "$BASE_IMAGE" 2>/dev/null || echo "$BASE_IMAGE")

# ---- cache keys ---------------------------------------------------------------------------------------------
# The broker's runtime dependencies at the lock's versions and hashes (requirements/runtime.txt, made by
# `make lock`): the image runs exactly what the host suite runs.
RUNTIME_LOCK=requirements/runtime.txt
[ -f "$RUNTIME_LOCK" ] || die "no $RUNTIME_LOCK (run make lock)"
deps=$(cat "$RUNTIME_LOCK")
host_py=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
arch=$(uname -m)
deps_key=$(printf '%s\n%s\n%s\n' "$deps" "$IMAGE_PYTHON_VERSION" "$arch" | sha256sum | cut -c1-16)
# Everything that ends up in the image: tracked and untracked-but-not-ignored files of the packages.
src_key=$(
  {
    git ls-files -co --exclude-standard -- broker connector streaming_jobs pyproject.toml Dockerfile .dockerignore |
      grep -v '__pycache__' | LC_ALL=C sort | while read -r f; do [ -f "$f" ] && sha256sum "$f"; done
    echo "$base_id $deps_key"
  } | sha256sum | cut -c1-16
)
tag="$IMAGE_NAME:src-$src_key"

if docker image inspect "$tag" >/dev/null 2>&1; then
  log "image $tag is up to date"
  docker tag "$tag" "$IMAGE_NAME:latest"
  echo "$tag"
  exit 0
fi

# ---- wheelhouse ---------------------------------------------------------------------------------------------
deps_dir="$WORK/deps-$deps_key"
if [ ! -f "$deps_dir/.complete" ]; then
  rm -rf "$deps_dir"
  mkdir -p "$deps_dir"
  if [ "$host_py" = "$IMAGE_PYTHON_VERSION" ]; then
    log "pip wheel of the runtime dependencies into $deps_dir"
    "$PYTHON" -m pip wheel --quiet --require-hashes --no-deps --wheel-dir "$deps_dir" -r "$RUNTIME_LOCK" \
      >"$WORK/pip.log" 2>&1 || die "pip wheel failed (log: $WORK/pip.log)"
  else
    # Host Python differs from the image's: fetch binary wheels for the image's interpreter instead.
    log "host Python $host_py != $IMAGE_PYTHON_VERSION: pip download of cp311 wheels into $deps_dir"
    "$PYTHON" -m pip download --quiet --only-binary=:all: --dest "$deps_dir" \
      --python-version "$IMAGE_PYTHON_VERSION" --implementation cp --abi cp311 \
      --platform "manylinux2014_$arch" --platform "manylinux_2_17_$arch" --platform "manylinux_2_28_$arch" \
      --require-hashes --no-deps -r "$RUNTIME_LOCK" >"$WORK/pip.log" 2>&1 || die "pip download failed (log: $WORK/pip.log)"
  fi
  touch "$deps_dir/.complete"
  # Older dependency caches are dead weight.
  find "$WORK" -maxdepth 1 -name 'deps-*' ! -name "deps-$deps_key" -exec rm -rf {} +
fi

# sluice itself, built from a clean copy of the source so the work tree gets no build/ or egg-info.
src_copy=$(mktemp -d)
trap 'rm -rf "$src_copy"' EXIT
git ls-files -co --exclude-standard -- broker connector streaming_jobs pyproject.toml README.md |
  grep -v '__pycache__' | while read -r f; do [ -f "$f" ] && echo "$f"; done | tar -c -T - | tar -x -C "$src_copy"
[ -f "$src_copy/README.md" ] || echo "# Sluice" >"$src_copy/README.md"
# Two folders, two image layers: the dependencies' layer stays cached while only sluice changes.
wheels="$WORK/wheels"
rm -rf "$wheels"
mkdir -p "$wheels/deps" "$wheels/sluice"
log "pip wheel sluice (no deps)"
# Without build isolation the venv's setuptools builds it (no download); with isolation as a fallback.
"$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$wheels/sluice" "$src_copy" \
  >"$WORK/pip.log" 2>&1 ||
  "$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$wheels/sluice" "$src_copy" >>"$WORK/pip.log" 2>&1 ||
  die "pip wheel of sluice failed (log: $WORK/pip.log)"
ln "$deps_dir"/*.whl "$wheels/deps/" 2>/dev/null || cp "$deps_dir"/*.whl "$wheels/deps/"

# ---- image --------------------------------------------------------------------------------------------------
# BuildKit when the buildx plugin is there (laptops); the classic builder otherwise (Debian's docker.io).
if docker buildx version >/dev/null 2>&1; then export DOCKER_BUILDKIT=1; else export DOCKER_BUILDKIT=0; fi
log "docker build $tag from $BASE_IMAGE (log: $WORK/build.log)"
if ! docker build --build-arg "BASE_IMAGE=$BASE_IMAGE" --label "sluice.src=$src_key" \
  -t "$tag" -t "$IMAGE_NAME:latest" . >"$WORK/build.log" 2>&1; then
  tail -30 "$WORK/build.log" >&2
  die "docker build failed (full log: $WORK/build.log)"
fi
rm -rf "$wheels"
# Older source builds are dead weight (one in use by a running container stays: rm refuses, and that's fine).
docker images --format '{{.Repository}}:{{.Tag}}' "$IMAGE_NAME" | grep -E ':src-' | grep -vx "$tag" |
  xargs -r docker image rm >/dev/null 2>&1 || true
log "built $tag"
echo "$tag"
