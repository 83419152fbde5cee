#!/usr/bin/env bash
# Runs the test suite. The integration suite needs a Docker engine: scripts/ensure-docker.sh
# installs and starts one when this machine has none (its header says how), then builds the broker image.
#
# The whole suite (`scripts/test.sh` or `scripts/test.sh tests`) runs as two streams on the machine's two cores:
# the unit suite in front, and beside it the short soak (tests/unit/test_soak.py) followed by the integration suite
# (tests/integration). Each stream spends most of its time waiting on processes it started (brokers, Spark drivers,
# containers): one stream alone keeps about 0.8 of the two cores busy (a `time` of tests/unit/cluster and the
# server crash tests: 137 s of CPU in 165 s). The soak runs first because it starts at once, while a fresh
# machine's Docker engine is still being installed and its image built. Every stream keeps to its own ports,
# network namespaces, stores and containers, so none sees another; a failure in any stream fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(tests)
names() { printf '%s\n' "${args[@]}"; }
if names | grep -qE '^tests(/unit(/ha)?)?/?$'; then
  bash scripts/ensure-etcd.sh  # the replication tests start their own etcd (broker/ha/etcd_process.py)
fi
# Spark drivers (the connector's tests and crash loops, the jobs) start in about half the time with these JVM options;
# scripts/spark-cds.sh says what they are and why. A caller's own SPARK_SUBMIT_OPTS is kept.
SPARK_SUBMIT_OPTS="${SPARK_SUBMIT_OPTS:-$(bash scripts/spark-cds.sh)}"
export SPARK_SUBMIT_OPTS

soak=tests/unit/test_soak.py
beside_dir=$(mktemp -d -t sluice-beside-XXXXXX)
beside_pid=""
run_soak=0
run_integration_beside=0
if names | grep -qE '^tests(/unit)?/?$'; then
  run_soak=1
  args+=(--deselect "$soak")
fi
if names | grep -qxE 'tests/?'; then
  run_integration_beside=1
  args+=(--ignore tests/integration)
fi
# The stream beside the unit suite. Each part writes its output to $beside_dir/<name>.log and its exit status to
# $beside_dir/<name>.status; report shows the log (all of it, or its last lines) and makes a failure the run's.
part() {
  local name=$1 s=0
  shift
  "$@" >"$beside_dir/$name.log" 2>&1 || s=$?
  echo "$s" >"$beside_dir/$name.status"
}
report() {
  local name=$1 title=$2 lines=$3 s
  echo "=== $title ==="
  if [ "$lines" = all ]; then cat "$beside_dir/$name.log"; else tail -n "$lines" "$beside_dir/$name.log"; fi
  s=$(cat "$beside_dir/$name.status" 2>/dev/null || echo 1)
  [ "$s" -eq 0 ] || status=$s
}
integration() {
  bash scripts/ensure-docker.sh && .venv/bin/python -m pytest -q -rfEs -p no:cacheprovider --durations=15 tests/integration
}
beside() {
  if [ "$run_soak" -eq 1 ]; then
    part soak .venv/bin/python -m pytest -q -rfE -p no:cacheprovider "$soak"
  fi
  if [ "$run_integration_beside" -eq 1 ]; then
    part integration integration
  fi
}
if [ "$run_soak" -eq 1 ] || [ "$run_integration_beside" -eq 1 ]; then
  beside &
  beside_pid=$!
  # An interrupted suite interrupts the stream beside it too: a background job ignores SIGINT, but a soak's run
  # (pytest's child) handles it itself (it stops, writes its report and removes its network); the rest is ended.
  trap 'pkill -INT -P "$beside_pid" 2>/dev/null; sleep 1; pkill -TERM -P "$beside_pid" 2>/dev/null;
        kill -TERM "$beside_pid" 2>/dev/null; rm -rf "$beside_dir"; exit 130' INT TERM
fi
if [ -x scripts/ensure-docker.sh ] && names | grep -qE '^tests/integration/?$'; then
  bash scripts/ensure-docker.sh
fi
if names | grep -qE '^tests(/unit(/remoting(/test_rocketmq4_js_client\.py)?)?)?/?$'; then
  bash scripts/ensure-rocketmq-js.sh  # the RocketMQ 4 client the remoting tests drive (tests/remoting_js)
fi
status=0
.venv/bin/python -m pytest -q -rfEs --durations=30 "${args[@]}" || status=$?  # the slowest tests, to keep it short
if [ -n "$beside_pid" ]; then
  wait "$beside_pid" || true
  if [ "$run_soak" -eq 1 ]; then
    report soak "the short soak ($soak), run beside the unit suite" 40
  fi
  if [ "$run_integration_beside" -eq 1 ]; then
    report integration "the integration suite (tests/integration), run beside the unit suite after the soak" all
  fi
fi
rm -rf "$beside_dir"
exit "$status"
