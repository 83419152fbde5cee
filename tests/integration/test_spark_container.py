"""Spark ``readStream`` / ``writeStream`` of the sluice connector against the containerised broker.

Messages produced from the host are read back by availableNow streaming queries (into the memory sink and into
Parquet, several micro-batches) and compared field by field; a Sluice -> transform -> Sluice query writes exactly
once into another topic of the container, read back with the host's pull consumer. One SparkSession for the module.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobs_helpers import create_topics, flat, produce, read_topic

from broker.client import Message
from broker.testing import SluiceContainer
from streaming_jobs.common import spark_session

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(300)]

QUEUES = 4
N = 2000


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    # Spark's Python workers must be this interpreter: set before the session (and its workers) start.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = spark_session("sluice-integration", shuffle_partitions=2, driver_memory="1g",
                            conf={"spark.default.parallelism": "2"})
    yield session
    session.stop()


def sample(topic: str, n: int) -> list[Message]:
    """Text and binary bodies, tags, keys and properties: everything a row carries."""
    msgs = []
    for i in range(n):
        body = f"msg-{i:06d}".encode() if i % 2 else bytes([i % 256, 0, 255]) + f"bin-{i:06d}".encode()
        msgs.append(Message(topic, body, tags=f"t{i % 3}", keys=(f"k{i}", f"u{i % 7}"), properties={"n": str(i)}))
    return msgs


def stream_reader(spark: Any, endpoint: str, topic: str, **options: str) -> Any:
    reader = (
        spark.readStream.format("sluice")
        .option("endpoints", endpoint)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
    )
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def run_available_now(writer: Any) -> Any:
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination(timeout=180)
    assert not query.isActive, "the availableNow query did not finish within 180 s"
    assert query.exception() is None, query.exception()
    return query


def test_read_stream_from_container_into_memory_and_parquet(
    spark: Any, broker: SluiceContainer, tmp_path: Path
) -> None:
    endpoint = broker.get_endpoint()
    create_topics(endpoint, QUEUES, "spark_in")
    sent = sample("spark_in", N)
    produce(endpoint, sent, QUEUES)
    stored = {(m.queue_id, m.queue_offset): m for m in flat(read_topic(endpoint, "spark_in"))}
    assert len(stored) == N

    # Memory sink, one micro-batch: every column compared with what the host reads from the broker.
    df = stream_reader(spark, endpoint, "spark_in", includeProperties="true")
    run_available_now(
        df.writeStream.format("memory").queryName("it_read").option("checkpointLocation", str(tmp_path / "c1"))
    )
    rows = spark.sql("select * from it_read").collect()
    assert len(rows) == N
    got = {(r.queue_id, r.queue_offset): r for r in rows}
    assert got.keys() == stored.keys(), "rows are not one per stored message"
    for key, m in stored.items():
        r = got[key]
        assert r.topic == "spark_in" and bytes(r.body) == m.body and r.tags == m.tags and list(r.keys) == m.keys
        assert r.msg_id == m.msg_id and r.commitlog_offset == m.commitlog_offset
        assert r.properties["n"] == m.properties["n"]
        assert int(r.store_timestamp.timestamp() * 1000) == m.store_timestamp
    assert Counter(bytes(r.body) for r in rows) == Counter(m.body for m in sent)

    # Parquet file sink, several micro-batches (admission limit): the same content, nothing twice.
    t0 = time.monotonic()
    query = run_available_now(
        stream_reader(spark, endpoint, "spark_in", maxMessagesPerTrigger="800")
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "c2"))
    )
    print(f"parquet query: {time.monotonic() - t0:.1f} s")
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    for p in query.recentProgress:
        print(p["batchId"], p["numInputRows"], p["durationMs"])
    assert len(batches) >= N // 800, f"expected several micro-batches, got {len(batches)}"
    assert all(p["numInputRows"] <= 800 for p in batches)
    table = spark.read.parquet(str(tmp_path / "out")).select("queue_id", "queue_offset", "body", "tags").collect()
    assert sorted((r.queue_id, r.queue_offset, bytes(r.body), r.tags) for r in table) == sorted(
        (k[0], k[1], m.body, m.tags) for k, m in stored.items()
    )


def test_write_stream_through_the_exactly_once_sink_into_container_topic(
    spark: Any, broker: SluiceContainer, tmp_path: Path
) -> None:
    """Every row once, with tags, keys and properties, through the transactional (exactly-once) sink path. No
    failure is injected here: the crash cases are test_jobs_container.py's (driver kill, broker restart)."""
    from pyspark.sql import functions as F

    endpoint = broker.get_endpoint()
    create_topics(endpoint, QUEUES, "spark_src", "spark_dst")
    sent = sample("spark_src", N)
    produce(endpoint, sent, QUEUES)
    df = stream_reader(spark, endpoint, "spark_src", maxMessagesPerTrigger="1000", includeProperties="true")
    out = df.select(
        F.concat(F.lit(b"out:"), F.col("body")).alias("body"),
        "tags",
        "keys",
        "properties",
        F.col("queue_id").cast("string").alias("sharding_key"),
    )
    query = run_available_now(
        out.writeStream.format("sluice")
        .option("endpoints", endpoint)
        .option("topic", "spark_dst")
        .option("deliveryGuarantee", "exactly-once")
        .option("checkpointLocation", str(tmp_path / "chk"))
    )
    assert sum(p["numInputRows"] for p in query.recentProgress) == N

    src = flat(read_topic(endpoint, "spark_src"))
    dst = read_topic(endpoint, "spark_dst")
    got = flat(dst)
    assert Counter(m.body for m in got) == Counter(b"out:" + m.body for m in src), "not every row exactly once"
    by_body = {m.body: m for m in got}
    for m in src:
        w = by_body[b"out:" + m.body]
        assert w.tags == m.tags and w.keys == m.keys and w.properties["n"] == m.properties["n"]
    # sharding_key = source queue number: each source queue lands in one target queue, in source order.
    src_pos = {b"out:" + m.body: (m.queue_id, m.queue_offset) for m in src}
    for qid, msgs in dst.items():
        positions = [src_pos[m.body] for m in msgs]
        assert len({q for q, _ in positions}) <= 1, f"target queue {qid} mixes source queues"
        assert positions == sorted(positions), f"target queue {qid} is out of source order"
    # Nothing is left half-done on the broker: no open transactions of the query.
    from broker.client import Admin

    with Admin(endpoint) as admin:
        open_txns = [t.transaction_id for t in admin.list_transactions("spark:") if t.status == "OPEN"]
    assert not open_txns, open_txns
