"""Retry and dead letters through a real broker and a PushConsumer whose listener keeps failing."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from conftest import wait_until

from broker.client import (
    BROADCASTING,
    FIRST,
    Admin,
    ConsumeStatus,
    Message,
    Producer,
    PullConsumer,
    PushConsumer,
    ReceivedMessage,
)
from broker.errors import BrokerError, ResponseCode
from broker.semantics.retry import DLQ_ORIGIN_MESSAGE_ID, DLQ_ORIGIN_TOPIC
from broker.server.broker_controller import BrokerController
from broker.store import GetStatus
from broker.store.message import Prop

FAST = {"heartbeat_interval_ms": 200, "rebalance_interval_ms": 300, "persist_interval_ms": 200, "long_poll_ms": 1000}


def dead_letters(broker: BrokerController, group: str) -> list[ReceivedMessage]:
    assert broker.store is not None
    r = broker.store.get_message("inspector", f"%DLQ%{group}", 0, 0, 64)
    return r.messages() if r.status is GetStatus.FOUND else []


def test_message_failing_17_times_ends_in_the_dlq_with_its_history(broker: BrokerController, endpoint: str) -> None:
    calls: Counter[str] = Counter()
    seen_reconsume: list[int] = []
    lock = threading.Lock()

    def always_fails(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        with lock:
            for m in msgs:
                calls[m.properties.get(Prop.ORIGIN_MESSAGE_ID, m.msg_id)] += 1
                seen_reconsume.append(m.reconsume_times)
                assert m.topic == "Fragile"  # retried messages are shown under their own topic
        return ConsumeStatus.RECONSUME_LATER

    with Producer(endpoint) as producer:
        sent = producer.send(Message("Fragile", b"poison", keys=["p1"], properties={"n": "1"}))
    with PushConsumer(endpoint, "fragile-group", {"Fragile": "*"}, always_fails, consume_from=FIRST, **FAST):
        wait_until(lambda: dead_letters(broker, "fragile-group") != [], timeout_s=60, what="dead letter")
    assert calls == {sent.msg_id: 17}
    assert seen_reconsume == list(range(17))
    (dead,) = dead_letters(broker, "fragile-group")
    assert dead.body == b"poison" and dead.reconsume_times == 17 and dead.properties["n"] == "1"
    assert dead.properties[Prop.RETRY_TOPIC] == "Fragile" and dead.properties[DLQ_ORIGIN_TOPIC] == "Fragile"
    assert dead.properties[Prop.ORIGIN_MESSAGE_ID] == sent.msg_id == dead.properties[DLQ_ORIGIN_MESSAGE_ID]
    with PullConsumer(endpoint, "fragile-group") as consumer:  # a DLQ is never redelivered
        with pytest.raises(BrokerError) as refused:
            consumer.pull("%DLQ%fragile-group", 0, 0)
        assert refused.value.code is ResponseCode.NO_PERMISSION and "dead-letter" in refused.value.message


def test_group_settings_retry_max_times_and_consume_enable(broker: BrokerController, endpoint: str) -> None:
    with Admin(endpoint) as admin:
        cfg = admin.update_subscription_group("short-fuse", retry_max_times=2)
        assert cfg.retry_max_times == 2 and cfg.consume_enable and cfg.retry_queue_nums == 1
    calls: list[int] = []

    def fails(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        calls.extend(m.reconsume_times for m in msgs)
        raise RuntimeError("simulated failure")

    with Producer(endpoint) as producer:
        producer.send(Message("Short", b"x"))
    with PushConsumer(endpoint, "short-fuse", {"Short": "*"}, fails, consume_from=FIRST, **FAST):
        wait_until(lambda: dead_letters(broker, "short-fuse") != [], timeout_s=30, what="dead letter")
    assert calls == [0, 1, 2]
    with Admin(endpoint) as admin:
        assert admin.update_subscription_group("short-fuse", consume_enable=False).consume_enable is False
    with PullConsumer(endpoint, "short-fuse") as consumer, pytest.raises(BrokerError, match="consumeEnable=false"):
        consumer.pull("Short", 0, 0)
    assert broker.config.config_dir.joinpath("subscriptionGroup.json").read_text().count('"consumeEnable": false') == 1


def test_success_after_retries_and_max_reconsume_from_the_client(broker: BrokerController, endpoint: str) -> None:
    attempts: Counter[bytes] = Counter()
    done: list[bytes] = []

    def flaky(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        for m in msgs:
            attempts[m.body] += 1
            if m.body == b"3" and attempts[m.body] < 3:
                return ConsumeStatus.RECONSUME_LATER
        done.extend(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    with Producer(endpoint) as producer:
        producer.send_batch([Message("Flaky2", f"{i}".encode()) for i in range(8)])
    with PushConsumer(endpoint, "flaky2", {"Flaky2": "*"}, flaky, consume_from=FIRST, max_reconsume_times=5, **FAST):
        wait_until(lambda: len(done) == 8, timeout_s=30, what="all consumed")
    assert sorted(done, key=int) == [f"{i}".encode() for i in range(8)] and attempts[b"3"] == 3
    assert dead_letters(broker, "flaky2") == []


def test_broadcasting_refused_when_the_group_disables_it(broker: BrokerController, endpoint: str) -> None:
    with Admin(endpoint) as admin:
        admin.update_subscription_group("no-bc", consume_broadcast_enable=False)
    consumer = PushConsumer(endpoint, "no-bc", {"Bc": "*"}, lambda msgs: None, model=BROADCASTING, **FAST)
    with pytest.raises(BrokerError, match="consumeBroadcastEnable=false"):
        consumer.start()
    consumer.conn.close()
