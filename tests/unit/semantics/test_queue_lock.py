"""Orderly-consumption queue locks: exclusive per group, renewed by relocking, expired after 60 s."""

from __future__ import annotations

import threading

import pytest

from broker.errors import InvalidArgumentError
from broker.semantics.queue_lock import QueueLockManager


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000.0

    def __call__(self) -> float:
        return self.now_ms


def test_lock_is_exclusive_per_group_and_renewable() -> None:
    clock = Clock()
    locks = QueueLockManager(clock_ms=clock)
    queues = [("T", 0), ("T", 1), ("T", 2)]
    assert locks.lock_batch("G", queues, "c1") == set(queues)
    assert locks.lock_batch("G", [("T", 1), ("T", 3)], "c2") == {("T", 3)}
    assert locks.lock_batch("OTHER", [("T", 1)], "c2") == {("T", 1)}  # another group is independent
    assert locks.owner("G", "T", 1) == "c1"
    assert locks.is_locked("G", "T", 3, "c2") and not locks.is_locked("G", "T", 3, "c1")
    clock.now_ms += 50_000
    assert locks.lock_batch("G", queues, "c1") == set(queues)  # renewal by the holder
    clock.now_ms += 50_000
    assert locks.lock_batch("G", [("T", 0)], "c2") == set()  # 50 s since renewal: still held
    assert locks.locked_queues("G") == {("T", 0): "c1", ("T", 1): "c1", ("T", 2): "c1"}  # c2's lock on 3 expired


def test_lock_expires_after_60_s_without_renewal() -> None:
    clock = Clock()
    locks = QueueLockManager(clock_ms=clock)
    assert locks.try_lock("G", "T", 0, "c1")
    clock.now_ms += 60_000
    assert not locks.try_lock("G", "T", 0, "c2")  # exactly 60 s: still alive
    clock.now_ms += 1
    assert locks.owner("G", "T", 0) is None
    assert locks.try_lock("G", "T", 0, "c2")
    assert locks.owner("G", "T", 0) == "c2"


def test_unlock_only_releases_own_locks() -> None:
    locks = QueueLockManager()
    locks.lock_batch("G", [("T", 0), ("T", 1)], "c1")
    assert locks.unlock_batch("G", [("T", 0), ("T", 1)], "c2") == set()
    assert locks.owner("G", "T", 0) == "c1"
    assert locks.unlock_batch("G", [("T", 0)], "c1") == {("T", 0)}
    assert locks.try_lock("G", "T", 0, "c2")
    assert locks.unlock_client("G", "c1") == 1
    assert locks.locked_queues("G") == {("T", 0): "c2"}


def test_bad_requests_are_refused() -> None:
    locks = QueueLockManager()
    with pytest.raises(InvalidArgumentError):
        locks.lock_batch("", [("T", 0)], "c1")
    with pytest.raises(InvalidArgumentError):
        locks.lock_batch("G", [("T", i) for i in range(5000)], "c1")
    with pytest.raises(InvalidArgumentError):
        QueueLockManager(lock_max_live_ms=0)


def test_concurrent_lockers_never_share_a_queue() -> None:
    locks = QueueLockManager()
    queues = [("T", i) for i in range(16)]
    won: dict[str, set[tuple[str, int]]] = {}

    def grab(client: str) -> None:
        won[client] = locks.lock_batch("G", queues, client)

    threads = [threading.Thread(target=grab, args=(f"c{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    owners = [c for c, qs in won.items() for _ in qs]
    assert sum(len(qs) for qs in won.values()) == 16, won
    assert len(owners) == 16
    assert all(locks.owner("G", t, q) in won and (t, q) in won[locks.owner("G", t, q) or ""] for t, q in queues)
