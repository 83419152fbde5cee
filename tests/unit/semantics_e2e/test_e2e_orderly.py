"""Orderly consumption: queues locked on the broker, one thread per queue, a failing message suspends its queue."""

from __future__ import annotations

import threading
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable

from broker.client import FIRST, Admin, ConsumeStatus, Message, Producer, PushConsumer, ReceivedMessage
from broker.format.message import Prop
from broker.server.broker_controller import BrokerController
from tests.support.waiting import wait_until

FAST = {"heartbeat_interval_ms": 200, "rebalance_interval_ms": 300, "persist_interval_ms": 200, "long_poll_ms": 1000}
QUEUES, PER_QUEUE = 4, 100


def fails_first(body: bytes) -> bool:
    return zlib.crc32(body) % 10 < 3  # about 30% of the messages fail on their first attempts


def test_orderly_keeps_order_per_queue_under_a_failing_listener(broker: BrokerController, endpoint: str) -> None:
    lock = threading.Lock()
    attempts: Counter[bytes] = Counter()
    tried: dict[int, list[int]] = defaultdict(list)  # queue -> sequence numbers in the order they were attempted
    done: dict[int, list[int]] = defaultdict(list)
    threads: dict[int, set[str]] = defaultdict(set)

    def listener(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        (m,) = msgs
        queue, seq = (int(x) for x in m.body.split(b":"))
        with lock:
            attempts[m.body] += 1
            tried[queue].append(seq)
            threads[queue].add(threading.current_thread().name)
            if fails_first(m.body) and attempts[m.body] <= 2:
                return ConsumeStatus.RECONSUME_LATER if attempts[m.body] == 1 else _raise()
            done[queue].append(seq)
        return ConsumeStatus.CONSUME_SUCCESS

    with Producer(endpoint) as producer:
        for q in range(QUEUES):
            producer.send_batch([Message("Ord", f"{q}:{i}".encode()) for i in range(PER_QUEUE)], queue_id=q)
    consumer = PushConsumer(endpoint, "ord-group", {"Ord": "*"}, listener, orderly=True, consume_from=FIRST,
                            reconsume_delay_ms=10, **FAST)
    with consumer:
        wait_until(lambda: sum(len(v) for v in done.values()) == QUEUES * PER_QUEUE, "consumed", timeout_s=60)
        held = broker.locks.locked_queues("ord-group")  # every queue of the topic (8, auto-created), by this client
        assert held == {("Ord", q): consumer.client_id for q in range(8)}
    assert broker.locks.locked_queues("ord-group") == {}  # released on shutdown
    for q in range(QUEUES):
        assert done[q] == list(range(PER_QUEUE)), q  # every message, in queue order, none skipped
        assert tried[q] == sorted(tried[q]), q  # a failed message was retried before any later one
        assert len(threads[q]) == 1
    failing = [b for b in attempts if fails_first(b)]
    assert failing and all(attempts[b] == 3 for b in failing)
    assert sum(1 for b in attempts if not fails_first(b) and attempts[b] != 1) == 0
    assert broker.store is not None and broker.store.max_offset("%RETRY%ord-group", 0) == 0  # nothing sent back


def _raise() -> ConsumeStatus:
    raise RuntimeError("simulated listener failure")


def test_queues_handed_over_between_orderly_consumers_keep_order(broker: BrokerController, endpoint: str) -> None:
    lock = threading.Lock()
    consumed: dict[int, list[int]] = defaultdict(list)  # queue -> sequence numbers, across both consumers
    by_client: dict[str, set[int]] = defaultdict(set)

    def listener_of(name: str) -> Callable[[list[ReceivedMessage]], ConsumeStatus]:
        def listener(msgs: list[ReceivedMessage]) -> ConsumeStatus:
            (m,) = msgs
            queue, seq = (int(x) for x in m.body.split(b":"))
            time.sleep(0.005)  # slow enough that the hand-over happens mid-queue
            with lock:
                consumed[queue].append(seq)
                by_client[name].add(queue)
            return ConsumeStatus.CONSUME_SUCCESS

        return listener

    with Admin(endpoint) as admin:
        admin.create_topic("Hand", 4)
    with Producer(endpoint) as producer:
        for q in range(4):
            producer.send_batch([Message("Hand", f"{q}:{i}".encode()) for i in range(300)], queue_id=q)
    first = PushConsumer(endpoint, "hand-group", {"Hand": "*"}, listener_of("a"), orderly=True, consume_from=FIRST,
                         client_id="a", **FAST).start()
    try:
        wait_until(lambda: sum(len(v) for v in consumed.values()) >= 100, "first consumer started")
        with PushConsumer(endpoint, "hand-group", {"Hand": "*"}, listener_of("b"), orderly=True, consume_from=FIRST,
                          client_id="b", **FAST):
            wait_until(lambda: sum(len(v) for v in consumed.values()) >= 1200, "all consumed", timeout_s=60)
            time.sleep(0.5)  # anything consumed twice would show up now
    finally:
        first.shutdown()
    assert by_client["b"], "the second consumer never took a queue over"
    for q in range(4):
        assert consumed[q] == list(range(300)), q  # in order, nothing twice, nothing skipped


def test_orderly_with_max_reconsume_times_dead_letters_and_goes_on(broker: BrokerController, endpoint: str) -> None:
    """RocketMQ's orderly checkReconsumeTimes: a message failing past max_reconsume_times goes to %DLQ%{group}
    and its queue goes on, in order; messages before and after it are consumed once."""
    lock = threading.Lock()
    attempts: Counter[bytes] = Counter()
    done: list[bytes] = []

    def listener(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        (m,) = msgs
        with lock:
            attempts[m.body] += 1
            if m.body == b"poison":
                return ConsumeStatus.RECONSUME_LATER
            done.append(m.body)
        return ConsumeStatus.CONSUME_SUCCESS

    bodies = [b"a", b"b", b"poison", b"c", b"d"]
    with Producer(endpoint) as producer:
        sent = producer.send_batch([Message("OrdDlq", b) for b in bodies], queue_id=0)
    consumer = PushConsumer(endpoint, "ord-dlq", {"OrdDlq": "*"}, listener, orderly=True, consume_from=FIRST,
                            reconsume_delay_ms=10, max_reconsume_times=2, **FAST)
    with consumer:
        wait_until(lambda: len(done) == 4, "the queue goes on past the dead letter", timeout_s=30)
    assert done == [b"a", b"b", b"c", b"d"]
    assert attempts[b"poison"] == 3  # the first try and max_reconsume_times=2 retries
    assert broker.store is not None
    dead = broker.store.get_message("inspector", "%DLQ%ord-dlq", 0, 0, 8)
    (letter,) = dead.messages()
    assert letter.body == b"poison" and letter.properties[Prop.ORIGIN_MESSAGE_ID] == sent[2].msg_id
    assert broker.store.check() == []
