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
if printf '%s\n' "${args[@]}" | grep -qE '^tests(/unit(/ha)?)?/?$'; then
  bash scripts/ensure-etcd.sh  # the replication tests start their own etcd (broker/ha/etcd_process.py)
fi
# Spark drivers (the connector's tests and crash loops, the jobs) start in about half the time with these JVM options;
# scripts/spark-cds.sh says what they are and why. A caller's own SPARK_SUBMIT_OPTS is kept.
SPARK_SUBMIT_OPTS="${SPARK_SUBMIT_OPTS:-$(bash scripts/spark-cds.sh)}"
export SPARK_SUBMIT_OPTS
exec .venv/bin/python -m pytest -q -rfEs --durations=30 "${args[@]}"  # the slowest tests, to keep the suite short
