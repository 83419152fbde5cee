"""readStream.format("sluice") against a real broker subprocess and a real local SparkSession."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from connector_helpers import body_of, fill, load_sluice, new_topic

from broker.client import Message, Producer, PullConsumer
from tests.support.waiting import wait_until

pytestmark = pytest.mark.spark


def reader(spark: Any, endpoint: str, topic: str, **options: str) -> Any:
    return load_sluice(spark.readStream, endpoint, topic, **options)


def run_available_now(spark: Any, df: Any, tmp_path: Path, name: str | None = None) -> tuple[str, Any]:
    """Run ``df`` with Trigger.AvailableNow into a memory table; returns (table name, finished query)."""
    table = name or f"m_{uuid.uuid4().hex[:8]}"
    q = (
        df.writeStream.format("memory").queryName(table)
        .option("checkpointLocation", str(tmp_path / f"chk_{table}"))
        .trigger(availableNow=True).start()
    )
    finished = q.awaitTermination(180)
    if not finished:
        q.stop()  # a half-filled table must not pass for the whole result
    assert finished, "the availableNow query did not finish within 180 s"
    assert q.exception() is None, q.exception()
    return table, q


def rows(spark: Any, table: str, cols: str = "queue_id, queue_offset, body") -> list[Any]:
    return spark.sql(f"SELECT {cols} FROM {table}").collect()


def per_queue(result: list[Any]) -> dict[int, list[tuple[int, bytes]]]:
    out: dict[int, list[tuple[int, bytes]]] = {}
    for r in result:
        out.setdefault(r.queue_id, []).append((r.queue_offset, bytes(r.body)))
    return {q: sorted(v) for q, v in out.items()}


def batch_sizes(query: Any) -> list[int]:
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]


def test_available_now_reads_100k_messages_in_8_queues_exactly(spark: Any, broker: str, tmp_path: Path) -> None:
    topic = new_topic(broker, 8)
    per = 12_500
    fill(broker, topic, per, range(8), tags=lambda i: "even" if i % 2 == 0 else "odd")
    df = reader(spark, broker, topic, consumerGroup=f"g_{topic}", startingOffsets="earliest",
                maxMessagesPerTrigger="40000")
    table, q = run_available_now(spark, df, tmp_path)
    got = per_queue(rows(spark, table))
    assert sorted(got) == list(range(8))
    for qid in range(8):
        assert got[qid] == [(i, body_of(topic, qid, i)) for i in range(per)], f"queue {qid} differs"
    assert batch_sizes(q) == [40_000, 40_000, 20_000]
    # The group's offsets reach the end, and only after the last batch was done (AvailableNow leaves none behind).
    assert PullConsumer(broker, f"g_{topic}").committed_offsets(topic) == dict.fromkeys(range(8), per)
    sample = spark.sql(f"SELECT * FROM {table} WHERE queue_id = 3 AND queue_offset = 7").collect()[0]
    assert sample.topic == topic and sample.broker == "broker-a" and sample.tags == "odd" and sample.keys == ["k7"]
    assert len(sample.msg_id) == 32 and sample.commitlog_offset >= 0 and sample.properties is None
    assert abs(sample.store_timestamp.timestamp() - time.time()) < 600 and sample.reconsume_times == 0


def test_continuous_query_picks_up_new_messages(spark: Any, broker: str, tmp_path: Path) -> None:
    topic = new_topic(broker, 4)
    fill(broker, topic, 10, range(4))  # before the start: skipped by startingOffsets=latest
    table = f"m_{uuid.uuid4().hex[:8]}"
    q = (
        reader(spark, broker, topic).writeStream.format("memory").queryName(table)
        .option("checkpointLocation", str(tmp_path / "chk")).trigger(processingTime="200 milliseconds").start()
    )
    try:
        wait_until(lambda: q.lastProgress is not None, "the first trigger", timeout_s=60, interval_s=0.2)
        fill(broker, topic, 25, range(4), first=10)
        wait_until(lambda: spark.sql(f"SELECT count(*) c FROM {table}").collect()[0].c >= 100,
                   "100 new rows", timeout_s=60, interval_s=0.2)
        fill(broker, topic, 5, [1], first=35)
        wait_until(lambda: spark.sql(f"SELECT count(*) c FROM {table}").collect()[0].c >= 105,
                   "5 more rows", timeout_s=60, interval_s=0.2)
        time.sleep(1)
    finally:
        q.stop()
    got = per_queue(rows(spark, table))
    for qid in range(4):
        last = 40 if qid == 1 else 35
        assert got[qid] == [(i, body_of(topic, qid, i)) for i in range(10, last)]
    progress = q.lastProgress["sources"][0]
    assert json.loads(progress["latestOffset"])[topic]["broker-a:1"] == 40  # reportLatestOffset


def test_each_starting_offsets_mode(spark: Any, broker: str, tmp_path: Path) -> None:
    topic = new_topic(broker, 2)
    fill(broker, topic, 10, range(2))
    group = f"g_{topic}"
    PullConsumer(broker, group).commit_offsets({(topic, 0): 7})

    def count_by_queue(**options: str) -> dict[int, int]:
        table, _ = run_available_now(spark, reader(spark, broker, topic, **options), tmp_path)
        out: dict[int, int] = {}
        for r in rows(spark, table, "queue_id, count(*) AS n FROM " + table + " GROUP BY queue_id --"):
            out[r.queue_id] = r.n
        return out

    assert count_by_queue(startingOffsets="earliest") == {0: 10, 1: 10}
    assert count_by_queue(startingOffsets="latest") == {}
    assert count_by_queue() == {}  # no group: latest
    assert count_by_queue(startingOffsets=json.dumps({topic: {"broker-a:0": 5, "broker-a:1": -2}})) == {0: 5, 1: 10}
    assert count_by_queue(startingOffsets=json.dumps({topic: {"broker-a:0": -1}})) == {}  # queue 1: fallback latest
    # committed: queue 0 from its committed 7; queue 1 has none and falls back (latest, then earliest)
    assert count_by_queue(consumerGroup=group) == {0: 3}
    assert PullConsumer(broker, group).committed_offsets(topic) == {0: 10, 1: 10}  # the query committed its end
    other = f"{group}_2"
    PullConsumer(broker, other).commit_offsets({(topic, 0): 7})
    assert count_by_queue(consumerGroup=other, startingOffsetsFallback="earliest") == {0: 3, 1: 10}


def test_starting_timestamp(spark: Any, broker: str, tmp_path: Path) -> None:
    topic = new_topic(broker, 2)
    fill(broker, topic, 6, range(2))
    time.sleep(0.05)
    ts = int(time.time() * 1000)
    time.sleep(0.05)
    fill(broker, topic, 4, range(2), first=6)
    table, _ = run_available_now(spark, reader(spark, broker, topic, startingTimestamp=str(ts)), tmp_path)
    got = per_queue(rows(spark, table))
    assert {q: [o for o, _ in v] for q, v in got.items()} == {0: [6, 7, 8, 9], 1: [6, 7, 8, 9]}
    future = str(int(time.time() * 1000) + 3_600_000)
    table, _ = run_available_now(
        spark, reader(spark, broker, topic, startingTimestamp=future, startingOffsetsByTimestampStrategy="latest"),
        tmp_path,
    )
    assert rows(spark, table) == []
    with pytest.raises(Exception, match="startingTimestamp"):
        run_available_now(spark, reader(spark, broker, topic, startingTimestamp=future), tmp_path)


def test_admission_limits_give_expected_batch_sizes(spark: Any, broker: str, tmp_path: Path) -> None:
    topic = new_topic(broker, 4)
    for qid, n in ((0, 40), (1, 40), (2, 20)):
        fill(broker, topic, n, [qid])
    df = reader(spark, broker, topic, startingOffsets="earliest", maxOffsetsPerTrigger="25")
    _, q = run_available_now(spark, df, tmp_path)
    assert batch_sizes(q) == [25, 25, 25, 25]
    first_end = json.loads(q.recentProgress[0]["sources"][0]["endOffset"])[topic]
    assert first_end == {"broker-a:0": 10, "broker-a:1": 10, "broker-a:2": 5, "broker-a:3": 0}  # by backlog

    # Bytes: every entry of this topic has the same size, so the byte budget is a message count.
    entry = 88 + len(body_of(topic, 0, 10)) + 1 + len(topic) + 2 + len(b"KEYS\x01k10\x02")
    df = reader(spark, broker, topic, startingOffsets=json.dumps({topic: {f"broker-a:{q}": 10 for q in range(3)}}),
                maxBytesPerTrigger=str(entry * 12))
    _, q = run_available_now(spark, df, tmp_path)
    sizes = batch_sizes(q)
    assert sum(sizes) == 30 + 30 + 10 and max(sizes) <= 12, sizes


def test_min_messages_per_trigger_waits_for_enough_or_the_delay(spark: Any, broker: str, tmp_path: Path) -> None:
    topic = new_topic(broker, 2)
    table = f"m_{uuid.uuid4().hex[:8]}"
    q = (
        reader(spark, broker, topic, minMessagesPerTrigger="50", maxTriggerDelay="6s")
        .writeStream.format("memory").queryName(table)
        .option("checkpointLocation", str(tmp_path / "chk")).trigger(processingTime="100 milliseconds").start()
    )

    def count() -> int:
        return int(spark.sql(f"SELECT count(*) c FROM {table}").collect()[0].c)

    try:
        wait_until(lambda: q.lastProgress is not None, "the first trigger", timeout_s=60, interval_s=0.2)
        started = time.monotonic()
        fill(broker, topic, 10, range(2))  # 20 < 50: held back until maxTriggerDelay passes
        time.sleep(2)
        assert count() == 0
        wait_until(lambda: count() == 20, "the delayed batch", timeout_s=60, interval_s=0.2)
        assert time.monotonic() - started >= 4
        fill(broker, topic, 30, range(2), first=10)  # 60 >= 50: at once
        wait_until(lambda: count() == 80, "the full batch", timeout_s=30, interval_s=0.2)
    finally:
        q.stop()


def test_tag_filter_on_broker_and_exact(spark: Any, broker: str, tmp_path: Path) -> None:
    topic = new_topic(broker, 2)
    tags = ["Aa", "BB", "C", None, "D"]  # "Aa" and "BB" share a Java hash code: only the exact check tells them apart
    with Producer(broker) as producer:
        for qid in range(2):
            producer.send_batch([Message(topic, b"%d" % i, tags=tags[i % 5]) for i in range(50)], queue_id=qid)
    df = reader(spark, broker, topic, startingOffsets="earliest", tags="Aa || C", includeProperties="true")
    table, _ = run_available_now(spark, df, tmp_path)
    got = rows(spark, table, "queue_id, queue_offset, tags, properties")
    assert len(got) == 2 * 20
    assert all(r.tags in ("Aa", "C") and r.tags == r.properties["TAGS"] for r in got)
    assert sorted(r.queue_offset for r in got if r.queue_id == 0) == [i for i in range(50) if i % 5 in (0, 2)]


def test_topic_pattern_reads_every_matching_topic(spark: Any, broker: str, tmp_path: Path) -> None:
    prefix = f"pat{uuid.uuid4().hex[:6]}"
    a, b = new_topic(broker, 2, prefix=prefix), new_topic(broker, 1, prefix=prefix)
    fill(broker, a, 3, range(2))
    fill(broker, b, 4, [0])
    df = (
        spark.readStream.format("sluice").option("endpoints", broker).option("topicPattern", f"{prefix}_.*")
        .option("startingOffsets", "earliest").load()
    )
    table, _ = run_available_now(spark, df, tmp_path)
    got = rows(spark, table, "topic, count(*) AS n FROM " + table + " GROUP BY topic --")
    assert {r.topic: r.n for r in got} == {a: 6, b: 4}


def test_bad_option_fails_the_query_at_start_naming_it(spark: Any, broker: str) -> None:
    with pytest.raises(Exception, match="maxMessagesPerTrigger"):
        reader(spark, broker, "x", maxMessagesPerTrigger="many")
    with pytest.raises(Exception, match="endingOffsets"):  # valid for batch reads only: fails when the query starts
        reader(spark, broker, "x", endingOffsets="latest").writeStream.format("noop").start().awaitTermination(60)


def test_topic_appearing_while_running_is_read_from_its_earliest_offset(
    spark: Any, broker: str, tmp_path: Path
) -> None:
    prefix = f"new{uuid.uuid4().hex[:6]}"
    first = new_topic(broker, 1, prefix=prefix)
    table = f"m_{uuid.uuid4().hex[:8]}"
    q = (
        spark.readStream.format("sluice").option("endpoints", broker).option("topicPattern", f"{prefix}_.*").load()
        .writeStream.format("memory").queryName(table).option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(processingTime="200 milliseconds").start()
    )
    try:
        wait_until(lambda: q.lastProgress is not None, "the first trigger", timeout_s=60, interval_s=0.2)
        fill(broker, first, 3, [0])
        later = new_topic(broker, 2, prefix=prefix)
        fill(broker, later, 4, range(2))  # sent before the query could see the topic: still read, from offset 0
        wait_until(lambda: spark.sql(f"SELECT count(*) c FROM {table}").collect()[0].c >= 11,
                   "11 rows", timeout_s=60, interval_s=0.2)
    finally:
        q.stop()
    got = rows(spark, table, "topic, queue_id, queue_offset")
    assert sorted((r.topic, r.queue_id, r.queue_offset) for r in got) == sorted(
        [(first, 0, i) for i in range(3)] + [(later, qid, i) for qid in range(2) for i in range(4)]
    )
