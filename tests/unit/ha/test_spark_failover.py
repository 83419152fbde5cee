"""The Spark connector through a failover of a replicated broker group: a 3-replica group in controller mode (real
etcd, name server and broker processes), a real local SparkSession, and the master SIGKILLed while a streaming
query runs.

* Source: a topic -> parquet query goes on through the kill without stopping (planning and pulls that meet the dead
  master ask the name server again and retry for about 9 s, connector/broker_link.py) and reads on from the new
  master; the output holds every input id exactly once.
* Sink: topic A -> topic B through the exactly-once sink, the master killed while batches are written. The query
  goes on without a restart: the writable-queue lookup waits for the new master, a send refused or not connected
  is made again, and a send without an answer makes the task send its rows again under a new attempt, which is
  the only one the batch's commit keeps (connector/sink_writer.py, connector/failover.py). B holds every row of
  A exactly once.

Each test prints its figures: rows in and out, duplicates, missing, failovers, query restarts.
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from broker.client import Admin, Message, Producer, PullConsumer
from broker.client.namesrv_client import NameServerClient, route_or_none
from broker.client.route import MASTER_ID, MessageQueue
from broker.ha.local_group import ReplicaGroup
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

# Short leases keep each failover a few seconds (as test_failover_faults.py); two of three replicas must hold a write.
SETTINGS = {"ha_lease_ttl_s": 2, "min_insync_replicas": 2, "ha_max_lag_ms": 3000, "ha_ack_timeout_ms": 3000}
BROKER = "broker-a"
QUEUES = 4
SEND_CHUNK = 2000  # messages per SendBatch while filling a topic
MAX_RESTARTS = 3  # query restarts from the checkpoint a test allows after a failover
LONG_FAILOVERS = int(os.environ.get("SLUICE_LONG_FAILOVERS", "0"))  # the sink test's kills, when more than one
# Each kill of the long sink run restarts the old master and waits for three in-sync replicas (about 15-30 s here):
# more than this would not fit the module's 600 s timeout, and `make test-failover` asks for 50.
MAX_SINK_KILLS = 5


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the Python workers import ``connector``
    from streaming_jobs.common import spark_session

    conf = {"spark.default.parallelism": "2", "spark.sql.streaming.pollingDelay": "50ms"}
    session = spark_session("sluice-ha-spark-tests", shuffle_partitions=2, driver_memory="1g", conf=conf)
    yield session
    session.stop()


@pytest.fixture
def group(tmp_path: Path) -> Iterator[ReplicaGroup]:
    with ReplicaGroup(tmp_path / "group", 3, settings=SETTINGS) as g:
        yield g


@dataclass
class Run:
    """What one test saw, printed as a table at its end."""

    name: str
    rows_in: int = 0
    rows_out: int = 0
    duplicates: int = 0
    missing: int = 0
    failovers: int = 0
    restarts: int = 0
    rows_before_kill: int = 0
    failover_s: float = 0.0
    errors: list[str] = field(default_factory=list)

    def table(self) -> str:
        cells = {"run": self.name, "rows in": self.rows_in, "rows out": self.rows_out,
                 "duplicates": self.duplicates, "missing": self.missing, "failovers": self.failovers,
                 "query restarts": self.restarts, "committed at kill": self.rows_before_kill,
                 "new master after s": f"{self.failover_s:.1f}"}
        widths = [max(len(k), len(str(v))) for k, v in cells.items()]
        head = "  ".join(k.ljust(w) for k, w in zip(cells, widths, strict=True))
        row = "  ".join(str(v).ljust(w) for v, w in zip(cells.values(), widths, strict=True))
        return f"{head}\n{'  '.join('-' * w for w in widths)}\n{row}"

    def count(self, expected: set[str], got: Counter[str]) -> None:
        self.rows_out = sum(got.values())
        self.duplicates = sum(c - 1 for c in got.values() if c > 1)
        self.missing = len(expected - set(got))


# ---------------------------------------------------------------------------------------------------- the group
def routed_master(g: ReplicaGroup, topic: str) -> str | None:
    """The address the name server gives as the group's master in ``topic``'s route."""
    client = NameServerClient([g.namesrv])
    try:
        route = route_or_none(client, topic)
    finally:
        client.close()
    if route is None:
        return None
    return next((b.broker_addrs.get(MASTER_ID) for b in route.broker_datas if b.broker_name == BROKER), None)


def prepare(g: ReplicaGroup, topics: list[str]) -> int:
    """Create ``topics`` on the master; return it once every replica is in sync and the name server routes them."""
    master = g.wait_master()
    with Admin(g.endpoint(master)) as admin:
        for topic in topics:
            admin.create_topic(topic, QUEUES, if_not_exists=True)
    wait_until(lambda: (s := g.state()) is not None and len(s.in_sync) == 3, "all three replicas in sync", timeout_s=60)
    for topic in topics:
        wait_until(lambda topic=topic: routed_master(g, topic) == g.endpoint(master),
                   f"the route of {topic}", timeout_s=30)
    return master


def fail_over(g: ReplicaGroup, run: Run, topic: str) -> int:
    """SIGKILL the master; return the new one once the name server routes ``topic`` to it."""
    old = g.wait_master()
    g.kill(old)
    killed = time.monotonic()
    new = g.wait_master(other_than=old, timeout_s=60)
    wait_until(lambda: routed_master(g, topic) == g.endpoint(new),
               "the name server to route to the new master", timeout_s=60)
    run.failover_s = time.monotonic() - killed
    run.failovers += 1
    return new


def produce_ids(namesrv: str, topic: str, first: int, end: int) -> None:
    """Messages ``id-<i>`` for i in [first, end), spread over the topic's queues; every send acknowledged."""
    with Producer(namesrv=namesrv) as producer:
        for k, lo in enumerate(range(first, end, SEND_CHUNK)):
            msgs = [Message(topic, f"id-{i:07d}".encode()) for i in range(lo, min(end, lo + SEND_CHUNK))]
            results = producer.send_batch(msgs, queue=MessageQueue(topic, BROKER, k % QUEUES))
            assert len(results) == len(msgs)


def ids(first: int, end: int) -> set[str]:
    return {f"id-{i:07d}" for i in range(first, end)}


def topic_ids(namesrv: str, topic: str) -> Counter[str]:
    """Every message body of ``topic`` (as the id it carries) and how often it is stored."""
    got: Counter[str] = Counter()
    with PullConsumer(namesrv=namesrv, group="ha-spark-reader") as consumer:
        for mq, (lo, hi) in consumer.queue_ranges(topic).items():
            at = lo
            while at < hi:
                res = consumer.pull(mq, at, max_msgs=2000)
                got.update(m.body.decode().removesuffix("|copied") for m in res.messages)
                at = res.next_begin_offset
    return got


# ---------------------------------------------------------------------------------------------------- queries
def committed_rows(checkpoint: Path, topic: str) -> int:
    """Source messages of the batches the checkpoint's commit log records (queues start at offset 0)."""
    commits = [int(p.name) for p in (checkpoint / "commits").glob("*") if p.name.isdigit()]
    if not commits:
        return 0
    lines = (checkpoint / "offsets" / str(max(commits))).read_text().splitlines()
    return sum(json.loads(lines[2]).get(topic, {}).values())  # "v1", batch metadata, then one line per source


def reason(error: str) -> str:
    """The line of a query's error that names the exception (a Python worker's traceback ends with it)."""
    named = [ln.strip() for ln in error.splitlines() if re.match(r"\s*[\w.]+(Error|Exception): ", ln)]
    return (named[-1] if named else error.splitlines()[0])[:300]


class Query:
    """A streaming query kept running: one that stops with an error is started again from its checkpoint, as a
    user would (at most MAX_RESTARTS times), and counted."""

    def __init__(self, start: Any, run: Run) -> None:
        self.start, self.run = start, run
        self.query = start()

    def alive(self) -> bool:
        if not self.query.isActive:
            error = self.query.exception()
            assert error is not None, "the query stopped without an error"
            self.run.errors.append(reason(str(error)))
            self.run.restarts += 1
            assert self.run.restarts <= MAX_RESTARTS, f"the query failed {self.run.restarts} times: {self.run.errors}"
            self.query = self.start()
        return True

    def until(self, checkpoint: Path, topic: str, rows: int, timeout_s: float = 240) -> None:
        """Until the checkpoint has committed ``rows`` source messages."""
        wait_until(lambda: self.alive() and committed_rows(checkpoint, topic) >= rows,
                   f"the query to commit {rows} rows", timeout_s=timeout_s)

    def stop(self) -> None:
        self.query.stop()


# ---------------------------------------------------------------------------------------------------- tests
def test_source_reads_on_from_the_new_master(spark: Any, group: ReplicaGroup, tmp_path: Path) -> None:
    """20,000 messages, then the master killed after the query's first batch, then 10,000 more written to the new
    master: the parquet output holds the 30,000 ids once each."""
    topic, before, total = "ha_source", 20_000, 30_000
    run = Run("source: topic -> parquet", rows_in=total)
    prepare(group, [topic])
    produce_ids(group.namesrv, topic, 0, before)
    checkpoint, output = tmp_path / "chk", tmp_path / "out"

    def start() -> Any:
        return (
            spark.readStream.format("sluice").option("namesrv", group.namesrv).option("topic", topic)
            .option("consumerGroup", "g-ha-source").option("startingOffsets", "earliest")
            .option("maxMessagesPerTrigger", "2500").load()
            .select("queue_id", "queue_offset", "body").writeStream.format("parquet")
            .option("path", str(output)).option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="200 milliseconds").start()
        )

    query = Query(start, run)
    try:
        query.until(checkpoint, topic, 1, 180)
        run.rows_before_kill = committed_rows(checkpoint, topic)
        assert run.rows_before_kill < before, "the query read everything before the kill"
        fail_over(group, run, topic)
        produce_ids(group.namesrv, topic, before, total)
        query.until(checkpoint, topic, total)
    finally:
        query.stop()

    rows = spark.read.parquet(str(output)).select("queue_id", "queue_offset", "body").collect()
    got = Counter(bytes(r.body).decode() for r in rows)
    run.count(ids(0, total), got)
    print("\n" + run.table() + "".join(f"\n  query stopped: {e}" for e in run.errors))
    positions = Counter((r.queue_id, r.queue_offset) for r in rows)
    assert len(positions) == len(rows), "one (queue, offset) read twice"
    assert run.duplicates == 0 and run.missing == 0
    assert set(got) == ids(0, total) and run.rows_out == total
    assert run.failovers == 1 and run.restarts == 0, f"the query stopped at the failover: {run.errors}"


def test_exactly_once_sink_rides_out_a_master_kill(spark: Any, group: ReplicaGroup, tmp_path: Path) -> None:
    """Topic A -> topic B through the exactly-once sink, 2,000 rows a trigger, the master SIGKILLed while batches
    are being written (``SLUICE_LONG_FAILOVERS=N``: N kills, at most MAX_SINK_KILLS, the killed replica restarted
    after each): the query never stops, and B holds each of A's ids once."""
    kills = min(max(1, LONG_FAILOVERS), MAX_SINK_KILLS)
    source, target, n = "ha_sink_a", "ha_sink_b", 20_000 * kills
    run = Run("sink: topic A -> topic B", rows_in=n)
    prepare(group, [source, target])
    produce_ids(group.namesrv, source, 0, n)
    checkpoint = tmp_path / "chk"
    rng = random.Random(int(os.environ.get("SLUICE_CRASH_SEED", time.time())))
    from pyspark.sql import functions as F

    def start() -> Any:
        df = (
            spark.readStream.format("sluice").option("namesrv", group.namesrv).option("topic", source)
            .option("consumerGroup", "g-ha-sink").option("startingOffsets", "earliest")
            .option("maxMessagesPerTrigger", "2000").load()
        )
        out = df.select(F.concat(F.col("body").cast("string"), F.lit("|copied")).alias("body"))
        return (
            out.writeStream.format("sluice").option("namesrv", group.namesrv).option("topic", target)
            .option("deliveryGuarantee", "exactly-once").option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="200 milliseconds").start()
        )

    query = Query(start, run)
    try:
        for kill in range(kills):
            query.until(checkpoint, source, committed_rows(checkpoint, source) + 1, 180)
            if kill == 0:
                run.rows_before_kill = committed_rows(checkpoint, source)
            assert committed_rows(checkpoint, source) < n, "the query wrote everything before the kill"
            time.sleep(rng.uniform(0.0, 0.4))
            # inside a micro-batch (its reads, its tasks' sends or its commit), not between two
            wait_until(lambda: bool(query.query.status["isTriggerActive"]), "a micro-batch to run", timeout_s=30)
            old = group.wait_master()
            fail_over(group, run, target)
            if kill < kills - 1:  # two of three replicas hold a write: the next kill needs all three back
                group.restart(old)
                wait_until(
                    lambda: (st := group.state()) is not None and len(st.in_sync) == 3, "3 in sync", timeout_s=120
                )
        query.until(checkpoint, source, n)
    finally:
        query.stop()

    got = topic_ids(group.namesrv, target)
    run.count(ids(0, n), got)
    print("\n" + run.table() + "".join(f"\n  query stopped: {e}" for e in run.errors))
    assert run.duplicates == 0 and run.missing == 0
    assert set(got) == ids(0, n) and run.rows_out == n
    assert run.failovers == kills and run.restarts == 0, f"the query stopped at a failover: {run.errors}"
