"""Visibility holds: units dispatched under a hold are unseen until it is released, then seen in every queue at once."""

from __future__ import annotations

import os
import threading

import pytest

from broker.errors import MessageIllegalError
from broker.format.batch import MAX_QUEUE_ID
from broker.format.message import encode_entry
from broker.store import GetStatus, MessageStore


def _batch(topic: bytes, queues: range, per_queue: int) -> bytes:
    return b"".join(encode_entry(topic, q, b"q%d-%d" % (q, i)) for q in queues for i in range(per_queue))


def test_a_hold_hides_new_units_until_released(store: MessageStore) -> None:
    assert store.put_batch(_batch(b"H", range(3), 2)).ok
    assert store.wait_dispatched()
    woken: list[tuple[str, int, int]] = []
    store.add_arrival_listener(lambda t, q, m: woken.append((t, q, m)) if t == "H" else None)
    hold = store.hold_visibility([("H", 0), ("H", 1), ("H", 2)])
    for _ in range(3):  # several puts and dispatch passes, as a commit makes
        assert store.put_batch(_batch(b"H", range(3), 5)).ok
        assert store.wait_dispatched()
    assert [store.max_offset("H", q) for q in range(3)] == [2, 2, 2]
    assert [store.queues.queues[("H", q)].written_offset for q in range(3)] == [17, 17, 17]
    assert store.get_message("g", "H", 1, 2).status is GetStatus.OFFSET_OVERFLOW_ONE
    assert not any(m > 2 for _, _, m in woken)  # nobody was woken for what they cannot read
    assert store.queue_ranges("H", range(3)) == [(0, 0, 2), (1, 0, 2), (2, 0, 2)]
    store.release_visibility(hold)
    assert store.queue_ranges("H", range(3)) == [(0, 0, 17), (1, 0, 17), (2, 0, 17)]
    assert {(q, m) for _, q, m in woken if m == 17} == {(0, 17), (1, 17), (2, 17)}
    got = store.get_message("g", "H", 2, 2, max_msgs=100)
    assert got.status is GetStatus.FOUND and got.queue_offsets[:3] == [2, 3, 4]
    assert store.check() == []


def test_other_queues_are_not_held(store: MessageStore) -> None:
    hold = store.hold_visibility([("H", 0)])
    assert store.put_batch(_batch(b"H", range(2), 3)).ok
    assert store.wait_dispatched()
    assert (store.max_offset("H", 0), store.max_offset("H", 1)) == (0, 3)
    store.release_visibility(hold)
    assert store.max_offset("H", 0) == 3


def test_overlapping_holds_show_nothing_until_both_are_released(store: MessageStore) -> None:
    first = store.hold_visibility([("H", 0)])
    assert store.put_batch(_batch(b"H", range(1), 2)).ok
    assert store.wait_dispatched()
    second = store.hold_visibility([("H", 0)])
    assert store.put_batch(_batch(b"H", range(1), 3)).ok
    assert store.wait_dispatched()
    assert store.max_offset("H", 0) == 0
    store.release_visibility(second)
    assert store.max_offset("H", 0) == 0  # the older hold still hides its units, and so what follows them
    store.release_visibility(first)
    assert store.max_offset("H", 0) == 5


def test_max_offset_never_goes_back_while_holds_come_and_go(store: MessageStore) -> None:
    """A reader must never see a queue shrink (it would re-read what it had consumed): holds are placed between
    dispatch passes, at an offset readers have already seen."""
    stop = threading.Event()
    errors: list[str] = []

    def reader() -> None:
        last = 0
        while not stop.is_set():
            now = store.max_offset("H", 0)
            if now < last:
                errors.append(f"max offset went from {last} to {now}")
            last = now

    t = threading.Thread(target=reader)
    t.start()
    try:
        for _ in range(30):
            hold = store.hold_visibility([("H", 0)])
            assert store.put_batch(_batch(b"H", range(1), 4)).ok
            store.release_visibility(hold)
            assert store.put_batch(_batch(b"H", range(1), 2)).ok
    finally:
        stop.set()
        t.join()
    assert store.wait_dispatched()
    assert errors == [] and store.max_offset("H", 0) == 180


def test_a_hold_on_a_queue_that_does_not_exist_yet(store: MessageStore) -> None:
    """A commit's first messages to a new topic: the queue is created held, so its first units are hidden too; a
    hold released before anything was written leaves an empty queue that check() accepts."""
    hold = store.hold_visibility([("Fresh", 0), ("Never", 0)])
    assert store.put_batch(_batch(b"Fresh", range(1), 3)).ok
    assert store.wait_dispatched()
    assert store.max_offset("Fresh", 0) == 0
    store.release_visibility(hold)
    assert (store.max_offset("Fresh", 0), store.max_offset("Never", 0)) == (3, 0)
    assert store.check() == []


@pytest.mark.parametrize("topic", ["../config", "../../outside", "a/b", "T\n", ""])
def test_topics_that_are_not_names_never_become_paths(store: MessageStore, topic: str) -> None:
    """delete_topic("../config") removed the store's config directory; hold_visibility created queue directories
    outside the store."""
    os.makedirs(store.config.config_dir, exist_ok=True)
    outside = os.path.join(os.path.dirname(store.config.store_path), "outside")
    with pytest.raises(MessageIllegalError, match="topic"):
        store.delete_topic(topic)
    with pytest.raises(MessageIllegalError, match="topic"):
        store.hold_visibility([("H", 0), (topic, 0)])
    assert os.path.isdir(store.config.config_dir) and not os.path.exists(outside)
    assert store.topics() == [] and os.listdir(store.config.consume_queue_dir) == []


@pytest.mark.parametrize("queue_id", [-5, MAX_QUEUE_ID])
def test_a_hold_on_a_queue_id_out_of_range_is_refused(store: MessageStore, queue_id: int) -> None:
    with pytest.raises(MessageIllegalError, match=f"queue id {queue_id} of topic 'H' is outside"):
        store.hold_visibility([("H", queue_id)])
    assert store.topics() == [] and os.listdir(store.config.consume_queue_dir) == []
    store.release_visibility(store.hold_visibility([("H", 0)]))
    assert store.check() == []
