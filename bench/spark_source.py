"""Spark source throughput: rows/s reading 1M messages of 100 B with Trigger.AvailableNow into the noop sink.

In one run, beside the sluice source (a broker subprocess on loopback, executors pulling and decoding raw
entries), two references:

- ``python-memory``: a trivial Python streaming data source with the same schema that yields pre-built Arrow batches
  from memory: the ceiling of Spark's Python Data Source path on this machine;
- ``jvm-rate``: Spark's JVM ``rate-micro-batch`` source (two columns, no Python at all).

After the rounds, the source's own share without Spark (``outside_spark``): the CPU a row of reading every
partition as an executor does, of the pulls alone, and of the broker serving them.

Each source runs once as a warm-up on a small input (JVM JIT, Python worker start-up); then ``--runs`` rounds (at
least three) go over the sources in turn, each timing one query over the full input from start to termination, so
that a burst of other load falls on every source alike. A source's figure is the median of its rounds with the
slowest and fastest beside it; the ratio to the in-memory source is the median of the per-round ratios (round ``i``
of Sluice against round ``i`` of the in-memory source), with their range.

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
TARGET_RATIO = 0.95  # of the in-memory source's rows/s, round by round
MIN_ROUNDS = 3  # a median needs three rounds to say anything a best round does not


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
        # Made once, on the driver, and shipped with the reader to each task: a round times handing pre-built
        # batches to Spark, not making them.
        self.batch = template_batch(self.BATCH_ROWS)

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
        batch = self.batch
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


def measure(sources: dict[str, Callable[[int], Any]], rows: int, warm_rows: int, rounds: int, root: Path
            ) -> dict[str, list[float]]:
    """Seconds of each round of each source: every source warmed up once, then the rounds taken in turn."""
    for make_df in sources.values():
        run_available_now(make_df(warm_rows), root)
    times: dict[str, list[float]] = {name: [] for name in sources}
    for round_no in range(rounds):
        for name, make_df in sources.items():
            times[name].append(run_available_now(make_df(rows), root))
            print(f"  round {round_no + 1} {name}: {rows / times[name][-1]:,.0f} rows/s", flush=True)
    return times


def summary(name: str, rows: int, seconds: list[float]) -> dict[str, Any]:
    median = statistics.median(seconds)
    return {"source": name, "rows": rows, "runs": len(seconds), "median_s": round(median, 3),
            "best_s": round(min(seconds), 3), "slowest_s": round(max(seconds), 3),
            "median_rows_per_s": round(rows / median), "min_rows_per_s": round(rows / max(seconds)),
            "max_rows_per_s": round(rows / min(seconds)), "rounds_s": [round(t, 3) for t in seconds]}


def ratio_by_round(mine: list[float], theirs: list[float]) -> dict[str, Any]:
    """Rows/s of ``mine`` over ``theirs``, round by round (their seconds over mine): the median and the range."""
    per_round = [t / m for m, t in zip(mine, theirs, strict=True)]
    return {"median": round(statistics.median(per_round), 3), "min": round(min(per_round), 3),
            "max": round(max(per_round), 3), "rounds": [round(r, 3) for r in per_round]}


def outside_spark(broker: BrokerProcess, topic: str, rows: int, rounds: int) -> dict[str, Any]:
    """The source's own share, without Spark: this process reads every partition of ``topic`` as an executor does
    (``read_partition``: the pulls, the pull-ahead thread, the Arrow batches), ``rounds`` times. Microseconds a row
    of this process's CPU and of the broker's, and of the pulls alone (``pull_raw``, nothing decoded): medians."""
    from bench.server import process_cpu_s
    from broker.client import PullConsumer
    from connector.options import parse_options
    from connector.partition_reader import SluicePartition, read_partition

    assert broker.proc is not None
    options = parse_options({"endpoints": broker.endpoint, "topic": topic}, streaming=True)
    per_queue = rows // QUEUES
    with PullConsumer(broker.endpoint, "bench-outside-spark") as consumer:

        def read_all() -> None:
            for q in range(QUEUES):
                for _batch in read_partition(options, SluicePartition(topic, q, 0, per_queue)):
                    pass

        def pull_all() -> None:
            for q in range(QUEUES):
                offset = 0
                while offset < per_queue:
                    offset = consumer.pull_raw(topic, q, offset, max_msgs=min(4096, per_queue - offset)
                                               ).next_begin_offset

        found: dict[str, Any] = {}
        for name, fn in (("read_partition", read_all), ("pull_raw only", pull_all)):
            fn()  # warm: channels, first answers
            mine, theirs = [], []
            for _ in range(rounds):
                cpu, broker_cpu = time.process_time(), process_cpu_s(broker.proc.pid)
                fn()
                mine.append((time.process_time() - cpu) / rows * 1e6)
                theirs.append((process_cpu_s(broker.proc.pid) - broker_cpu) / rows * 1e6)
            found[name] = {"reader_cpu_us_per_row": round(statistics.median(mine), 3),
                           "broker_cpu_us_per_row": round(statistics.median(theirs), 3)}
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.spark_source", description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=MIN_ROUNDS, help=f"rounds over the sources (at least {MIN_ROUNDS})")
    args = ap.parse_args(argv)
    rows = args.messages // QUEUES * QUEUES
    runs = max(MIN_ROUNDS, args.runs)
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

            times = measure({"sluice": sluice, "python-memory": memory, "jvm-rate": rate}, rows, warm, runs, root)
            spark.stop()
            outside = outside_spark(broker, "bench_src", rows, runs)
        finally:
            broker.stop()

    results = [summary(name, rows, seconds) for name, seconds in times.items()]
    ratio = ratio_by_round(times["sluice"], times["python-memory"])
    print(f"\n{'source':<15}{'rows':>11}{'rows/s, median of ' + str(runs) + ' rounds [slowest, fastest]':>52}")
    for r in results:
        spread = f"{r['median_rows_per_s']:,} [{r['min_rows_per_s']:,}, {r['max_rows_per_s']:,}]"
        print(f"{r['source']:<15}{r['rows']:>11,}{spread:>52}")
    print(f"\nsluice / python-memory, round by round: median {ratio['median']:.2f} "
          f"[{ratio['min']:.2f}, {ratio['max']:.2f}] (target >= {TARGET_RATIO})")
    print("\nthe source outside Spark, CPU a row (median of the rounds):")
    for name, cpu in outside.items():
        print(f"  {name:<16} reader {cpu['reader_cpu_us_per_row']:.2f} us, "
              f"broker {cpu['broker_cpu_us_per_row']:.2f} us")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "spark_source", "date": run_date(), "machine_cores": os.cpu_count(), "body_bytes": BODY_BYTES,
        "queues": QUEUES,
        "spark_master": "local[2]", "trigger": "availableNow", "sink": "noop", "results": results,
        "sluice_over_python_memory": ratio, "outside_spark": outside,
        "targets": {"ratio_to_python_memory": TARGET_RATIO},
        "load_average_1m": round(os.getloadavg()[0], 2),
    }, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
