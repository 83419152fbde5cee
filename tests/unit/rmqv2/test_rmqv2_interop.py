"""One protocol in, the other out: Sluice's Producer to the official consumer, the official Producer to Sluice's
PullConsumer and PopConsumer (the Spark source reading what the official client produced is in
tests/unit/connector/test_rmqv2_source.py, beside the connector suite's SparkSession)."""

from __future__ import annotations

from rmqv2_helpers import message, name, new_topic, producer, receive_until, simple_consumer

from broker.client import Message, PopConsumer, Producer, PullConsumer
from broker.format.message import Prop


def test_sluice_producer_to_official_simple_consumer(endpoint: str) -> None:
    topic = new_topic(endpoint)
    with Producer(endpoint) as p:
        sent = [p.send(Message(topic, f"s{i}".encode(), tags="T", keys=[f"k{i}"], properties={"a": "b"}))
                for i in range(8)]
    with simple_consumer(endpoint, name("g"), topic, "T") as c:
        got = receive_until(c, 8, invisible_s=20)
    by_id = {m.message_id: m for m in got}
    assert set(by_id) == {r.uniq_key for r in sent}  # the message id is the UNIQ_KEY Sluice's Producer set
    for r in sent:
        m = by_id[r.uniq_key]
        assert m.tag == "T" and m.properties.get("a") == "b" and m.delivery_attempt == 1
        assert int(m.body[1:]) == int(next(iter(m.keys))[1:])


def test_official_producer_to_sluice_pull_and_pop_consumers(endpoint: str) -> None:
    topic = new_topic(endpoint, queues=2)
    with producer(endpoint, topic) as p:
        ids = [p.send(message(topic, f"o{i}".encode(), tag="X", properties={"n": str(i)})).message_id
               for i in range(6)]
    pulled = []
    with PullConsumer(endpoint, name("pull")) as pc:
        for q in range(2):
            pulled += pc.pull(topic, q, 0, max_msgs=32).messages
    assert sorted(m.properties[Prop.UNIQ_KEY] for m in pulled) == sorted(ids)
    assert all(m.tags == "X" for m in pulled)
    with PopConsumer(endpoint, name("pop")) as pop:
        got = pop.receive(topic, max_msgs=32, invisible_ms=20_000, wait_ms=2000)
        assert sorted(p.message.properties[Prop.UNIQ_KEY] for p in got) == sorted(ids)
        pop.ack_all(got)
        assert pop.receive(topic, max_msgs=32, invisible_ms=20_000) == []
