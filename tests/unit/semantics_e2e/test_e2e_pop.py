"""Pop consumption through Sluice's own PopConsumer: receive, ack, change of invisible time, redelivery, FIFO
groups, long polling woken by a send, a deleted topic's positions, and in-flight state across a restart."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from e2e_brokers import BrokerFactory
from e2e_util import dispatched

from broker.client import Admin, Message, PopConsumer, Producer
from broker.errors import InvalidArgumentError, InvalidReceiptHandleError
from broker.format.message import Prop
from tests.support.waiting import wait_until

FAST_POP = {"pop_min_invisible_ms": 100}


def send(endpoint: str, topic: str, bodies: list[bytes], group: str | None = None, *, wait: bool = True) -> None:
    """Sends, then (``wait``) waits until the messages are in their consume queues: a send is answered once the
    commit log holds the message, and the dispatcher writes its queue entry a moment later, so a pop right after
    the answer may not see it yet."""
    with Producer(endpoint) as p:
        # a message group is one queue (the sharding key picks it) and the message's property
        for b in bodies:
            p.send(Message(topic, b, properties={Prop.SHARDING_KEY: group} if group else {}), sharding_key=group)
    if wait:
        with Admin(endpoint) as admin:
            dispatched(admin)


def test_receive_ack_change_and_redelivery(broker_factory: BrokerFactory) -> None:
    endpoint = f"127.0.0.1:{broker_factory(**FAST_POP).port}"
    send(endpoint, "Pop", [b"a", b"b", b"c"])
    with PopConsumer(endpoint, "pop-g") as c:
        got = c.receive("Pop", 10, invisible_ms=300)
        assert sorted(p.message.body for p in got) == [b"a", b"b", b"c"] and {p.delivery_attempt for p in got} == {1}
        assert c.receive("Pop", 10, invisible_ms=300) == []  # all invisible now
        by_body = {p.message.body: p for p in got}
        c.ack(by_body[b"a"])
        old = by_body[b"b"].receipt_handle
        c.change_invisible(by_body[b"b"], 5_000)
        assert by_body[b"b"].receipt_handle != old
        time.sleep(0.4)
        again = c.receive("Pop", 10, invisible_ms=5_000)
        assert [(p.message.body, p.delivery_attempt) for p in again] == [(b"c", 2)]  # b got 5 s; a is acked
        with pytest.raises(InvalidReceiptHandleError, match="already acked"):
            c.ack(by_body[b"a"])
        c.ack_all([by_body[b"b"], *again])
        with pytest.raises(InvalidArgumentError, match="invisible time"):
            c.receive("Pop", 10, invisible_ms=50)  # under the broker's minimum


def test_a_fifo_group_waits_for_the_earlier_message_of_a_message_group(broker_factory: BrokerFactory) -> None:
    endpoint = f"127.0.0.1:{broker_factory(**FAST_POP).port}"
    with Admin(endpoint) as admin:
        admin.update_subscription_group("fifo-g", consume_message_orderly=True)
    send(endpoint, "Ordered", [b"x1", b"x2", b"x3"], group="x")
    send(endpoint, "Ordered", [b"y1", b"y2"], group="y")
    with PopConsumer(endpoint, "fifo-g") as c1, PopConsumer(endpoint, "fifo-g") as c2:
        first = c1.receive("Ordered", 10, invisible_ms=10_000)
        assert sorted(p.message.body for p in first) == [b"x1", b"y1"]  # one per message group
        assert c2.receive("Ordered", 10, invisible_ms=10_000) == []  # x2, y2 wait behind them
        c1.ack(next(p for p in first if p.message.body == b"x1"))
        assert [p.message.body for p in c2.receive("Ordered", 10, invisible_ms=10_000)] == [b"x2"]


def test_long_polling_wakes_on_a_new_message(broker_factory: BrokerFactory) -> None:
    endpoint = f"127.0.0.1:{broker_factory(**FAST_POP).port}"
    send(endpoint, "Wait", [b"warm-up"])
    with PopConsumer(endpoint, "wait-g") as c:
        c.ack_all(c.receive("Wait", 10, invisible_ms=10_000))
        threading.Timer(0.5, send, (endpoint, "Wait", [b"news"]), {"wait": False}).start()  # the pop waits
        started = time.monotonic()
        got = c.receive("Wait", 10, invisible_ms=10_000, wait_ms=20_000)
        assert [p.message.body for p in got] == [b"news"]
        assert time.monotonic() - started < 15  # woken by the arrival, not by the 20 s timeout


def test_a_deleted_and_recreated_topic_is_popped_from_its_start(broker_factory: BrokerFactory) -> None:
    endpoint = f"127.0.0.1:{broker_factory(**FAST_POP).port}"
    send(endpoint, "Again", [b"old1", b"old2"])
    with PopConsumer(endpoint, "again-g") as c, Admin(endpoint) as admin:
        c.ack_all(c.receive("Again", 10, invisible_ms=10_000))
        admin.delete_topic("Again")
        send(endpoint, "Again", [b"new1"])
        assert [p.message.body for p in c.receive("Again", 10, invisible_ms=10_000, wait_ms=2000)] == [b"new1"]


@pytest.mark.parametrize("compact_bytes", [64 << 20, 100], ids=["journal", "snapshots"])
def test_in_flight_state_survives_a_restart(broker_factory: BrokerFactory, tmp_path: Path, compact_bytes: int) -> None:
    store = tmp_path / "pop-store"
    settings = {**FAST_POP, "journal_compact_bytes": compact_bytes}  # 100 B: a snapshot after every change or two
    broker = broker_factory(store, **settings)
    endpoint = f"127.0.0.1:{broker.port}"
    with Admin(endpoint) as admin:
        admin.create_topic("Kept", 1)
    send(endpoint, "Kept", [b"acked", b"out", b"never-received"])
    with PopConsumer(endpoint, "kept-g") as c:
        got = {p.message.body: p for p in c.receive("Kept", 2, invisible_ms=1_500)}
        c.ack(got[b"acked"])
    wait_until(lambda: compact_bytes > 4096 or (store / "config" / "pop" / "snapshot.json").exists(),
               "a snapshot of the pop journal", timeout_s=5)
    broker.shutdown()
    broker = broker_factory(store, **settings)
    endpoint = f"127.0.0.1:{broker.port}"
    with PopConsumer(endpoint, "kept-g") as c:
        now = c.receive("Kept", 10, invisible_ms=10_000)
        assert [p.message.body for p in now] == [b"never-received"]  # "out" is still invisible
        wait_until(lambda: bool(now.extend(c.receive("Kept", 10, invisible_ms=10_000)) or len(now) == 2),
                   "the in-flight one delivered again", timeout_s=10)
        assert [(p.message.body, p.delivery_attempt) for p in now[1:]] == [(b"out", 2)]
