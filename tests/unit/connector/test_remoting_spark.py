"""Spark and RocketMQ 4's remoting on one broker: the source reads what a 4.x producer sent over remoting (a body
compressed as such producers compress bodies of 4 KiB and more is given inflated), and what the exactly-once sink
writes is what a 4.x consumer pulls over remoting."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from connector_helpers import new_topic

from broker.format.message import Prop
from broker.remoting.client import RemotingClient
from broker.server.process import BrokerProcess
from tests.support.remoting_wire import COMPRESS_FROM_BYTES, pull_all, remoting_broker, send_v2

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with remoting_broker(tmp_path_factory.mktemp("spark-remoting")) as proc:
        yield proc


def test_the_source_reads_what_a_remoting_producer_sent(spark: Any, broker: BrokerProcess) -> None:
    topic = new_topic(broker.endpoint, queues=2, prefix="from_remoting")
    large = b"y" * (2 * COMPRESS_FROM_BYTES)
    bodies = [b"r-%d" % i for i in range(8)] + [b"big-%d-" % i + large for i in range(2)]
    with RemotingClient(broker.remoting_endpoint) as client:
        sent = {send_v2(client, topic, body, tags="T4", keys=[f"k{i}"], queue_id=i % 2).ext_fields["UNIQ_KEY"]: body
                for i, body in enumerate(bodies)}
    rows = (spark.read.format("sluice").option("endpoints", broker.endpoint).option("topic", topic)
            .option("includeProperties", "true").load().collect())
    assert {r.properties[Prop.UNIQ_KEY]: bytes(r.body) for r in rows} == sent
    assert {r.tags for r in rows} == {"T4"}


def test_what_the_sink_writes_is_pulled_over_remoting(spark: Any, broker: BrokerProcess) -> None:
    topic = new_topic(broker.endpoint, queues=2, prefix="to_remoting")
    rows = [(f"s-{i}", "TS", [f"k{i}"], {"n": str(i)}) for i in range(200)]
    df = spark.createDataFrame(rows, "body string, tags string, keys array<string>, properties map<string,string>")
    (df.write.format("sluice").option("endpoints", broker.endpoint).option("topic", topic)
     .option("deliveryGuarantee", "exactly-once").mode("append").save())
    with RemotingClient(broker.remoting_endpoint) as client:
        pulled = pull_all(client, "spark-remoting-reader", topic, queues=2)
    assert sorted(m.body.decode() for m in pulled) == sorted(body for body, *_ in rows)
    for m in pulled:
        i = int(m.properties["n"])
        assert (m.tags, m.keys, m.body) == ("TS", [f"k{i}"], f"s-{i}".encode())
