"""spark.read.format("sluice") reads what RocketMQ 5's official Python client produced through the broker's
apache.rocketmq.v2 service: bodies, tags, keys, and the client's message id as UNIQ_KEY."""

from __future__ import annotations

from typing import Any

import pytest
from connector_helpers import new_topic
from rocketmq import ClientConfiguration, Credentials, Message, Producer

from broker.format.message import Prop

pytestmark = pytest.mark.spark


def test_spark_source_reads_what_the_official_rocketmq5_client_produced(spark: Any, broker: str) -> None:
    topic = new_topic(broker, 2)
    producer = Producer(ClientConfiguration(broker, Credentials(), request_timeout=10), (topic,))
    producer.startup()
    ids: dict[str, int] = {}
    try:
        for i in range(12):
            m = Message()
            m.topic, m.body, m.tag, m.keys = topic, f"spark-{i}".encode(), "S", f"sk{i}"
            ids[producer.send(m).message_id] = i
    finally:
        producer.shutdown()
    rows = (spark.read.format("sluice").option("endpoints", broker).option("topic", topic)
            .option("includeProperties", "true").load().collect())
    assert len(rows) == 12
    for r in rows:
        i = ids[r.properties[Prop.UNIQ_KEY]]
        assert bytes(r.body) == f"spark-{i}".encode() and r.tags == "S" and r.keys == [f"sk{i}"]
