#!/usr/bin/env bash
# Prints the JVM options that make a local Spark driver start in about half the time, for SPARK_SUBMIT_OPTS
# (scripts/test.sh exports them; a user may too): a class-data-sharing archive of the classes a SparkSession loads
# (built here once per PySpark and Java version, in the venv: about 150 MiB, 20 s), the client JIT only and the
# serial collector. The suite starts some hundred drivers (crash loops, jobs, sessions), most of whose start-up is
# loading and verifying Spark's classes; its queries are small, and their work is in Python workers, so the
# optimizing JIT and a parallel collector buy them nothing. A JVM whose class path no longer matches the archive
# ignores it and starts as usual (-Xshare:auto), and the logging switch keeps it from saying so on every start.
# Measured 2026-12-07 on this 2-core machine while other work ran (farm-bench, the two in turn): a session start and a
# small query 7.0 s against 14.1 s (median of 4); two of the connector's source tests 58.7 s against 97.5 s (median
# of 3).
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
pyspark=$($py -c 'import pyspark; print(pyspark.__version__)')
java=$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.version = //p') || java=none
archive="$PWD/.venv/spark-classes-$pyspark-java$java.jsa"
fast="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xlog:disable -Xlog:all=error:stderr"
if [ ! -s "$archive" ]; then
  rm -f "$archive".tmp
  SPARK_SUBMIT_OPTS="$fast -XX:ArchiveClassesAtExit=$archive.tmp" $py - >/dev/null 2>&1 <<'PY' || true
from streaming_jobs.common import spark_session

spark = spark_session("sluice-cds", shuffle_partitions=2, driver_memory="1g")
spark.range(10_000).selectExpr("id % 7 AS k").groupBy("k").count().collect()
spark.stop()
PY
  # The JVM writes the archive as it exits, after the Python driver has: wait for it (at most a minute).
  for _ in $(seq 120); do pgrep -f "ArchiveClassesAtExit=$archive.tmp" >/dev/null || break; sleep 0.5; done
  [ -s "$archive".tmp ] && mv "$archive".tmp "$archive"
fi
if [ -s "$archive" ]; then
  echo "$fast -XX:SharedArchiveFile=$archive"
else
  echo "$fast"  # no archive (no Java, or the JVM refused to write one): the other two options still help
fi
