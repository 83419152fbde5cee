"""The official RocketMQ 5 Producer against a broker process: normal, FIFO, delay and transactional messages."""

from __future__ import annotations

import threading
import time

import pytest
from rmqv2_helpers import message, name, new_topic, producer, receive_until, simple_consumer
from rocketmq import TransactionChecker, TransactionResolution
from rocketmq.v5.exception import ClientException

from broker.client import Admin, PullConsumer
from broker.format.message import Prop
from tests.support.waiting import wait_for


def test_normal_messages_keep_the_client_message_id_tag_keys_and_properties(endpoint: str) -> None:
    topic = new_topic(endpoint)
    with producer(endpoint, topic) as p:
        receipts = [p.send(message(topic, f"m{i}".encode(), tag="TagA", keys=[f"key-{i}"], properties={"p": str(i)}))
                    for i in range(10)]
    ids = [r.message_id for r in receipts]
    assert len(set(ids)) == 10 and all(len(i) == 34 for i in ids)  # the client's own ids, echoed
    with Admin(endpoint) as admin:  # Sluice finds them by the client's id (UNIQ_KEY) and by their keys
        assert [m.body for m in admin.query_by_key(topic, ids[3])] == [b"m3"]
        found = admin.query_by_key(topic, "key-7")
        assert [m.properties[Prop.UNIQ_KEY] for m in found] == [ids[7]]
        assert found[0].tags == "TagA" and found[0].properties["p"] == "7"
    with simple_consumer(endpoint, name("g"), topic, "TagA") as c:
        got = receive_until(c, 10, invisible_s=20)
    assert sorted(m.message_id for m in got) == sorted(ids)
    assert {m.body for m in got} == {f"m{i}".encode() for i in range(10)}
    assert all(m.tag == "TagA" and m.delivery_attempt == 1 and m.properties.get("p") for m in got)


def test_fifo_messages_of_one_group_land_in_one_queue_in_order(endpoint: str) -> None:
    topic = new_topic(endpoint, queues=4)
    with producer(endpoint, topic) as p:
        for i in range(30):
            p.send(message(topic, f"{i % 3}:{i}".encode(), group=f"order-{i % 3}"))
    with PullConsumer(endpoint, name("reader")) as reader, Admin(endpoint) as admin:
        per_group: dict[str, list[tuple[int, int]]] = {}
        for queue_id, (low, high) in admin.queue_offsets(topic).items():
            for m in reader.pull(topic, queue_id, low, max_msgs=64).messages if high > low else []:
                per_group.setdefault(m.properties[Prop.SHARDING_KEY], []).append((queue_id, int(m.body.split(b":")[1])))
    assert sorted(per_group) == ["order-0", "order-1", "order-2"]
    for group, items in per_group.items():
        assert len({q for q, _ in items}) == 1, f"{group} spread over queues {items}"
        assert [i for _, i in items] == sorted(i for _, i in items) and len(items) == 10


def test_a_delayed_message_arrives_at_its_time_not_before(endpoint: str) -> None:
    topic = new_topic(endpoint)
    deliver_s = int(time.time()) + 3
    with producer(endpoint, topic) as p:
        receipt = p.send(message(topic, b"later", deliver_s=deliver_s))
    with simple_consumer(endpoint, name("g"), topic, wait_s=5) as c:
        got = receive_until(c, 1, invisible_s=20, timeout_s=30)
        arrived_ms = int(time.time() * 1000)
    m = got[0]
    assert m.message_id == receipt.message_id and m.body == b"later"
    assert m.delivery_timestamp == deliver_s * 1000
    assert arrived_ms >= deliver_s * 1000
    with Admin(endpoint) as admin:
        (stored,) = admin.query_by_key(topic, receipt.message_id)  # the copy in its topic, not the timer's
    assert stored.store_timestamp >= deliver_s * 1000, "stored in its topic before its time"
    assert stored.store_timestamp - deliver_s * 1000 < 5000  # 1 s is the target; the bound allows a busy machine


class Checker(TransactionChecker):
    def __init__(self) -> None:
        self.asked: list[str] = []
        self.event = threading.Event()

    def check(self, message):  # type: ignore[no-untyped-def]
        self.asked.append(message.message_id)
        self.event.set()
        return TransactionResolution.COMMIT


def test_transactions_commit_roll_back_and_are_checked_back_through_telemetry(endpoint: str) -> None:
    topic = new_topic(endpoint)
    checker = Checker()
    with producer(endpoint, topic, checker=checker) as p:
        committed = p.begin_transaction()
        r1 = p.send(message(topic, b"commit-me"), committed)
        committed.commit()
        rolled_back = p.begin_transaction()
        p.send(message(topic, b"roll-me-back"), rolled_back)
        rolled_back.rollback()
        left_open = p.begin_transaction()
        r3 = p.send(message(topic, b"checked-back"), left_open)  # never ended by the client: the broker asks
        assert checker.event.wait(30), "no check-back arrived through the Telemetry stream"
        assert r3.message_id in checker.asked and r1.message_id not in checker.asked
        with simple_consumer(endpoint, name("g"), topic) as c:
            got = receive_until(c, 2, invisible_s=20)
            time.sleep(1.5)  # the rolled-back message must not show up in the meantime
            got += [m for m in c.receive(32, 20)]
    assert sorted(m.body for m in got) == [b"checked-back", b"commit-me"]
    with Admin(endpoint) as admin:
        states = {t.transaction_id: t.status for t in admin.list_transactions()}
    assert states[r1.transaction_id] == "COMMITTED" and states[r3.transaction_id] == "COMMITTED"
    assert wait_for(lambda: checker.asked.count(r3.message_id) >= 1)


def test_a_delayed_message_recalled_before_its_time_is_never_delivered(endpoint: str) -> None:
    topic = new_topic(endpoint)
    deliver_s = int(time.time()) + 3
    with producer(endpoint, topic) as p:
        kept = p.send(message(topic, b"kept", deliver_s=deliver_s))
        recalled = p.send(message(topic, b"recalled", deliver_s=deliver_s))
        assert recalled.recall_handle
        assert p.recall_message(topic, recalled.recall_handle) == recalled.message_id
        with pytest.raises(ClientException):
            p.recall_message(topic, recalled.recall_handle)  # once only
    with simple_consumer(endpoint, name("g"), topic, wait_s=5) as c:
        got = receive_until(c, 1, invisible_s=20)
        time.sleep(1.0)
        got += c.receive(32, 20)
    assert [m.message_id for m in got] == [kept.message_id]
