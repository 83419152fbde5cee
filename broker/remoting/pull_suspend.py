"""Held remoting pulls: a pull that found nothing new waits for a message without holding a thread.

A 4.x push consumer keeps one pull per queue open for ``suspendTimeoutMillis`` (15 s by default): thousands of
queues would be thousands of threads if each held one, as a gRPC pull holds its worker. Here a held pull is a
``Future`` of its answer plus a watch on its queue (``PullHoldService.watch``, woken by the same arrivals that wake
gRPC pulls). One scheduler thread keeps the deadlines and the periodic re-checks (in case a notice was lost, as
``PullHoldService.recheck_ms``); the pulls woken or due are pulled again on a small pool. An arrival that lands
between the pull that found nothing and the watch is seen by the re-check made just after the watch is set.

The number held at once is bounded (``MAX_HELD``): past it a pull is answered at once (PULL_NOT_FOUND), which a
consumer answers by pulling again.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from broker.remoting.command import RemotingCommand
from broker.server.pull_hold import PullHoldService
from broker.server.pull_processor import NO_NEW_MSG, PullOutcome, PullProcessor, PullRequestArgs

log = logging.getLogger(__name__)

# Held pulls at once: each costs a future, a watch and a heap entry (well under a KiB); a broker serving many
# consumers holds one per queue each consumer reads.
MAX_HELD = 100_000
# Threads that pull a woken pull again: a pull that is not held returns in well under a millisecond unless it
# waits for a lagging dispatcher (200 ms at most), so a few serve many wake-ups.
RESUME_WORKERS = 4

# The answer to a pull's outcome, or to the refusal (or failure) of its later try.
Answerer = Callable[[PullOutcome | Exception], RemotingCommand]


@dataclass(eq=False)
class _Held:
    args: PullRequestArgs
    deadline: float
    answer: Answerer
    future: Future[RemotingCommand] = field(default_factory=Future)
    cancel: Callable[[], None] | None = None
    busy: bool = False  # being pulled again on the pool


class PullSuspender:
    def __init__(self, pulls: PullProcessor, hold: PullHoldService) -> None:
        self.pulls, self.hold = pulls, hold
        self._cond = threading.Condition()
        self._held: set[_Held] = set()
        self._ready: list[_Held] = []
        self._timers: list[tuple[float, int, _Held]] = []  # (when to look again, tie-break, pull)
        self._ties = itertools.count()
        self._stopped = False
        self._pool = ThreadPoolExecutor(RESUME_WORKERS, thread_name_prefix="remoting-pull")
        self._thread = threading.Thread(target=self._run, name="remoting-pull-hold", daemon=True)
        self._thread.start()

    def held_count(self) -> int:
        with self._cond:
            return len(self._held)

    def suspend(self, args: PullRequestArgs, timeout_ms: int, answer: Answerer, first: PullOutcome) -> (
        Future[RemotingCommand] | RemotingCommand
    ):
        """Hold a pull whose first try found nothing new (``first``); its answer when nothing can be held."""
        with self._cond:
            if self._stopped or len(self._held) >= MAX_HELD or timeout_ms <= 0:
                return answer(first)
            held = _Held(args, time.monotonic() + timeout_ms / 1000, answer)
            self._held.add(held)
        self._watch(held)
        return held.future

    def _watch(self, held: _Held) -> None:
        args = held.args
        held.cancel = self.hold.watch(args.topic, args.queue_id, args.offset, lambda: self._wake(held))
        recheck_s = (self.hold.recheck_ms if held.cancel is not None else self.hold.short_polling_time_ms) / 1000
        with self._cond:
            heapq.heappush(self._timers, (min(held.deadline, time.monotonic() + recheck_s), next(self._ties), held))
            self._cond.notify()
        if self.pulls.store.max_offset(args.topic, args.queue_id) > args.offset:
            self._wake(held)  # arrived between the pull that found nothing and the watch

    def _wake(self, held: _Held) -> None:
        """An arrival (on the dispatcher's thread): cheap, the pull is made on the pool."""
        with self._cond:
            if held in self._held and not held.busy:
                held.busy = True
                self._ready.append(held)
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and not self._ready and not self._due():
                    wait = self._timers[0][0] - time.monotonic() if self._timers else None
                    self._cond.wait(wait)
                if self._stopped:
                    return
                ready, self._ready = self._ready, []
            for held in ready:
                self._pool.submit(self._again, held)

    def _due(self) -> bool:
        """Move the pulls whose time to look again has come to the ready list (under the lock)."""
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, held = heapq.heappop(self._timers)
            if held in self._held and not held.busy:
                held.busy = True
                self._ready.append(held)
        return bool(self._ready)

    def _again(self, held: _Held) -> None:
        if held.cancel is not None:
            held.cancel()
        try:
            outcome = self.pulls.pull(held.args)
        except Exception as e:  # noqa: BLE001 - a refusal now (topic deleted, group disabled...): answered as one
            self._finish(held, e)
            return
        with self._cond:
            stopped = self._stopped
        if outcome.status == NO_NEW_MSG and time.monotonic() < held.deadline and not stopped:
            with self._cond:
                held.busy = False
            self._watch(held)
            return
        self._finish(held, outcome)

    def _finish(self, held: _Held, outcome: PullOutcome | Exception) -> None:
        with self._cond:
            if held not in self._held:
                return  # answered by shutdown meanwhile
            self._held.discard(held)
        held.future.set_result(held.answer(outcome))

    def shutdown(self) -> None:
        """Answer every held pull now (PULL_NOT_FOUND at its offset) and stop."""
        with self._cond:
            self._stopped = True
            held, self._held = list(self._held), set()
            self._cond.notify()
        for h in held:
            if h.cancel is not None:
                h.cancel()
            if not h.future.done():
                h.future.set_result(h.answer(PullOutcome(NO_NEW_MSG, h.args.offset, 0, 0)))
        self._pool.shutdown(wait=False, cancel_futures=True)
