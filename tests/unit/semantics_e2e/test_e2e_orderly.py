"""Orderly consumption: queues locked on the broker, one thread per queue, a failing message suspends its queue."""

from __future__ import annotations

import threading
import zlib
from collections import Counter, defaultdict

from conftest import wait_until

from broker.client import FIRST, ConsumeStatus, Message, Producer, PushConsumer, ReceivedMessage
from broker.server.broker_controller import BrokerController

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
                            reconsume_delay_ms=10, **FAST)  # fmt: skip
    with consumer:
        wait_until(lambda: sum(len(v) for v in done.values()) == QUEUES * PER_QUEUE, timeout_s=60, what="consumed")
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
