"""The official RocketMQ 5 SimpleConsumer and PushConsumer against a broker process: receive, ack, change of
invisible time, redelivery, dead letters, listeners that succeed and fail, and FIFO order with two consumers."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest
from rmqv2_helpers import client_config, message, name, new_topic, producer, receive_until, simple_consumer
from rocketmq import ConsumeResult, MessageListener, PushConsumer, SimpleConsumer
from rocketmq import FilterExpression as RmqFilter
from rocketmq.grpc_protocol import Code, FilterType
from rocketmq.v5.exception import BadRequestException

from broker.client import Admin, ReceivedMessage
from broker.errors import TopicNotExistError
from broker.semantics.retry import DLQ_ORIGIN_MESSAGE_ID, DLQ_ORIGIN_TOPIC
from tests.support.waiting import wait_for


def test_acked_messages_are_not_delivered_again_and_unacked_ones_are(endpoint: str) -> None:
    topic, group = new_topic(endpoint), name("g")
    with producer(endpoint, topic) as p:
        ids = [p.send(message(topic, f"m{i}".encode())).message_id for i in range(6)]
    with simple_consumer(endpoint, group, topic) as c:
        first = receive_until(c, 6, invisible_s=1, ack=False)
        assert sorted(m.message_id for m in first) == sorted(ids)
        kept = {m.message_id for m in first[:3]}
        for m in first[:3]:
            c.ack(m)
        again = receive_until(c, 3, invisible_s=30, ack=False)  # the three not acked, after their 1 s
        assert {m.message_id for m in again} == set(ids) - kept
        assert all(m.delivery_attempt == 2 for m in again)
        for m in again:
            c.ack(m)
        with pytest.raises(BadRequestException) as refused:
            c.ack(first[0])  # acked before: its handle is refused, nothing changes
        assert refused.value.code == Code.INVALID_RECEIPT_HANDLE
        time.sleep(1.5)
        assert c.receive(32, 1) == []


def test_change_invisible_duration_gives_a_new_handle_and_moves_the_redelivery(endpoint: str) -> None:
    topic, group = new_topic(endpoint), name("g")
    with producer(endpoint, topic) as p:
        mid = p.send(message(topic, b"slow")).message_id
    with simple_consumer(endpoint, group, topic) as c:
        (m,) = receive_until(c, 1, invisible_s=60, ack=False)
        old_handle = m.receipt_handle
        c.change_invisible_duration(m, 1)  # 60 s became 1 s from now
        assert m.receipt_handle != old_handle
        (again,) = receive_until(c, 1, invisible_s=60, ack=False, timeout_s=20)
        assert again.message_id == mid and again.delivery_attempt == 2
        with pytest.raises(BadRequestException):
            c.ack(m)  # the superseded delivery's handle
        c.ack(again)


def test_messages_go_to_the_dead_letter_queue_after_max_attempts(endpoint: str) -> None:
    topic, group = new_topic(endpoint), name("g")
    with Admin(endpoint) as admin:
        admin.update_subscription_group(group, retry_max_times=1)  # two deliveries, then the DLQ
    with producer(endpoint, topic) as p:
        mid = p.send(message(topic, b"poison", keys=["poison-key"])).message_id
    with simple_consumer(endpoint, group, topic) as c:
        attempts = [m.delivery_attempt for m in receive_until(c, 2, invisible_s=1, ack=False)]
        assert attempts == [1, 2]
        dead = wait_for(lambda: dead_letters(endpoint, group, mid), "the dead letter")
        assert len(dead) == 1 and dead[0].body == b"poison"
        assert dead[0].properties[DLQ_ORIGIN_MESSAGE_ID] == mid and dead[0].properties[DLQ_ORIGIN_TOPIC] == topic
        time.sleep(1.5)
        assert c.receive(32, 1) == []  # not delivered a third time


def dead_letters(endpoint: str, group: str, message_id: str) -> list[ReceivedMessage]:
    with Admin(endpoint) as admin:
        try:
            return admin.query_by_key(f"%DLQ%{group}", message_id)
        except TopicNotExistError:  # no dead letter yet
            return []


class Recording(MessageListener):
    def __init__(self, fail_first: int = 0, delay_s: float = 0.0) -> None:
        self.fail_first, self.delay_s = fail_first, delay_s
        self.lock = threading.Lock()
        self.seen: list[tuple[str, bytes, int]] = []
        self.attempts: dict[str, int] = defaultdict(int)

    def consume(self, message):  # type: ignore[no-untyped-def]
        time.sleep(self.delay_s)
        with self.lock:
            self.attempts[message.message_id] += 1
            self.seen.append((message.message_id, message.body, message.delivery_attempt))
            fail = self.attempts[message.message_id] <= self.fail_first
        return ConsumeResult.FAILURE if fail else ConsumeResult.SUCCESS


def push_consumer(endpoint: str, group: str, topic: str, listener: MessageListener) -> PushConsumer:
    c = PushConsumer(client_config(endpoint), group, listener, {topic: RmqFilter()}, consumption_thread_count=4)
    c.startup()
    return c


def test_push_consumers_with_a_listener_that_succeeds_and_one_that_fails(endpoint: str) -> None:
    topic = new_topic(endpoint)
    with producer(endpoint, topic) as p:
        ids = {p.send(message(topic, f"m{i}".encode())).message_id for i in range(10)}
    ok, failing = Recording(), Recording(fail_first=2)  # two groups, each gets every message
    consumers = [push_consumer(endpoint, name("ok"), topic, ok), push_consumer(endpoint, name("fail"), topic, failing)]
    try:
        wait_for(lambda: {i for i, _, _ in ok.seen} == ids, "every message consumed by the good listener")
        wait_for(lambda: all(failing.attempts[i] >= 3 for i in ids), "every message retried twice")
        time.sleep(1.5)  # acked after the third attempt: nothing comes a fourth time
    finally:
        for c in consumers:
            c.shutdown()
    assert len(ok.seen) == 10 and all(a == 1 for _, _, a in ok.seen)
    assert all(failing.attempts[i] == 3 for i in ids)
    assert sorted(a for _, _, a in failing.seen) == sorted([1, 2, 3] * 10)  # the broker counts the attempts


def test_fifo_order_per_message_group_with_two_consumers(endpoint: str) -> None:
    topic, group = new_topic(endpoint, queues=2), name("fifo")
    with Admin(endpoint) as admin:
        admin.update_subscription_group(group, consume_message_orderly=True)
    listener = Recording(delay_s=0.01)
    consumers = [push_consumer(endpoint, group, topic, listener) for _ in range(2)]
    try:
        with producer(endpoint, topic) as p:
            for i in range(40):
                p.send(message(topic, f"{i % 4}:{i // 4}".encode(), group=f"g{i % 4}"))
        wait_for(lambda: len({b for _, b, _ in listener.seen}) == 40, "all 40 consumed")
    finally:
        for c in consumers:
            c.shutdown()
    order: dict[str, list[int]] = defaultdict(list)
    for _, body, _ in listener.seen:
        g, i = body.decode().split(":")
        order[g].append(int(i))
    assert {g: seq for g, seq in order.items()} == {str(g): list(range(10)) for g in range(4)}


def test_tag_and_sql92_filters_use_the_brokers_filters(endpoint: str) -> None:
    topic = new_topic(endpoint, queues=1)
    with producer(endpoint, topic) as p:
        for i in range(8):
            p.send(message(topic, f"f{i}".encode(), tag="even" if i % 2 == 0 else "odd", properties={"n": str(i)}))
    selector = RmqFilter("n > 4 AND TAGS = 'odd'", FilterType.SQL)
    sql = SimpleConsumer(client_config(endpoint), name("sql"), {topic: selector}, await_duration=1)
    sql.startup()
    try:
        got = receive_until(sql, 2, invisible_s=20)
        time.sleep(0.5)
        got += sql.receive(32, 20)
    finally:
        sql.shutdown()
    assert sorted(m.body for m in got) == [b"f5", b"f7"]
    with simple_consumer(endpoint, name("tag"), topic, "even") as c:
        evens = receive_until(c, 4, invisible_s=20)
    assert sorted(m.body for m in evens) == [b"f0", b"f2", b"f4", b"f6"]
