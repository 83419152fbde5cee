"""readStream.format("sluice") over a cluster (option namesrv): real name server and broker processes, a real
local SparkSession. Partitions are (topic, broker, queue); brokers that join are read from offset 0, a broker that
leaves stops the query naming it, or with failOnDataLoss=false waits for it without losing its place."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from connector_helpers import cluster_body, cluster_fill, cluster_topic
from pyspark.errors import StreamingQueryException

from broker.client import PullConsumer
from broker.client.route import MessageQueue
from broker.namesrv.local_cluster import LocalCluster
from tests.support.cluster import make_cluster
from tests.support.waiting import wait_until

pytestmark = pytest.mark.spark

TOPIC = "orders"
QUEUES = 3
OUT_SCHEMA = "broker string, queue_id int, queue_offset long, body binary"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with make_cluster(tmp_path / "cluster", brokers=2) as c:
        yield c


def queues(broker: str) -> list[MessageQueue]:
    return [MessageQueue(TOPIC, broker, q) for q in range(QUEUES)]


def start_query(spark: Any, namesrv: str, checkpoint: Path, output: Path, **options: str) -> Any:
    reader = (
        spark.readStream.format("sluice").option("namesrv", namesrv).option("topic", TOPIC)
        .option("consumerGroup", "g-cluster").option("startingOffsets", "earliest")
    )
    for k, v in options.items():
        reader = reader.option(k, v)
    return (
        reader.load().select("broker", "queue_id", "queue_offset", "body").writeStream.format("parquet")
        .option("path", str(output)).option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds").start()
    )


def rows_by_queue(spark: Any, output: Path) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
    out: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    for r in spark.read.schema(OUT_SCHEMA).parquet(str(output)).collect():
        out.setdefault((r.broker, r.queue_id), []).append((r.queue_offset, bytes(r.body)))
    return {k: sorted(v) for k, v in out.items()}


def count(spark: Any, output: Path) -> int:
    """Rows of the batches the query committed (the parquet sink's log lists their files)."""
    return int(spark.read.schema(OUT_SCHEMA).parquet(str(output)).count()) if output.exists() else 0


def expected(broker: str, lo: int, hi: int) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
    return {(broker, q): [(i, cluster_body(MessageQueue(TOPIC, broker, q), i)) for i in range(lo, hi)]
            for q in range(QUEUES)}


def test_brokers_joining_and_leaving_a_running_query(spark: Any, cluster: LocalCluster, tmp_path: Path) -> None:
    cluster_topic(cluster, TOPIC, QUEUES)
    for b in ("broker-a", "broker-b"):
        cluster_fill(cluster.namesrv, TOPIC, 40, queues(b))
    checkpoint, output = tmp_path / "chk", tmp_path / "out"
    q = start_query(spark, cluster.namesrv, checkpoint, output)
    try:
        wait_until(lambda: count(spark, output) >= 240, "the two brokers' 240 messages", timeout_s=180, interval_s=0.2)
        # A broker joins the cluster while the query runs; the topic gets queues there: new partitions from 0.
        cluster.add_broker("broker-c")
        cluster_topic(cluster, TOPIC, QUEUES, ["broker-c"])
        cluster_fill(cluster.namesrv, TOPIC, 25, queues("broker-c"))
        wait_until(lambda: count(spark, output) >= 315, "broker-c's 75 messages", timeout_s=180, interval_s=0.2)
        progress = json.loads(q.lastProgress["sources"][0]["endOffset"])[TOPIC]
        assert progress["broker-c:0"] == 25 and progress["broker-a:2"] == 40
        # A broker leaves (a clean stop unregisters it at once): the query stops, naming it.
        assert cluster.stop("broker-b") == 0
        cluster_fill(cluster.namesrv, TOPIC, 5, queues("broker-a"), first=40)
        with pytest.raises(StreamingQueryException, match="broker 'broker-b' left the cluster"):
            q.awaitTermination(120)
    finally:
        q.stop()
    got = rows_by_queue(spark, output)
    for (broker, qid), rows in expected("broker-b", 0, 40).items():
        assert got[(broker, qid)] == rows
    for (broker, qid), rows in expected("broker-c", 0, 25).items():
        assert got[(broker, qid)] == rows

    # failOnDataLoss=false: the query goes on with the other brokers; broker-b's queues keep their offsets.
    q = start_query(spark, cluster.namesrv, checkpoint, output, failOnDataLoss="false")
    try:
        cluster_fill(cluster.namesrv, TOPIC, 5, queues("broker-c"), first=25)
        wait_until(lambda: count(spark, output) >= 315 + 15 + 15,
                   "broker-a and broker-c's new rows", timeout_s=180, interval_s=0.2)
        cluster.restart("broker-b")  # back on its store: read on from where the query was, nothing twice
        cluster_fill(cluster.namesrv, TOPIC, 10, queues("broker-b"), first=40)
        wait_until(lambda: count(spark, output) >= 345 + 30,
                   "broker-b's rows after its return", timeout_s=180, interval_s=0.2)
    finally:
        q.stop()
    got = rows_by_queue(spark, output)
    assert got == {**expected("broker-a", 0, 45), **expected("broker-b", 0, 50), **expected("broker-c", 0, 30)}
    with PullConsumer(namesrv=cluster.namesrv, group="g-cluster") as consumer:  # each broker keeps its queues'
        committed = consumer.committed_by_queue(TOPIC)
    assert {mq.broker_name for mq in committed} == {"broker-a", "broker-b", "broker-c"}
    assert all(off > 0 for off in committed.values())
