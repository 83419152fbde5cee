"""Streaming queries of ``format("sluice")`` started and stopped one after another in one driver process, the way a
job's Ctrl-C stops its query, so that a test can read all that the driver and Spark's Python processes print.

python stop_queries.py ENDPOINT TOPIC CHECKPOINTS COUNT

Prints "stopped COUNT queries" once every query stopped without an error. Linux only (it watches /proc).

Each query is stopped a little after the Python process that owns its reader (PySpark's streaming-source runner)
started loading the reader, at moments spread over what follows: Spark waiting for the reader to be created, its
first calls, and the triggers after them (with nothing to read, the reader answers latestOffset back to back), when
the query's thread is talking to Python. Not earlier: a query stopped while that process is still connecting back to
Spark leaves it to time out and print PySpark's own traceback, before any code of the reader has run.
"""

from __future__ import annotations

import os
import sys
import time

os.environ["PYSPARK_PYTHON"] = sys.executable

from streaming_jobs.common import spark_session

RUNNER_MODULE = b"pyspark.sql.streaming.python_streaming_source_runner"  # in the process's command line
# grpc's compiled module: mapped into the runner process while it unpickles the data source (connector imports the
# broker client), which Spark sends right after the process connected back, with all else the process reads first
READER_LOADING = "cygrpc"
STOP_AFTER_S = (0.0, 0.15, 0.3, 0.6, 1.0)  # after READER_LOADING appears, query by query in turn
RUNNER_WITHIN_S = 120.0
POLL_S = 0.01


def runner_pids() -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if RUNNER_MODULE in f.read():
                    found.add(int(entry))
        except OSError:  # ended meanwhile
            continue
    return found


def wait_for_reader_loading(known: set[int]) -> None:
    """Until a runner process not in ``known`` has mapped READER_LOADING; it joins ``known``."""
    deadline = time.monotonic() + RUNNER_WITHIN_S
    while time.monotonic() < deadline:
        for pid in runner_pids() - known:
            try:
                with open(f"/proc/{pid}/maps") as f:
                    if READER_LOADING in f.read():
                        known.add(pid)
                        return
            except OSError:
                known.add(pid)  # ended already: not this query's
        time.sleep(POLL_S)
    raise TimeoutError(f"no source runner process loaded a reader within {RUNNER_WITHIN_S:.0f} s")


def main() -> int:
    endpoint, topic, checkpoints, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    spark = spark_session("sluice-stop-queries", driver_memory="768m")
    known = runner_pids()
    for i in range(count):
        df = (
            spark.readStream.format("sluice").option("endpoints", endpoint).option("topic", topic)
            .option("startingOffsets", "latest").load()
        )
        query = (
            df.writeStream.format("noop").option("checkpointLocation", os.path.join(checkpoints, str(i)))
            .trigger(processingTime="0 seconds").start()
        )
        wait_for_reader_loading(known)
        time.sleep(STOP_AFTER_S[i % len(STOP_AFTER_S)])
        query.stop()
        if query.exception() is not None:
            sys.stderr.write(f"query {i} failed: {query.exception()}\n")
            return 1
    spark.stop()
    print(f"stopped {count} queries", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
