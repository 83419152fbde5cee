"""Spark source throughput: rows/s reading 1M messages of 100 B with Trigger.AvailableNow into the noop sink.

In one run, beside the sluice source (a broker subprocess on loopback, executors pulling and decoding raw
entries), two references:

- ``python-memory``: a trivial Python streaming data source with the same schema that yields pre-built Arrow batches
  from memory: the ceiling of Spark's Python Data Source path on this machine;
- ``jvm-rate``: Spark's JVM ``rate-micro-batch`` source (two columns, no Python at all).

Each source runs once as a warm-up on a small input (JVM JIT, Python worker start-up), then measured runs over the
full input; the best and median wall times of the query (start to termination) are reported.

    python -m bench.spark_source [--messages 1000000] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit

from bench.report import run_date
from broker.client import Admin, Producer
from broker.format.message import encode_entry
from broker.server.process import BrokerProcess
from connector import SCHEMA
from connector.record_batch import RowFilter, decode_entries
from streaming_jobs.common import spark_session

RESULTS = Path(__file__).with_name("results") / "spark_source.json"
QUEUES = 8
BODY_BYTES = 100
TARGET_ROWS_S = 300_000
TARGET_RATIO = 0.6


# ------------------------------------------------------------------------------------------------ reference (a)


def template_batch(rows: int) -> pa.RecordBatch:
    """A batch of ``rows`` sluice rows (100 B bodies), decoded once, for the in-memory source to repeat."""
    entries = [encode_entry(b"bench", 0, bytes(BODY_BYTES), queue_offset=i) for i in range(rows)]
    positions = [0]
    for e in entries[:-1]:
        positions.append(positions[-1] + len(e))
    return decode_entries(
        b"".join(entries), positions, topic="bench", broker="broker-a", include_properties=False,
        row_filter=RowFilter(0, rows),
    )


class MemoryReader(DataSourceStreamReader):
    BATCH_ROWS = 4096  # what one sluice pull yields by default (pullBatchSize)

    def __init__(self, total: int, partitions: int) -> None:
        self.total, self.parts = total, partitions

    def initialOffset(self) -> dict:
        return {"rows": 0}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        assert isinstance(limit, ReadAllAvailable)
        return {"rows": self.total}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        n = end["rows"] - start["rows"]
        per = -(-n // self.parts)
        return [InputPartition(min(per, n - i * per)) for i in range(self.parts) if n - i * per > 0]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        batch = template_batch(self.BATCH_ROWS)
        left = int(partition.value)
        while left > 0:
            yield batch if left >= batch.num_rows else batch.slice(0, left)
            left -= batch.num_rows


class MemorySource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "bench_memory"

    def schema(self) -> Any:
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return MemoryReader(int(self.options["rows"]), int(self.options["partitions"]))


# ------------------------------------------------------------------------------------------------ runs


def run_available_now(df: Any, checkpoint_root: Path) -> float:
    started = time.perf_counter()
    q = (
        df.writeStream.format("noop").option("checkpointLocation", str(checkpoint_root / uuid.uuid4().hex))
        .trigger(availableNow=True).start()
    )
    q.awaitTermination()
    elapsed = time.perf_counter() - started
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    rows = sum(p["numInputRows"] for p in q.recentProgress)
    return elapsed if rows else float("nan")


def fill_topic(endpoint: str, topic: str, messages: int) -> None:
    per_queue = messages // QUEUES
    body = bytes(range(BODY_BYTES))
    with Admin(endpoint) as admin:
        admin.create_topic(topic, QUEUES)
    with Producer(endpoint) as producer:
        for q in range(QUEUES):
            entry = encode_entry(topic.encode(), q, body)
            per_call = (3 << 20) // len(entry)
            left = per_queue
            while left:
                n = min(per_call, left)
                producer.send_encoded(entry * n, n)
                left -= n


def measure(name: str, make_df: Callable[[int], Any], rows: int, warm_rows: int, runs: int, root: Path) -> dict:
    run_available_now(make_df(warm_rows), root)
    times = [run_available_now(make_df(rows), root) for _ in range(runs)]
    best, median = min(times), statistics.median(times)
    return {"source": name, "rows": rows, "runs": runs, "best_s": round(best, 3), "median_s": round(median, 3),
            "rows_per_s": round(rows / best), "median_rows_per_s": round(rows / median)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.spark_source", description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    rows = args.messages // QUEUES * QUEUES
    warm = min(rows, 80_000)

    with tempfile.TemporaryDirectory(prefix="bench-spark-source-") as tmp:
        root = Path(tmp)
        broker = BrokerProcess(root / "store").start()
        try:
            t0 = time.perf_counter()
            fill_topic(broker.endpoint, "bench_src", rows)
            fill_topic(broker.endpoint, "bench_warm", warm)
            print(f"sent {rows:,} messages of {BODY_BYTES} B in {time.perf_counter() - t0:.1f} s", flush=True)
            spark = spark_session("bench-spark-source", shuffle_partitions=2)
            spark.dataSource.register(MemorySource)

            def sluice(n: int) -> Any:
                topic = "bench_src" if n == rows else "bench_warm"
                return (spark.readStream.format("sluice").option("endpoints", broker.endpoint).option("topic", topic)
                        .option("startingOffsets", "earliest").load())

            def memory(n: int) -> Any:
                return (spark.readStream.format("bench_memory").option("rows", str(n))
                        .option("partitions", str(QUEUES)).load())

            def rate(n: int) -> Any:
                return (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", str(n))
                        .option("numPartitions", "2").load())

            results = [
                measure("sluice", sluice, rows, warm, args.runs, root),
                measure("python-memory", memory, rows, warm, args.runs, root),
                measure("jvm-rate", rate, rows, warm, args.runs, root),
            ]
            spark.stop()
        finally:
            broker.stop()

    by = {r["source"]: r for r in results}
    ratio = by["sluice"]["rows_per_s"] / by["python-memory"]["rows_per_s"]
    print(f"\n{'source':<15}{'rows':>11}{'best s':>9}{'median s':>10}{'rows/s (best)':>15}{'rows/s (median)':>17}")
    for r in results:
        print(f"{r['source']:<15}{r['rows']:>11,}{r['best_s']:>9.2f}{r['median_s']:>10.2f}"
              f"{r['rows_per_s']:>15,}{r['median_rows_per_s']:>17,}")
    print(f"\nsluice / python-memory = {ratio:.2f} (target >= {TARGET_RATIO}); "
          f"sluice {by['sluice']['rows_per_s']:,} rows/s (target >= {TARGET_ROWS_S:,})")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "spark_source", "date": run_date(), "machine_cores": os.cpu_count(), "body_bytes": BODY_BYTES,
        "queues": QUEUES,
        "spark_master": "local[2]", "trigger": "availableNow", "sink": "noop", "results": results,
        "sluice_over_python_memory": round(ratio, 3),
        "targets": {"rows_per_s": TARGET_ROWS_S, "ratio_to_python_memory": TARGET_RATIO},
        "load_average_1m": round(os.getloadavg()[0], 2),
    }, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
