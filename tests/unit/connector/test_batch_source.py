"""spark.read.format("sluice") (bounded reads) and failOnDataLoss after the broker expired files."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from connector_helpers import EXPIRING_STORE, body_of, fill, load_sluice, new_topic
from pyspark.errors import StreamingQueryException

from broker.client import Admin
from tests.support.brokers import start_broker
from tests.support.waiting import wait_until

pytestmark = pytest.mark.spark


def batch(spark: Any, endpoint: str, topic: str, **options: str) -> Any:
    return load_sluice(spark.read, endpoint, topic, **options)


def offsets_by_queue(df: Any) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for r in df.select("queue_id", "queue_offset").collect():
        out.setdefault(r.queue_id, []).append(r.queue_offset)
    return {q: sorted(v) for q, v in out.items()}


def test_batch_read_with_starting_and_ending_offsets(spark: Any, broker: str) -> None:
    topic = new_topic(broker, 3)
    fill(broker, topic, 20, range(3))
    assert offsets_by_queue(batch(spark, broker, topic)) == {q: list(range(20)) for q in range(3)}
    df = batch(
        spark, broker, topic,
        startingOffsets=json.dumps({topic: {"broker-a:0": 5}}),  # other queues: fallback, earliest for batch
        endingOffsets=json.dumps({topic: {"broker-a:0": 15, "broker-a:1": -1, "broker-a:2": 10}}),
    )
    assert offsets_by_queue(df) == {0: list(range(5, 15)), 1: list(range(20)), 2: list(range(10))}
    bodies = {bytes(r.body) for r in df.where("queue_id = 2").select("body").collect()}
    assert bodies == {body_of(topic, 2, i) for i in range(10)}
    with pytest.raises(Exception, match="endingOffsets"):
        batch(spark, broker, topic, startingOffsets=json.dumps({topic: {"broker-a:0": 10}}),
              endingOffsets=json.dumps({topic: {"broker-a:0": 5}})).collect()


def test_partitions_follow_max_messages_per_partition_and_min_partitions(spark: Any, broker: str) -> None:
    topic = new_topic(broker, 2)
    fill(broker, topic, 20, [0])
    fill(broker, topic, 6, [1])
    df = batch(spark, broker, topic, maxMessagesPerPartition="7")
    assert df.rdd.getNumPartitions() == 3 + 1
    assert offsets_by_queue(df) == {0: list(range(20)), 1: list(range(6))}
    df = batch(spark, broker, topic, minPartitions="8")
    assert df.rdd.getNumPartitions() >= 7
    assert df.count() == 26


@pytest.fixture(scope="module")
def expiring_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("expiring")
    proc = start_broker(root / "store", {"store": EXPIRING_STORE})
    yield proc.endpoint
    assert proc.stop() == 0
    shutil.rmtree(root)  # the preallocated store: tmp_path_retention_policy only removes function-scoped dirs


def test_fail_on_data_loss_both_ways_after_files_expire(spark: Any, expiring_broker: str, tmp_path: Path) -> None:
    endpoint = expiring_broker
    topic = new_topic(endpoint, 1)
    fill(endpoint, topic, 300, [0], chunk=100)
    checkpoint = tmp_path / "chk"

    def run(fail_on_data_loss: str) -> tuple[Any, list[int]]:
        seen: list[int] = []  # foreachBatch runs on this driver: collect what each batch delivered
        q = (
            spark.readStream.format("sluice").option("endpoints", endpoint).option("topic", topic)
            .option("startingOffsets", "earliest").option("failOnDataLoss", fail_on_data_loss).load()
            .writeStream.option("checkpointLocation", str(checkpoint))
            .foreachBatch(lambda df, _: seen.extend(r.queue_offset for r in df.select("queue_offset").collect()))
            .trigger(availableNow=True).start()
        )
        with contextlib.suppress(StreamingQueryException):  # q.exception() has it
            q.awaitTermination(120)
        return q, seen

    q, seen = run("true")
    assert q.exception() is None and sorted(seen) == list(range(300))

    # More messages roll the tiny commit-log files; the broker deletes the old ones (reserved time: 1 s).
    fill(endpoint, topic, 2000, [0], first=300, chunk=100)
    with Admin(endpoint) as admin:
        wait_until(lambda: admin.queue_offsets(topic)[0][0] > 300,
                   "expiry past offset 300", timeout_s=60, interval_s=0.2)
        lo, hi = admin.queue_offsets(topic)[0]

    failed, seen = run("true")
    text = str(failed.exception())
    assert "DataLossError" in text and topic in text and "requested offset 300" in text, text
    assert "broker-a:0" in text and "available from" in text and seen == []

    q, seen = run("false")  # same checkpoint: skips the lost range, reads the rest
    assert q.exception() is None
    assert min(seen) >= lo and sorted(seen) == list(range(min(seen), hi)), (lo, hi, min(seen))

    # A bounded read that starts before the expired range behaves the same way.
    start = json.dumps({topic: {"broker-a:0": 0}})
    with pytest.raises(Exception, match="requested offset 0"):
        batch(spark, endpoint, topic, startingOffsets=start).collect()
    with Admin(endpoint) as admin:  # expiry went on meanwhile (1 s reserved time); no writes since, so it is settled
        lo_now, hi_now = admin.queue_offsets(topic)[0]
    assert hi_now == hi and lo_now >= lo
    assert batch(spark, endpoint, topic, startingOffsets=start, failOnDataLoss="false").count() == hi - lo_now


def test_batch_read_of_a_topic_that_does_not_exist_fails_naming_it(spark: Any, broker: str) -> None:
    """It returned 0 rows: a typo in the topic name read as an empty topic."""
    with pytest.raises(Exception, match=r"topic 'no-such-topic' does not exist on the broker at .*sluice topic create"):
        batch(spark, broker, "no-such-topic").collect()
    with pytest.raises(Exception, match=r"topic 'no-such-topic' does not exist"):
        topics = f"{new_topic(broker, 1)},no-such-topic"
        spark.read.format("sluice").option("endpoints", broker).option("topics", topics).load().collect()
    nothing = spark.read.format("sluice").option("endpoints", broker).option("topicPattern", "no-such-.*").load()
    assert nothing.count() == 0  # a pattern that matches no topic is not an error
