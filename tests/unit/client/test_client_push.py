"""PushConsumer against a real in-process broker: rebalance, leaving members, broadcasting, start positions."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from broker.client import (
    BROADCASTING,
    CIRCLE,
    FIRST,
    LAST,
    TIMESTAMP,
    Admin,
    ConsumeStatus,
    Message,
    Producer,
    PushConsumer,
    ReceivedMessage,
)
from broker.errors import InvalidArgumentError
from broker.server.broker_controller import BrokerController
from tests.support.listeners import BodyRecorder
from tests.support.waiting import wait_until

FAST = {"heartbeat_interval_ms": 100, "rebalance_interval_ms": 200, "persist_interval_ms": 100, "long_poll_ms": 1000}


def send(endpoint: str, topic: str, start: int, n: int) -> None:
    with Producer(endpoint) as p:
        for q in range(8):
            p.send_batch([Message(topic, f"{i}".encode()) for i in range(start + q, start + n, 8)], queue_id=q)


def test_three_consumers_split_eight_queues_then_one_leaves(broker: BrokerController, endpoint: str) -> None:
    with Admin(endpoint) as admin:
        admin.create_topic("Reb", 8)
    sink = BodyRecorder()
    consumers = [
        PushConsumer(endpoint, "rg", {"Reb": "*"}, sink, consume_from=FIRST, client_id=f"c{i}", **FAST).start()
        for i in range(3)
    ]
    try:

        def split_ok(members: list[PushConsumer]) -> bool:
            shares = [c.assigned_queues() for c in members]
            flat = [q for s in shares for q in s]
            return len(flat) == 8 and len(set(flat)) == 8

        wait_until(lambda: split_ok(consumers))
        assert sorted(len(c.assigned_queues()) for c in consumers) == [2, 3, 3]
        send(endpoint, "Reb", 0, 400)
        wait_until(lambda: len(set(sink.bodies)) == 400)
        consumers[0].shutdown()
        wait_until(lambda: split_ok(consumers[1:]) and all(len(c.assigned_queues()) == 4 for c in consumers[1:]))
        send(endpoint, "Reb", 400, 400)
        wait_until(lambda: len(set(sink.bodies)) == 800)
        assert set(sink.bodies) == {str(i).encode() for i in range(800)}
    finally:
        for c in consumers:
            c.shutdown()
    with Admin(endpoint) as admin:  # every offset committed on the way out
        wait_until(lambda: sum(x.lag for x in admin.consumer_lag("rg", "Reb")) == 0)


def test_circle_allocation_and_listener_failure_is_retried(broker: BrokerController, endpoint: str) -> None:
    attempts: Counter[bytes] = Counter()
    done = BodyRecorder()

    def flaky(msgs: list[ReceivedMessage]) -> ConsumeStatus:
        for m in msgs:
            attempts[m.body] += 1
            if m.body == b"3" and attempts[m.body] < 3:
                raise RuntimeError("simulated listener failure")
        return done(msgs)

    send(endpoint, "Flaky", 0, 16)
    with PushConsumer(endpoint, "fg", {"Flaky": "*"}, flaky, consume_from=FIRST, allocate=CIRCLE,
                      reconsume_delay_ms=50, send_back=False, **FAST) as c:
        wait_until(lambda: len(done.bodies) == 16)
        assert len(c.assigned_queues()) == 8
    assert attempts[b"3"] == 3 and sorted(done.bodies, key=int) == [str(i).encode() for i in range(16)]


def test_broadcasting_delivers_everything_to_every_consumer(
    broker: BrokerController, endpoint: str, tmp_path: Path
) -> None:
    sinks = [BodyRecorder(), BodyRecorder()]
    consumers = [
        PushConsumer(endpoint, "bg", {"Bc": "*"}, s, model=BROADCASTING, consume_from=FIRST,
                     offset_store_path=tmp_path / f"off{i}.json", **FAST).start()
        for i, s in enumerate(sinks)
    ]
    try:
        send(endpoint, "Bc", 0, 80)
        wait_until(lambda: all(len(s.bodies) == 80 for s in sinks))
        assert all(len(c.assigned_queues()) == 8 for c in consumers)
    finally:
        for c in consumers:
            c.shutdown()
    assert all(sorted(s.bodies, key=int) == [str(i).encode() for i in range(80)] for s in sinks)
    assert (tmp_path / "off0.json").exists()
    again = BodyRecorder()  # a restarted broadcasting consumer resumes from its local offsets
    send(endpoint, "Bc", 80, 8)
    with PushConsumer(endpoint, "bg", {"Bc": "*"}, again, model=BROADCASTING, consume_from=FIRST,
                      offset_store_path=tmp_path / "off0.json", **FAST):
        wait_until(lambda: len(again.bodies) == 8)
    assert sorted(again.bodies, key=int) == [str(i).encode() for i in range(80, 88)]


def test_consume_from_last_and_timestamp_and_tag_filter(broker: BrokerController, endpoint: str) -> None:
    send(endpoint, "From", 0, 16)
    time.sleep(0.05)
    cut_ms = int(time.time() * 1000)
    time.sleep(0.05)
    send(endpoint, "From", 16, 16)
    late, by_time, tagged = BodyRecorder(), BodyRecorder(), BodyRecorder()
    with PushConsumer(endpoint, "last", {"From": "*"}, late, consume_from=LAST, **FAST) as c:
        # every queue assigned and its start resolved to LAST (4 messages in each of the 8) before the next sends
        at_last = {("From", q): 4 for q in range(8)}
        wait_until(lambda: {k: v for k, v in c.offsets.offsets().items() if k[0] == "From"} == at_last)
        send(endpoint, "From", 32, 8)
        wait_until(lambda: len(late.bodies) == 8)
    assert sorted(late.bodies, key=int) == [str(i).encode() for i in range(32, 40)]
    with PushConsumer(endpoint, "ts", {"From": "*"}, by_time, consume_from=TIMESTAMP, consume_timestamp_ms=cut_ms,
                      **FAST):
        wait_until(lambda: len(by_time.bodies) == 24)
    assert sorted(by_time.bodies, key=int) == [str(i).encode() for i in range(16, 40)]
    with Producer(endpoint) as p:
        p.send_batch([Message("Tagged", f"{i}".encode(), tags="A" if i % 2 else "B") for i in range(10)], queue_id=0)
    with PushConsumer(endpoint, "tg", {"Tagged": "A"}, tagged, consume_from=FIRST, **FAST):
        wait_until(lambda: len(tagged.bodies) == 5)
    assert sorted(tagged.bodies) == [b"1", b"3", b"5", b"7", b"9"]


@pytest.mark.parametrize(
    ("setting", "value"),
    [("long_poll_ms", 0), ("long_poll_ms", -1), ("pull_batch_size", 0), ("heartbeat_interval_ms", -5),
     ("reconsume_delay_ms", -1), ("lock_max_live_ms", 0)],
)
def test_settings_that_cannot_work_are_refused(setting: str, value: int) -> None:
    """long_poll_ms=0 pulled in a busy loop; a negative one had every pull refused while the consumer, started
    without complaint, logged a retry every 3 s and consumed nothing."""
    with pytest.raises(InvalidArgumentError, match=setting):
        PushConsumer("127.0.0.1:1", "g", {"T": "*"}, lambda msgs: True, **{setting: value})


def test_a_queue_pulled_ahead_of_its_listener_arrives_in_order_once_with_every_field(
    broker: BrokerController, endpoint: str
) -> None:
    # The next pull goes out before the listener has the current batch (push_worker._pull_ahead): each message
    # still comes once, in queue order, with its fields decoded, and the group's offset reaches the queue's end.
    with Admin(endpoint) as admin:
        admin.create_topic("Ahead", 1)
    with Producer(endpoint) as p:
        for start in range(0, 600, 200):
            p.send_batch([Message("Ahead", f"{i}".encode(), tags=f"t{i % 3}", keys=[f"k{i}"]) for i in
                          range(start, start + 200)], queue_id=0)
    seen: list[tuple[int, bytes, str | None, list[str], str]] = []

    def listener(msgs: list[ReceivedMessage]) -> None:
        time.sleep(0.01)  # a listener that works: the next answer is on its way meanwhile
        seen.extend((m.queue_offset, m.body, m.tags, m.keys, m.msg_id) for m in msgs)

    options = {**FAST, "pull_batch_size": 64, "consume_batch_size": 16}
    with PushConsumer(endpoint, "ahead", {"Ahead": "*"}, listener, consume_from=FIRST, **options) as c:
        wait_until(lambda: len(seen) >= 600)
        wait_until(lambda: c.offsets.offsets().get(("Ahead", 0)) == 600)
    assert [s[0] for s in seen] == list(range(600))
    assert [s[1] for s in seen] == [f"{i}".encode() for i in range(600)]
    assert all(tags == f"t{i % 3}" and keys == [f"k{i}"] and len(msg_id) == 32 for i, (_, _, tags, keys, msg_id)
               in enumerate(seen))
    with Admin(endpoint) as admin:
        assert sum(x.lag for x in admin.consumer_lag("ahead", "Ahead")) == 0
