"""df.write.format("sluice") to a cluster (option namesrv), real processes and a real SparkSession: rows spread
over every broker's queues, rows of one sharding key in one queue, an exactly-once write committed on every broker
by one decision, and a queue_id column refused at start (it names a queue of one broker)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from connector_helpers import cluster_topic

from broker.client import Admin, PullConsumer
from broker.client.coordinator import CoordinatorClient
from broker.client.route import MessageQueue
from broker.client.router import Router
from broker.namesrv.local_cluster import LocalCluster
from connector.cluster_commit import coordinator_of
from tests.support.cluster import make_cluster

pytestmark = pytest.mark.spark


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with make_cluster(tmp_path / "cluster", brokers=3) as c:
        yield c


def read_topic(namesrv: str, topic: str) -> dict[MessageQueue, list[Any]]:
    out: dict[MessageQueue, list[Any]] = {}
    with PullConsumer(namesrv=namesrv, group="sink-reader") as consumer:
        for mq, (lo, hi) in sorted(consumer.queue_ranges(topic).items()):
            at, msgs = lo, []
            while at < hi:
                res = consumer.pull(mq, at, max_msgs=1000)
                msgs += res.messages
                at = res.next_begin_offset
            out[mq] = msgs
    return out


def test_rows_go_to_every_broker_and_commit_as_one(spark: Any, cluster: LocalCluster) -> None:
    n = 3000
    df = spark.range(0, n, 1, 3).selectExpr("concat('row-', id) AS body", "concat('k', id % 7) AS sharding_key")
    for guarantee, topic in (("exactly-once", "sink_eo"), ("at-least-once", "sink_alo")):
        cluster_topic(cluster, topic, 2)
        (df.write.format("sluice").option("namesrv", cluster.namesrv).option("topic", topic)
         .option("deliveryGuarantee", guarantee).option("batchMessages", "200").mode("append").save())
        by_queue = read_topic(cluster.namesrv, topic)
        bodies = Counter(m.body.decode() for msgs in by_queue.values() for m in msgs)
        assert bodies == Counter(f"row-{i}" for i in range(n)), guarantee
        assert {mq.broker_name for mq, msgs in by_queue.items() if msgs} == {"broker-a", "broker-b", "broker-c"}
        keys = {}  # every row of a sharding key in one queue
        for mq, msgs in by_queue.items():
            for m in msgs:
                k = f"k{int(m.body.decode().removeprefix('row-')) % 7}"
                assert keys.setdefault(k, mq) == mq, f"{k} in {keys[k]} and {mq}"
    # The exactly-once write: one decision on its coordinator naming each broker's part, nothing left open. Its
    # rows were written in place, so they name no transaction: the brokers' lists do.
    with Admin(namesrv=cluster.namesrv) as admin:
        txn_ids = {t.transaction_id for t in admin.list_transactions("spark-batch:") if t.status == "COMMITTED"}
    assert len(txn_ids) == 1
    txn_id = txn_ids.pop()
    router = Router(namesrv=cluster.namesrv)
    try:
        client = CoordinatorClient(router)
        [decision] = client.query(coordinator_of(txn_id), [txn_id])
        assert decision.commit and sum(s.expected_messages for s in decision.participants) == n
        for broker in client.masters():
            assert client.transactions(broker, txn_id, "OPEN") == {}
    finally:
        router.close()


def test_a_queue_id_column_is_refused_in_a_cluster(spark: Any, cluster: LocalCluster) -> None:
    df = spark.createDataFrame([("x", 0)], "body string, queue_id int")
    with pytest.raises(Exception, match="column 'queue_id' names a queue of one broker"):
        df.write.format("sluice").option("namesrv", cluster.namesrv).option("topic", "t").mode("append").save()
