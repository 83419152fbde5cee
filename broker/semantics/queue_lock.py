"""Queue locks for orderly consumption: RocketMQ's ``RebalanceLockManager``.

A consumer in orderly mode locks each queue it was allocated before consuming it, so that during a rebalance two
consumers of a group never consume one queue at once. A lock belongs to (group, topic, queue id) and is held by
one client id; it expires ``lock_max_live_ms`` (60 s, RocketMQ's ``rocketmq.broker.rebalance.lockMaxLiveTime``)
after its last renewal. Clients renew by locking again (RocketMQ's client does it every 20 s).

Server wiring (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ)::

    locks = QueueLockManager()
    granted = locks.lock_batch(group, [(topic, qid), ...], client_id)   # the queues this client now holds
    locks.unlock_batch(group, [(topic, qid), ...], client_id)
    locks.unlock_client(group, client_id)                              # when the client's connection goes away

Locks live in memory only, as in RocketMQ: after a broker restart every queue is free and clients re-lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from broker.errors import InvalidArgumentError
from broker.format.lock_lease import DEFAULT_LOCK_MAX_LIVE_MS

MAX_QUEUES_PER_REQUEST = 4096  # a lock batch is answered under one mutex: bound its size

Queue = tuple[str, int]  # (topic, queue id)


@dataclass
class _LockEntry:
    client_id: str
    last_update_ms: float


class QueueLockManager:
    """Thread-safe; one mutex (lock requests are rare and tiny)."""

    def __init__(
        self, lock_max_live_ms: int = DEFAULT_LOCK_MAX_LIVE_MS, clock_ms: Callable[[], float] | None = None
    ) -> None:
        if lock_max_live_ms <= 0:
            raise InvalidArgumentError(f"lock_max_live_ms={lock_max_live_ms}: must be positive")
        self.lock_max_live_ms = lock_max_live_ms
        self._clock_ms = clock_ms or (lambda: time.monotonic() * 1000)
        self._mutex = threading.Lock()
        self._tables: dict[str, dict[Queue, _LockEntry]] = {}

    def _expired(self, entry: _LockEntry, now: float) -> bool:
        return now - entry.last_update_ms > self.lock_max_live_ms

    @staticmethod
    def _check(group: str, client_id: str, queues: list[Queue]) -> None:
        if not group or not client_id:
            raise InvalidArgumentError("queue lock: group and client id must not be empty")
        if len(queues) > MAX_QUEUES_PER_REQUEST:
            raise InvalidArgumentError(
                f"queue lock: {len(queues)} queues in one request; at most {MAX_QUEUES_PER_REQUEST}"
            )

    def lock_batch(self, group: str, queues: Iterable[Queue], client_id: str) -> set[Queue]:
        """Lock (or renew) every queue that is free, expired, or already this client's; return those held now."""
        wanted = list(queues)
        self._check(group, client_id, wanted)
        now = self._clock_ms()
        granted: set[Queue] = set()
        with self._mutex:
            table = self._tables.setdefault(group, {})
            for q in wanted:
                entry = table.get(q)
                if entry is None or entry.client_id == client_id or self._expired(entry, now):
                    table[q] = _LockEntry(client_id, now)
                    granted.add(q)
        return granted

    def try_lock(self, group: str, topic: str, queue_id: int, client_id: str) -> bool:
        return (topic, queue_id) in self.lock_batch(group, [(topic, queue_id)], client_id)

    def unlock_batch(self, group: str, queues: Iterable[Queue], client_id: str) -> set[Queue]:
        """Release the queues this client holds; locks of other clients are left alone. Returns those released."""
        given = list(queues)
        self._check(group, client_id, given)
        released: set[Queue] = set()
        with self._mutex:
            table = self._tables.get(group, {})
            for q in given:
                entry = table.get(q)
                if entry is not None and entry.client_id == client_id:
                    del table[q]
                    released.add(q)
        return released

    def unlock_client(self, group: str, client_id: str) -> int:
        """Release every lock the client holds in the group (it went away); returns how many."""
        with self._mutex:
            table = self._tables.get(group, {})
            mine = [q for q, e in table.items() if e.client_id == client_id]
            for q in mine:
                del table[q]
        return len(mine)

    def is_locked(self, group: str, topic: str, queue_id: int, client_id: str) -> bool:
        """Whether this client holds a live lock on the queue (does not renew it)."""
        return self.owner(group, topic, queue_id) == client_id

    def owner(self, group: str, topic: str, queue_id: int) -> str | None:
        now = self._clock_ms()
        with self._mutex:
            entry = self._tables.get(group, {}).get((topic, queue_id))
            return None if entry is None or self._expired(entry, now) else entry.client_id

    def locked_queues(self, group: str) -> dict[Queue, str]:
        """Live locks of a group: queue -> client id. Expired entries are dropped on the way."""
        now = self._clock_ms()
        with self._mutex:
            table = self._tables.get(group, {})
            for q in [q for q, e in table.items() if self._expired(e, now)]:
                del table[q]
            return {q: e.client_id for q, e in table.items()}
