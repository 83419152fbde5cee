"""Consumers never read past the group's confirmed offset, on the master or on a slave.

An entry the master wrote but not every in-sync replica holds yet may still be lost in a failover (the new master
may not have it): a consumer that read it would have seen a message that then never existed, and a later message
could take its queue offset. So the store shows readers only entries ending at or below the confirmed offset
(MessageStore.read_limit: pulls, GetQueueOffsets, lag, offset commits, queries and lookups by id all go through
it). On the master the confirmed offset is in_sync.InSyncSet's; a slave learns it from its master's chunks and
heartbeats, and never shows more than it holds itself.

Held pulls: the dispatcher tells listeners (long polling) of new units as it writes them, when they may still be
invisible. ``ReadLimit.listener`` passes a notice on only once the units are visible; the others are kept (one
entry per queue) and passed on when the confirmed offset moves past them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from broker.store.dispatcher import ArrivalListener
from broker.store.message_store import MessageStore


class ReadLimit:
    def __init__(self, store: MessageStore, downstream: ArrivalListener) -> None:
        self.store = store
        self.downstream = downstream
        self._confirmed = 0
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, int], int] = {}  # queue -> max offset a notice named, not yet visible
        self.source: Callable[[], int] | None = None  # the master's in-sync set, when this broker is master
        # The master's "the log grew" (InSyncSet.log_grew), told of every dispatched write: with no replica to wait
        # for, the confirmed offset is the log's end, and writes the broker makes itself (timer and delay
        # deliveries, transaction results) pass no request handler that would move it.
        self.grew: Callable[[], None] | None = None

    def install(self) -> None:
        self.store.read_limit = self.confirmed_offset
        self.store.add_arrival_listener(self.listener)

    def confirmed_offset(self) -> int:
        source = self.source
        value = source() if source is not None else self._confirmed
        return min(value, self.store.max_phys_offset())

    def set_confirmed(self, offset: int) -> None:
        """A slave's update from its master (never backwards)."""
        if offset > self._confirmed:
            self._confirmed = offset
            self.advanced()

    def listener(self, topic: str, queue_id: int, max_offset: int) -> None:
        grew = self.grew
        if grew is not None:
            grew()
        if self.store.max_offset(topic, queue_id) >= max_offset:
            self.downstream(topic, queue_id, max_offset)
            return
        with self._lock:
            key = (topic, queue_id)
            self._pending[key] = max(self._pending.get(key, 0), max_offset)

    def advanced(self) -> None:
        """The confirmed offset moved: pass on the notices it made visible."""
        if not self._pending:
            return
        with self._lock:
            pending = list(self._pending.items())
        for (topic, queue_id), wanted in pending:
            visible = self.store.max_offset(topic, queue_id)
            if visible <= 0:
                continue
            self.downstream(topic, queue_id, visible)
            if visible >= wanted:
                with self._lock:
                    if self._pending.get((topic, queue_id)) == wanted:
                        del self._pending[(topic, queue_id)]
