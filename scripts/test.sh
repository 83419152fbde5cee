#!/usr/bin/env bash
# Runs the test suite. The integration suite needs a Docker engine: scripts/ensure-docker.sh
# installs and starts one when this machine has none (its header says how), then builds the broker image.
set -euo pipefail
cd "$(dirname "$0")/.."
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(tests)
if printf '%s\n' "${args[@]}" | grep -qE '^tests(/unit(/ha)?)?/?$'; then
  bash scripts/ensure-etcd.sh  # the replication tests start their own etcd (broker/ha/etcd_process.py)
fi
# Spark drivers (the connector's tests and crash loops, the jobs) start in about half the time with these JVM options;
# scripts/spark-cds.sh says what they are and why. A caller's own SPARK_SUBMIT_OPTS is kept.
SPARK_SUBMIT_OPTS="${SPARK_SUBMIT_OPTS:-$(bash scripts/spark-cds.sh)}"
export SPARK_SUBMIT_OPTS
# The short soak (tests/unit/test_soak.py, 2-3 minutes of a replicated cluster, a Spark job and a fault of every kind)
# runs beside the rest: started first, it overlaps the Docker engine's setup and the first tests rather than adding
# its minutes to the suite's half hour. Its own network namespaces and ports keep it apart from every other test.
soak=tests/unit/test_soak.py
soak_log=$(mktemp -t sluice-soak-XXXXXX.log)
soak_pid=""
if printf '%s\n' "${args[@]}" | grep -qE '^tests(/unit)?/?$'; then
  .venv/bin/python -m pytest -q -rfE -p no:cacheprovider "$soak" >"$soak_log" 2>&1 &
  soak_pid=$!
  # An interrupted suite interrupts the soak too: a background job ignores SIGINT, but the soak's run (pytest's child)
  # handles it itself (it stops, writes its report and removes its network); pytest is then ended.
  trap 'pkill -INT -P "$soak_pid" 2>/dev/null; kill -TERM "$soak_pid" 2>/dev/null; exit 130' INT TERM
  args+=(--deselect "$soak")
fi
if [ -x scripts/ensure-docker.sh ] && printf '%s\n' "${args[@]}" | grep -qE '^tests(/integration)?/?$'; then
  bash scripts/ensure-docker.sh
fi
if printf '%s\n' "${args[@]}" | grep -qE '^tests(/unit(/remoting(/test_rocketmq4_js_client\.py)?)?)?/?$'; then
  bash scripts/ensure-rocketmq-js.sh  # the RocketMQ 4 client the remoting tests drive (tests/remoting_js)
fi
status=0
.venv/bin/python -m pytest -q -rfEs --durations=30 "${args[@]}" || status=$?  # the slowest tests, to keep it short
if [ -n "$soak_pid" ]; then
  soak_status=0
  wait "$soak_pid" || soak_status=$?
  echo "=== the short soak ($soak), run beside the suite ==="
  tail -n 40 "$soak_log"
  [ "$soak_status" -eq 0 ] || status=$soak_status
fi
rm -f "$soak_log"
exit "$status"
