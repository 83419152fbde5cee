"""The sluice sink with a real SparkSession and a real broker: what goes in comes out, bad rows fail cleanly."""

from __future__ import annotations

import time
from typing import Any

import pytest
from connector_helpers import new_topic, read_queues

from broker.client.results import ReceivedMessage

pytestmark = [pytest.mark.spark]


def read_all(
    endpoint: str, topic: str, expect: int | None = None, timeout_s: float = 10.0
) -> dict[int, list[ReceivedMessage]]:
    """Every message of every queue, in queue order. With ``expect``, waits (up to ``timeout_s``) until that many
    are visible: a committed transaction's messages reach the consume queues a moment after the commit returns."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = read_queues(endpoint, topic)
        if expect is None or sum(map(len, got.values())) >= expect or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def flat(by_queue: dict[int, list[ReceivedMessage]]) -> list[ReceivedMessage]:
    return [m for q in sorted(by_queue) for m in by_queue[q]]


def write(df: Any, endpoint: str, **options: str) -> None:
    writer = df.write.format("sluice").option("endpoints", endpoint)
    for k, v in options.items():
        writer = writer.option(k, v)
    writer.mode("append").save()


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_rows_in_equal_messages_out(spark: Any, broker: str, guarantee: str) -> None:
    topic = new_topic(broker, queues=4, prefix="sink")
    rows = [
        (f"body-{i}", f"tag{i % 3}", [f"k{i}", f"x{i % 7}"], {"n": str(i), "even": str(i % 2 == 0)})
        for i in range(2000)
    ]
    df = spark.createDataFrame(rows, "body string, tags string, keys array<string>, properties map<string,string>")
    write(df.repartition(3), broker, topic=topic, deliveryGuarantee=guarantee, batchMessages="300")
    got = flat(read_all(broker, topic, expect=len(rows)))
    assert len(got) == len(rows)
    by_body = {m.body.decode(): m for m in got}
    for body, tags, keys, props in rows:
        m = by_body[body]
        assert m.tags == tags
        assert m.keys == keys
        assert m.properties["n"] == props["n"] and m.properties["even"] == props["even"]


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_kilobyte_rows_with_default_batching(spark: Any, broker: str, guarantee: str) -> None:
    """6 MB of 1 KiB rows in one task, default batchMessages/batchBytes: every SendBatch fits the broker's 4 MiB
    batch limit (a chunk must not end just past batchBytes: at-least-once sends are not split)."""
    topic = new_topic(broker, queues=2, prefix="kib")
    df = spark.range(0, 6000, 1, 1).selectExpr("concat(lpad(cast(id as string), 8, '0'), repeat('k', 1016)) as body")
    write(df, broker, topic=topic, deliveryGuarantee=guarantee)
    got = flat(read_all(broker, topic, expect=6000))
    assert sorted(m.body[:8] for m in got) == [b"%08d" % i for i in range(6000)]
    assert {len(m.body) for m in got} == {1024}


def test_binary_bodies_per_row_topic_and_sharding_order(spark: Any, broker: str) -> None:
    a, b = new_topic(broker, queues=4, prefix="sinka"), new_topic(broker, queues=2, prefix="sinkb")
    rows = [(bytes([i % 256, 0, 255]) + str(i).encode(), a if i % 2 else b, f"user{i % 5}", i) for i in range(1000)]
    df = spark.createDataFrame(rows, "body binary, topic string, sharding_key string, seq int").coalesce(1)
    write(df.drop("seq"), broker)
    n_a = sum(1 for r in rows if r[1] == a)
    got_a, got_b = read_all(broker, a, expect=n_a), read_all(broker, b, expect=len(rows) - n_a)
    assert sorted(m.body for m in flat(got_a)) == sorted(r[0] for r in rows if r[1] == a)
    assert sorted(m.body for m in flat(got_b)) == sorted(r[0] for r in rows if r[1] == b)
    # Same sharding key -> one queue, in the order the rows were written.
    seq = {r[0]: (r[2], r[3]) for r in rows}
    for by_queue in (got_a, got_b):
        seen_keys: dict[str, int] = {}
        for qid, msgs in by_queue.items():
            last: dict[str, int] = {}
            for m in msgs:
                key, n = seq[m.body]
                assert seen_keys.setdefault(f"{key}", qid) == qid, f"key {key} spread over queues"
                assert n > last.get(key, -1), f"key {key} out of order in queue {qid}"
                last[key] = n


def test_explicit_queue_id(spark: Any, broker: str) -> None:
    topic = new_topic(broker, queues=4, prefix="sinkq")
    df = spark.createDataFrame([(f"m{i}", i % 4) for i in range(100)], "body string, queue_id int")
    write(df, broker, topic=topic)
    for qid, msgs in read_all(broker, topic, expect=100).items():
        assert sorted(m.body.decode() for m in msgs) == sorted(f"m{i}" for i in range(100) if i % 4 == qid)


@pytest.mark.parametrize(
    ("rows", "ddl", "options", "expected"),
    [
        ([("ok",), (None,)], "body string", {}, "body is null"),
        ([("ok", 1)], "body string, colour int", {}, "unknown column"),
        ([("x" * 70_000,)], "body string", {"maxMessageSize": "65536"}, "over maxMessageSize"),
        ([("ok",)], "payload string", {}, "needs a 'body' column"),
    ],
)
def test_bad_rows_fail_and_nothing_is_visible(
    spark: Any, broker: str, rows: list[tuple[Any, ...]], ddl: str, options: dict[str, str], expected: str
) -> None:
    topic = new_topic(broker, queues=2, prefix="sinkbad")
    df = spark.createDataFrame([("fine",)] * 50, "body string") if "body" in ddl else None
    bad = spark.createDataFrame(rows, ddl)
    full = bad if df is None or "colour" in ddl or "body" not in ddl else df.unionByName(bad).coalesce(1)
    with pytest.raises(Exception, match=expected):
        write(full, broker, topic=topic, **options)
    assert flat(read_all(broker, topic)) == []


def test_extra_columns_ignored_when_asked(spark: Any, broker: str) -> None:
    topic = new_topic(broker, queues=2, prefix="sinkextra")
    df = spark.createDataFrame([("a", 1), ("b", 2)], "body string, colour int")
    write(df, broker, topic=topic, ignoreExtraColumns="true")
    assert sorted(m.body for m in flat(read_all(broker, topic, expect=2))) == [b"a", b"b"]


def test_bad_option_names_itself(spark: Any, broker: str) -> None:
    df = spark.createDataFrame([("a",)], "body string")
    with pytest.raises(Exception, match="deliveryGuarantee"):
        write(df, broker, topic="t", deliveryGuarantee="twice")
    with pytest.raises(Exception, match="unknown sink option"):
        write(df, broker, topic="t", batchSizeTypo="3")
    with pytest.raises(Exception, match="no topic to write to: set the 'topic' option or give the DataFrame a"):
        write(df, broker)  # neither a topic option nor a topic column: refused before any task runs
