"""Every pull status, offset correction, tag filtering, long polling, and commit offsets carried by pulls."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from broker.client import Admin, Message, Producer, PullConsumer, PullStatus
from broker.client.results import PullResult
from broker.errors import SubscriptionGroupNotExistError
from broker.proto import sluice_pb2 as pb
from broker.server.broker_controller import BrokerController
from broker.server.pull_processor import PullRequestArgs


def fill(broker: BrokerController, topic: str, n: int, queue_id: int = 0, tags: str | None = None) -> None:
    """Send, then wait until the dispatcher made the messages visible to pulls (it runs just after the send)."""
    with Producer(f"127.0.0.1:{broker.port}") as p:
        p.send_batch([Message(topic, f"m{i}".encode(), tags=tags) for i in range(n)], queue_id=queue_id)
    assert broker.store is not None and broker.store.wait_dispatched()


def test_every_pull_status(broker: BrokerController, endpoint: str) -> None:
    with Admin(endpoint) as admin:
        admin.create_topic("S", 2)
    fill(broker, "S", 10)
    with PullConsumer(endpoint, "g") as c:
        r = c.pull("S", 0, 0, max_msgs=4)
        assert (r.status, len(r.messages), r.next_begin_offset, r.min_offset, r.max_offset) == (
            PullStatus.FOUND, 4, 4, 0, 10)
        r = c.pull("S", 0, 10)  # at the end: nothing new
        assert (r.status, r.next_begin_offset, r.max_offset) == (PullStatus.NO_NEW_MSG, 10, 10)
        r = c.pull("S", 1, 0)  # empty queue at offset 0
        assert (r.status, r.next_begin_offset) == (PullStatus.NO_NEW_MSG, 0)
        r = c.pull("S", 1, 5)  # empty queue, offset beyond it
        assert (r.status, r.next_begin_offset) == (PullStatus.OFFSET_ILLEGAL, 0)
        r = c.pull("S", 0, 1_000_000)  # far past the end: corrected to max, never rewound to 0
        assert (r.status, r.next_begin_offset) == (PullStatus.OFFSET_ILLEGAL, 10)
        r = c.pull("S", 0, 11)
        assert (r.status, r.next_begin_offset) == (PullStatus.OFFSET_ILLEGAL, 10)


def test_tag_filter_hash_on_broker_exact_in_client(broker: BrokerController, endpoint: str) -> None:
    fill(broker, "Tags", 5, tags="TagB")
    fill(broker, "Tags", 3, tags="TagA")
    with PullConsumer(endpoint, "g") as c:
        r = c.pull("Tags", 0, 0, max_msgs=5, tags="TagA || TagC")
        assert r.status is PullStatus.NO_MATCHED_MSG and r.next_begin_offset == 5 and r.messages == []
        r = c.pull("Tags", 0, r.next_begin_offset, tags="TagA || TagC")
        assert r.status is PullStatus.FOUND and [m.tags for m in r.messages] == ["TagA"] * 3
        r = c.pull("Tags", 0, 0, max_msgs=100, tags="*")
        assert len(r.messages) == 8


def test_long_poll_wakes_on_arrival_and_not_before(broker: BrokerController, endpoint: str) -> None:
    fill(broker, "LP", 2)
    results: list[tuple[float, PullResult]] = []
    with PullConsumer(endpoint, "g") as c:

        def held_pull() -> None:
            started = time.monotonic()
            r = c.pull("LP", 0, 2, timeout_ms=10_000)
            results.append((time.monotonic() - started, r))

        t = threading.Thread(target=held_pull)
        t.start()
        time.sleep(0.5)
        assert t.is_alive() and not results, "a held pull answered before any message arrived"
        sent_at = time.monotonic()
        fill(broker, "LP", 1)
        t.join(5)
        woke_after = time.monotonic() - sent_at
    waited, r = results[0]
    assert r.status is PullStatus.FOUND and [m.body for m in r.messages] == [b"m0"]
    assert waited >= 0.5 and woke_after < 2.0, (waited, woke_after)  # a 10 s hold, woken at once


def test_long_poll_times_out_with_no_new_msg(broker: BrokerController, endpoint: str) -> None:
    fill(broker, "LPT", 1)
    with PullConsumer(endpoint, "g") as c:
        started = time.monotonic()
        r = c.pull("LPT", 0, 1, timeout_ms=300)
        waited = time.monotonic() - started
    assert r.status is PullStatus.NO_NEW_MSG and 0.25 < waited < 3


def test_pull_carries_commit_offset(broker: BrokerController, endpoint: str) -> None:
    fill(broker, "C", 5)
    with PullConsumer(endpoint, "cg") as c:
        assert c.committed_offsets("C") == {}
        c.pull("C", 0, 3, commit_offset=3)
        assert c.committed_offsets("C") == {0: 3}
        c.commit_offsets({("C", 0): 5, ("C", 1): 0})
        assert c.committed_offsets("C") == {0: 5, 1: 0}


def test_expired_offset_is_illegal_and_moves_to_min(broker_factory: Callable[..., BrokerController]) -> None:
    small = {"mapped_file_size_commit_log": 64 * 1024, "max_message_size": 16 * 1024, "file_reserved_time_hours": 0}
    broker = broker_factory(store=small)
    with Producer(f"127.0.0.1:{broker.port}") as p:
        for _ in range(8):  # ~7 commit-log files of 64 KiB
            p.send_batch([Message("Exp", b"e" * 1000) for _ in range(50)], queue_id=0)
    store = broker.store
    assert store is not None and store.wait_dispatched()
    store.flush()
    assert store.cleanup is not None and store.cleanup.clean_once(manual=True).deleted_commit_log_files > 0
    with PullConsumer(f"127.0.0.1:{broker.port}", "g") as c:
        r = c.pull("Exp", 0, 0)
        assert r.status is PullStatus.OFFSET_ILLEGAL and r.next_begin_offset == r.min_offset > 0
        r = c.pull("Exp", 0, r.next_begin_offset)
        assert r.status is PullStatus.FOUND and r.messages[0].queue_offset == r.next_begin_offset - len(r.messages)


def test_data_expired_before_cleanup_moved_the_minimum_is_illegal_not_skipped(
    broker_factory: Callable[..., BrokerController],
) -> None:
    """Between a file's expiry and cleanup's correction of the queue minimum, a pull met units without entries
    (skipped: NO_MATCHED_MSG or inside FOUND) or no consume-queue file (NO_MATCHED_MSG): the consumer moved on
    without being told, and a Spark source with failOnDataLoss=true lost data without failing. Both are now
    OFFSET_ILLEGAL whose min offset is where readable units begin."""
    small = {"mapped_file_size_commit_log": 64 * 1024, "max_message_size": 16 * 1024,
             "mapped_file_size_consume_queue": 100 * 20}
    broker = broker_factory(store=small)
    with Producer(f"127.0.0.1:{broker.port}") as p:
        for _ in range(8):  # ~7 commit-log files, 4 consume-queue files
            p.send_batch([Message("Win", b"w" * 1000) for _ in range(50)], queue_id=0)
    store = broker.store
    assert store is not None and store.wait_dispatched()
    store.flush()
    store.commit_log.files.delete_first(2)  # expired, as cleanup deletes, before it corrects the queue
    cq = store.queues.find("Win", 0)
    assert cq is not None and store.min_offset("Win", 0) == 0
    with PullConsumer(f"127.0.0.1:{broker.port}", "g") as c:
        at, lost = 0, 0
        while (r := c.pull("Win", 0, at, max_msgs=32)).status is PullStatus.OFFSET_ILLEGAL:
            assert r.next_begin_offset == r.min_offset > at
            lost, at = lost + r.next_begin_offset - at, r.next_begin_offset
        assert r.status is PullStatus.FOUND and r.messages[0].queue_offset == at == lost > 0
        assert cq.unit(at - 1).commitlog_offset < store.min_phys_offset() <= cq.unit(at).commitlog_offset  # type: ignore[union-attr]
        cq.files.delete_first(1)  # the first consume-queue file goes too: OFFSET_FOUND_NULL in the store
        r = c.pull("Win", 0, 5)
        assert (r.status, r.next_begin_offset, r.min_offset) == (PullStatus.OFFSET_ILLEGAL, 100, 100)
    cq.correct_min_offset(store.min_phys_offset())  # what cleanup does next: the window closes
    assert store.min_offset("Win", 0) == at


@pytest.mark.parametrize("long_polling", [True, False])
def test_held_pulls_never_take_the_workers_sends_need(
    broker_factory: Callable[..., BrokerController], long_polling: bool
) -> None:
    """Short polling too: its held pulls registered no waiter, so the budget saw none and pulls took every
    worker (a send waited seconds)."""
    broker = broker_factory(grpc_max_workers=6, grpc_reserved_workers=4,  # at most 2 held pulls
                            long_polling_enable=long_polling, short_polling_time_ms=200)
    ep = f"127.0.0.1:{broker.port}"
    fill(broker, "Busy", 1)
    results: list[PullStatus] = []
    with PullConsumer(ep, "g") as c:
        holders = [threading.Thread(target=lambda: results.append(c.pull("Busy", 0, 1, timeout_ms=10_000).status))
                   for _ in range(2)]
        for t in holders:
            t.start()
        deadline = time.monotonic() + 5
        while broker.hold.held_count() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        started = time.monotonic()
        r = c.pull("Busy", 0, 1, timeout_ms=10_000)  # over the budget: answered at once, not held 10 s
        assert r.status is PullStatus.NO_NEW_MSG and time.monotonic() - started < 3.0
        fill(broker, "Busy", 1)  # sends still find a worker, and wake the held pulls
        for t in holders:
            t.join(5)
    assert results == [PullStatus.FOUND, PullStatus.FOUND]


def test_tag_hash_collisions_are_dropped_by_the_client(broker: BrokerController, endpoint: str) -> None:
    fill(broker, "Coll", 2, tags="BB")  # String.hashCode("BB") == String.hashCode("Aa")
    fill(broker, "Coll", 1, tags="Aa")
    with PullConsumer(endpoint, "g") as c:
        raw = c.pull_raw("Coll", 0, 0, tags="Aa")
        assert len(raw.entry_positions) == 3  # the broker's hash filter lets the collisions through
        r = c.pull("Coll", 0, 0, max_msgs=2, tags="Aa")
        assert r.status is PullStatus.NO_MATCHED_MSG and r.messages == [] and r.next_begin_offset == 2
        r = c.pull("Coll", 0, 0, tags="Aa")
        assert [m.tags for m in r.messages] == ["Aa"]


def test_pull_right_after_send_waits_for_the_dispatcher(broker: BrokerController, endpoint: str) -> None:
    """An offset a send just returned is past the consume queue's end until the dispatcher catches up; the
    broker waits for it instead of answering OFFSET_ILLEGAL (which would send the consumer back to the max)."""
    with Producer(endpoint) as p, PullConsumer(endpoint, "g") as c:
        for i in range(50):
            sent = p.send(Message("Fresh", f"{i}".encode()), queue_id=0)
            r = c.pull("Fresh", 0, sent.queue_offset)
            assert r.status is PullStatus.FOUND and r.messages[0].body == f"{i}".encode(), (i, r.status)


def test_a_pull_right_after_the_first_sends_to_a_queue_waits_for_the_dispatcher(
    broker: BrokerController, endpoint: str
) -> None:
    """Until the dispatcher writes a queue's first units the store has no such queue (NO_MESSAGE_IN_QUEUE): a pull
    at an offset a send just returned waits for it too, rather than send the consumer back to 0 (it would read
    message 0 twice)."""
    results: list[PullResult] = []
    with Producer(endpoint) as p, PullConsumer(endpoint, "g") as c:
        with broker.store.dispatcher.lock:  # the dispatcher is behind the sends
            sent = p.send_batch([Message("New", b"a"), Message("New", b"b")], queue_id=0)
            assert [s.queue_offset for s in sent] == [0, 1]
            puller = threading.Thread(target=lambda: results.append(c.pull("New", 0, 1)))
            puller.start()
            deadline = time.monotonic() + 10
            while broker.hold.held_count() == 0 and puller.is_alive():  # until it waits for the dispatcher
                assert time.monotonic() < deadline, "the pull neither waited nor answered"
                time.sleep(0.005)
        puller.join(10)
    (r,) = results
    assert r.status is PullStatus.FOUND and [m.body for m in r.messages] == [b"b"], (r.status, r.next_begin_offset)


def test_a_pull_without_commit_offset_leaves_the_committed_offset(broker: BrokerController) -> None:
    """commit_offset is optional on the wire: a client that leaves it out (proto3 reads an unset int64 as 0)
    rewound the group's committed offset to 0, so the group re-consumed the queue after a restart."""
    endpoint = f"127.0.0.1:{broker.port}"
    fill(broker, "Keep", 10)
    with PullConsumer(endpoint, "kg") as c:
        c.commit_offsets({("Keep", 0): 10})
        request = pb.PullRequest(consumer_group="kg", topic="Keep", queue_id=0, queue_offset=5, max_msgs=2)
        assert c.conn.stub.PullMessage(request).status == pb.PullStatus.FOUND
        assert c.committed_offsets("Keep") == {0: 10}
        request.commit_offset = 7  # set: stored first, as before
        c.conn.stub.PullMessage(request)
        assert c.committed_offsets("Keep") == {0: 7}


def test_unknown_groups_are_refused_when_groups_are_not_auto_created(
    broker_factory: Callable[..., BrokerController],
) -> None:
    """With auto_create_subscription_group=false only heartbeats refused an unknown group: its pulls were served
    and its offsets committed. Now every path refuses it (SUBSCRIPTION_GROUP_NOT_EXIST), as RocketMQ does."""
    broker = broker_factory(auto_create_subscription_group=False)
    endpoint = f"127.0.0.1:{broker.port}"
    fill(broker, "Strict", 3)
    with PullConsumer(endpoint, "unknown") as c:
        with pytest.raises(SubscriptionGroupNotExistError, match="unknown"):
            c.pull("Strict", 0, 0)
        with pytest.raises(SubscriptionGroupNotExistError):
            c.commit_offsets({("Strict", 0): 1})
    with Admin(endpoint) as admin:
        admin.update_subscription_group("known")
    with PullConsumer(endpoint, "known") as c:
        assert c.pull("Strict", 0, 0).status is PullStatus.FOUND
        c.commit_offsets({("Strict", 0): 2})
        assert c.committed_offsets("Strict") == {0: 2}


def test_a_cancelled_pull_is_not_held_on(broker: BrokerController, endpoint: str) -> None:
    """A consumer that shuts down or drops a queue cancels its held pull; the broker kept holding it (a worker
    thread and a held-pull slot) until its suspend time ran out."""
    fill(broker, "Cancel", 1)
    with PullConsumer(endpoint, "g") as c:
        request = pb.PullRequest(consumer_group="g", topic="Cancel", queue_id=0, queue_offset=1,
                                 suspend_timeout_ms=20_000)
        call = c.conn.stub.PullMessage.future(request, timeout=30)
        deadline = time.monotonic() + 5
        while broker.hold.held_count() < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert broker.hold.held_count() == 1
        call.cancel()
        deadline = time.monotonic() + 2
        while broker.hold.held_count() > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert broker.hold.held_count() == 0  # within 2 s, not 20


def test_a_pull_cancelled_before_its_hold_is_not_held(broker: BrokerController) -> None:
    """gRPC refuses a call-end callback once the call has ended (cancelled while the pull was validated or its
    group created): that refusal was ignored and the pull held its worker for the whole suspend time."""
    fill(broker, "Early", 1)
    pulls = broker.admin.pulls
    started = time.monotonic()
    out = pulls.pull(PullRequestArgs("g", "Early", 0, 1, suspend_timeout_ms=10_000), 30.0, lambda fn: False)
    assert out.status == "NO_NEW_MSG" and time.monotonic() - started < 3.0  # not held the 10 s suspend time
