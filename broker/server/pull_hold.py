"""Long polling: pulls that found nothing wait here until the dispatcher reports a new message for their queue.

RocketMQ can leave a pull asleep for its whole 5 s re-check when the message lands between "found nothing" and
"suspended" (apache/rocketmq 7358). Here a waiter is registered first and the queue re-checked after, so an
arrival either happens before the re-check (seen by it) or after the registration (wakes the waiter).
``wait_for`` does both steps; the caller's re-check is its ``has_new`` callback.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Waiter:
    offset: int  # the pull wants a message at this queue offset: woken once max offset > offset
    event: threading.Event = field(default_factory=threading.Event)


class _CallingEvent(threading.Event):
    """An event that also calls a function when set: a watched pull (``PullHoldService.watch``)."""

    def __init__(self, on_set: Callable[[], None]) -> None:
        super().__init__()
        self._on_set = on_set

    def set(self) -> None:
        super().set()
        self._on_set()


class PullHoldService:
    def __init__(self, *, long_polling_enable: bool = True, short_polling_time_ms: int = 1000,
                 recheck_ms: int = 5000, max_held: int = 1 << 30,
                 held_elsewhere: Callable[[], int] = lambda: 0) -> None:
        self.long_polling_enable = long_polling_enable
        # Each held pull occupies a gRPC worker thread; past this many, counting the other calls that hold one
        # (``held_elsewhere``: transaction check streams), pulls are answered at once so that sends and other
        # calls always find a free worker.
        self.max_held = max_held
        self.held_elsewhere = held_elsewhere
        self._refused = 0
        self.short_polling_time_ms = short_polling_time_ms
        self.recheck_ms = recheck_ms
        self._lock = threading.Lock()
        self._waiters: dict[tuple[str, int], list[_Waiter]] = {}
        self._holding = 0  # pulls inside wait_for, long or short polling: what the budget counts
        self._stopped = False

    # ---------------------------------------------------------------- called by the store's dispatcher thread
    def on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        """Arrival listener: wake the pulls of this queue that a message at ``max_offset - 1`` satisfies. Cheap."""
        key = (topic, queue_id)
        with self._lock:
            waiters = self._waiters.get(key)
            if not waiters:
                return
            woken = [w for w in waiters if w.offset < max_offset]
            if len(woken) == len(waiters):
                del self._waiters[key]
            else:
                self._waiters[key] = [w for w in waiters if w.offset >= max_offset]
        for w in woken:
            w.event.set()

    # ---------------------------------------------------------------- called by pull handlers
    def can_hold(self) -> bool:
        """False after shutdown or when the held-pull budget is used up (the pull is answered at once)."""
        if self._stopped:
            return False
        if self.held_count() + self.held_elsewhere() < self.max_held:
            return True
        self._refused += 1
        if self._refused == 1 or self._refused % 1000 == 0:
            log.warning("%d pulls held, the limit; answering pulls at once (raise grpc_max_workers)", self.max_held)
        return False

    def wait_for(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        timeout_ms: int,
        has_new: Callable[[], bool],
        event: threading.Event | None = None,
    ) -> bool:
        """Hold until a message at ``offset`` may exist or ``timeout_ms`` passes; True when worth pulling again.

        Registers the waiter, then calls ``has_new`` (the re-check), then sleeps. Returns at the latest after
        the polling interval (re-check interval for long polling, short polling time otherwise) so the caller
        re-checks the store even if a notice was lost. ``event``: the caller's own (cleared) event to sleep on,
        which it may set to end the hold early (the pull's call was cancelled).
        """
        if self._stopped or timeout_ms <= 0:
            return False
        waiter = _Waiter(offset) if event is None else _Waiter(offset, event)
        key = (topic, queue_id)
        with self._lock:
            if self._stopped:  # shutdown released the waiters just now: this one would sleep a whole interval
                return False
            self._holding += 1
            if self.long_polling_enable:
                self._waiters.setdefault(key, []).append(waiter)
        try:
            if has_new():
                return True
            interval_ms = self.recheck_ms if self.long_polling_enable else self.short_polling_time_ms
            woken = waiter.event.wait(min(timeout_ms, interval_ms) / 1000)
            return woken or has_new()
        finally:
            with self._lock:
                self._holding -= 1
            if self.long_polling_enable:  # still listed unless an arrival or shutdown took it off
                self._remove(key, waiter)

    def watch(
        self, topic: str, queue_id: int, offset: int, on_arrival: Callable[[], None]
    ) -> Callable[[], None] | None:
        """Call ``on_arrival`` (on the dispatcher's thread: it must be cheap) once a message at ``offset`` may exist,
        or at shutdown, without holding a thread: for fronts that answer a held pull later (the remoting protocol's
        pulls). Returns the function that cancels the watch; None when nothing can be held (after shutdown, or
        with long polling off): the caller re-checks on its own schedule. The caller re-checks the queue after
        registering, as ``wait_for`` does, so an arrival between its pull and the watch is not missed."""
        if not self.long_polling_enable:
            return None
        waiter = _Waiter(offset, _CallingEvent(on_arrival))
        key = (topic, queue_id)
        with self._lock:
            if self._stopped:
                return None
            self._waiters.setdefault(key, []).append(waiter)
        return lambda: self._remove(key, waiter)

    def _remove(self, key: tuple[str, int], waiter: _Waiter) -> None:
        with self._lock:
            waiters = self._waiters.get(key)
            if waiters and waiter in waiters:
                waiters.remove(waiter)
                if not waiters:
                    del self._waiters[key]

    def held_count(self) -> int:
        """Pulls being held now, by long or short polling (each occupies a gRPC worker thread)."""
        with self._lock:
            return self._holding

    def shutdown(self) -> None:
        """Release every held pull (they answer NO_NEW_MSG) so the server can drain in-flight calls."""
        with self._lock:
            self._stopped = True  # under the lock: a pull registering after this sees it (wait_for)
            waiters = [w for ws in self._waiters.values() for w in ws]
            self._waiters.clear()
        for w in waiters:
            w.event.set()
        log.info("released %d held pulls", len(waiters))


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)
