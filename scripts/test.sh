#!/usr/bin/env bash
# Runs the test suite. The integration suite needs a Docker engine: scripts/ensure-docker.sh
# installs and starts one when this machine has none (its header says how), then builds the broker image.
set -euo pipefail
cd "$(dirname "$0")/.."
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(tests)
if [ -x scripts/ensure-docker.sh ] && printf '%s\n' "${args[@]}" | grep -qE '^tests(/integration)?/?$'; then
  bash scripts/ensure-docker.sh
fi
exec .venv/bin/python -m pytest -q -rfEs "${args[@]}"
