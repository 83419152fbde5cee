"""RocketMQ 4's remoting and RocketMQ 5's gRPC on one broker: what a 4.x producer sends over remoting (a body
compressed as it compresses bodies of 4 KiB and more included) is what the official RocketMQ 5 consumer receives,
and what the official RocketMQ 5 producer sends is what a 4.x consumer pulls over remoting, ids and all."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rmqv2_helpers import message, name, new_topic, producer, receive_until, simple_consumer

from broker.remoting.client import RemotingClient
from broker.server.process import BrokerProcess
from tests.support.remoting_wire import COMPRESS_FROM_BYTES, pull_all, remoting_broker, send_v2


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with remoting_broker(tmp_path_factory.mktemp("rmqv2-remoting")) as proc:
        yield proc


def test_a_remoting_producers_messages_reach_the_official_rocketmq_5_consumer(broker: BrokerProcess) -> None:
    topic = new_topic(broker.endpoint, queues=2)
    large = b"x" * (2 * COMPRESS_FROM_BYTES)
    bodies = [b"small-%d" % i for i in range(5)] + [b"large-%d-" % i + large for i in range(2)]
    with RemotingClient(broker.remoting_endpoint) as client:
        sent = {send_v2(client, topic, body, tags="R", keys=[f"k{i}"], properties={"n": str(i)},
                        queue_id=i % 2).ext_fields["UNIQ_KEY"]: body
                for i, body in enumerate(bodies)}
    with simple_consumer(broker.endpoint, name("g5"), topic, "R") as consumer:
        got = receive_until(consumer, len(bodies), invisible_s=20)
    assert {m.message_id: bytes(m.body) for m in got} == sent  # ids are the UNIQ_KEYs; large bodies inflated
    for m in got:
        i = int(m.properties["n"])
        assert m.tag == "R" and list(m.keys) == [f"k{i}"]


def test_the_official_rocketmq_5_producers_messages_are_pulled_over_remoting(broker: BrokerProcess) -> None:
    topic = new_topic(broker.endpoint, queues=2)
    with producer(broker.endpoint, topic) as p:
        ids = {p.send(message(topic, f"v5-{i}".encode(), tag="F", keys=[f"f{i}"], properties={"i": str(i)})).message_id
               for i in range(6)}
    with RemotingClient(broker.remoting_endpoint) as client:
        pulled = pull_all(client, name("g4"), topic, queues=2)
    assert {m.properties["UNIQ_KEY"] for m in pulled} == ids
    for m in pulled:
        i = int(m.properties["i"])
        assert (m.body, m.tags, m.keys) == (f"v5-{i}".encode(), "F", [f"f{i}"])
