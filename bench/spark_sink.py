"""Spark sink throughput: rows/s writing 1M rows of 100 B from Spark into the broker.

In one run, the same DataFrame (generated in the JVM: ``spark.range`` with a 100-byte body) is written to
- the ``noop`` sink (Spark's ceiling for producing the rows at all, no Python involved),
- the sluice sink with ``deliveryGuarantee=at-least-once`` (plain SendBatch),
- the sluice sink with ``deliveryGuarantee=exactly-once`` (rows written once, in place, then one commit marker),
- ``python-noop``: a trivial Python Arrow data-source writer that drops every batch: the ceiling of Spark's Python
  data-sink path on this machine (the JVM noop sink never leaves the JVM, so it is no bound for any Python sink),
each as a batch write (``df.write``) after a warm-up write of 50,000 rows. The broker is a subprocess on loopback
with ASYNC flush. Best and median of ``--runs`` are reported, and for the two sluice writes the commit-log bytes
the broker wrote per row (its ``commit_log_max_offset`` before and after each run) and exactly-once's speed as a
ratio of at-least-once's (target: 0.75, and bytes per row within 1.1x).

    python -m bench.spark_sink [--rows 1000000] [--runs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from bench.report import run_date
from broker.client import Admin
from broker.server.process import BrokerProcess
from streaming_jobs.common import spark_session

RESULTS = Path(__file__).with_name("results") / "spark_sink.json"
BODY_BYTES = 100
QUEUES = 8
TARGET_ROWS_S = 200_000
TARGET_RATIO = 0.5
TARGET_EO_OF_ALO = 0.75  # exactly-once's rows/s against at-least-once's, same run
TARGET_BYTES_RATIO = 1.1  # broker bytes written per exactly-once row against per at-least-once row


class DropWriter(DataSourceArrowWriter):
    def write(self, iterator: Any) -> WriterCommitMessage:
        for _batch in iterator:
            pass
        return WriterCommitMessage()


class DropSource(DataSource):
    """``format("python-noop")``: the Python sink path with no work behind it."""

    @classmethod
    def name(cls) -> str:
        return "python-noop"

    def writer(self, schema: StructType, overwrite: bool) -> DropWriter:
        return DropWriter()


def frame(spark: SparkSession, rows: int, partitions: int) -> Any:
    pad = "x" * (BODY_BYTES - 12)
    return spark.range(0, rows, 1, partitions).select(
        F.concat(F.lpad(F.col("id").cast("string"), 12, "0"), F.lit(pad)).alias("body")
    )


def timed(write: Callable[[], None]) -> float:
    started = time.perf_counter()
    write()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.spark_sink", description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=2, help="write tasks (the machine has 2 cores)")
    ap.add_argument("--python-cpus", default="", help="the broker's --python-cpus (default: its own, auto)")
    args = ap.parse_args(argv)
    spark = spark_session("bench-spark-sink")
    spark.dataSource.register(DropSource)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sluice-bench-sink-") as tmp:
        extra = ["--python-cpus", args.python_cpus] if args.python_cpus else []
        broker = BrokerProcess(Path(tmp) / "store", extra_args=extra).start()
        try:
            with Admin(broker.endpoint) as admin:
                for t in ("bench_alo", "bench_eo", "bench_warm"):
                    admin.create_topic(t, QUEUES, if_not_exists=True)

            def sluice(topic: str, guarantee: str, n: int) -> Callable[[], None]:
                return lambda: (
                    frame(spark, n, args.partitions).write.format("sluice").option("endpoints", broker.endpoint)
                    .option("topic", topic).option("deliveryGuarantee", guarantee).mode("append").save()
                )

            def noop(n: int) -> Callable[[], None]:
                return lambda: frame(spark, n, args.partitions).write.format("noop").mode("overwrite").save()

            def python_noop(n: int) -> Callable[[], None]:
                return lambda: frame(spark, n, args.partitions).write.format("python-noop").mode("append").save()

            for warm in (noop(50_000), python_noop(50_000), sluice("bench_warm", "at-least-once", 50_000)):
                warm()
            cases = {
                "noop": lambda: noop(args.rows),
                "python-noop": lambda: python_noop(args.rows),
                "sluice at-least-once": lambda: sluice("bench_alo", "at-least-once", args.rows),
                "sluice exactly-once": lambda: sluice("bench_eo", "exactly-once", args.rows),
            }

            def log_end() -> int:
                with Admin(broker.endpoint) as admin:
                    return int(admin.stats()["store_commit_log_max_offset"])

            for name, make in cases.items():
                times: list[float] = []
                written: list[int] = []
                for _ in range(args.runs):
                    before = log_end()
                    times.append(timed(make()))
                    written.append(log_end() - before)
                rows.append(
                    {"sink": name, "rows": args.rows, "best_s": min(times), "median_s": statistics.median(times),
                     "rows_per_s": args.rows / min(times), "broker_bytes_per_row": min(written) / args.rows}
                )
        finally:
            broker.stop()
    spark.stop()
    noop_rate, py_rate = rows[0]["rows_per_s"], rows[1]["rows_per_s"]
    for r in rows:
        r["ratio_to_noop"] = r["rows_per_s"] / noop_rate
        r["ratio_to_python_noop"] = r["rows_per_s"] / py_rate
    print(f"{'sink':<24} {'rows':>9} {'best s':>8} {'rows/s':>10} {'x noop':>7} {'x py-noop':>9} {'B/row':>6}")
    for r in rows:
        per_row = f"{r['broker_bytes_per_row']:>6.0f}" if r["sink"].startswith("sluice") else f"{'':>6}"
        print(
            f"{r['sink']:<24} {r['rows']:>9} {r['best_s']:>8.2f} {r['rows_per_s']:>10,.0f} "
            f"{r['ratio_to_noop']:>7.2f} {r['ratio_to_python_noop']:>9.2f} {per_row}"
        )
    alo, eo = rows[-2], rows[-1]
    verdict = eo["rows_per_s"] >= TARGET_ROWS_S and eo["ratio_to_noop"] >= TARGET_RATIO
    print(
        f"target: exactly-once >= {TARGET_ROWS_S:,} rows/s and >= {TARGET_RATIO} x noop: "
        + ("met" if verdict else "NOT met")
    )
    eo_of_alo = eo["rows_per_s"] / alo["rows_per_s"]
    bytes_ratio = eo["broker_bytes_per_row"] / alo["broker_bytes_per_row"]
    matched = eo_of_alo >= TARGET_EO_OF_ALO and bytes_ratio <= TARGET_BYTES_RATIO
    print(
        f"exactly-once / at-least-once: {eo_of_alo:.2f}x rows/s (target >= {TARGET_EO_OF_ALO}), {bytes_ratio:.3f}x "
        f"broker bytes per row (target <= {TARGET_BYTES_RATIO}): " + ("met" if matched else "NOT met")
    )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {"date": run_date(),
             "machine": {"cpu_count": os.cpu_count()}, "body_bytes": BODY_BYTES, "rows": rows, "target_met": verdict,
             "exactly_once_of_at_least_once": eo_of_alo, "bytes_per_row_ratio": bytes_ratio,
             "exactly_once_target_met": matched},
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
