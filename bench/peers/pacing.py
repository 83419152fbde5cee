"""The two sides of a latency run: sends paced at a fixed rate, and the receiving side in a process of its own.

Apart because every system (brokers and relays alike) is timed through them, the same way."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench.peers.settings import IDLE_AFTER_DONE_S, LATENCY_MAX_WALL_S, RECEIVE_TIMEOUT_S, SERVER_START_TIMEOUT_S


def stamp(seq: int, size_b: int) -> bytes:
    """A latency message: its sequence number, then padding up to size_b."""
    return seq.to_bytes(8, "big") + b"x" * (size_b - 8)


def seq_of(body: bytes) -> int:
    return int.from_bytes(body[:8], "big")


def paced(rate_per_s: int, count: int) -> Iterator[tuple[int, float]]:
    """(sequence, scheduled time) at a fixed rate; sleeps until each scheduled time (monotonic clock). Stops
    early, after LATENCY_MAX_WALL_S, when the sender can't keep up: the run stays bounded in time."""
    start = time.monotonic() + 0.05
    for seq in range(count):
        due = start + seq / rate_per_s
        now = time.monotonic()
        if now - start > LATENCY_MAX_WALL_S:
            return
        if due > now:
            time.sleep(due - now)
        yield seq, due


class LatencyConsumer:
    """The receiving side of a latency run, in its own process (spawned: no GIL shared with the producer, no
    forked gRPC state). time.monotonic() is the system-wide CLOCK_MONOTONIC, so times compare across processes.

    The consumer function subscribes, calls ready(), then receives while more(received count) is true and
    returns {sequence: receive time}. more() turns false when everything arrived, when the producer is done and
    nothing came for a second, or after RECEIVE_TIMEOUT_S."""

    def __init__(self, fn: Callable[..., dict[int, float]], *args: Any) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._ready = ctx.Event()
        self._done = ctx.Event()
        self._results: Any = ctx.Queue()
        target_args = (fn, args, self._ready, self._done, self._results)
        self._proc = ctx.Process(target=_consumer_main, args=target_args, daemon=True)
        self._proc.start()
        if not self._ready.wait(SERVER_START_TIMEOUT_S):
            self._proc.kill()
            raise RuntimeError(f"latency consumer {fn.__name__} did not subscribe within {SERVER_START_TIMEOUT_S}s")

    @property
    def pid(self) -> int:
        """The consumer process's id (bench.latency_queues reads its CPU time)."""
        assert self._proc.pid is not None
        return self._proc.pid

    def received(self) -> dict[int, float]:
        """Call when the producer is done: the consumer's {sequence: receive time}."""
        self._done.set()
        try:
            result: dict[int, float] | str = self._results.get(timeout=RECEIVE_TIMEOUT_S + 30)
        finally:
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.kill()
        if isinstance(result, str):
            raise RuntimeError(f"latency consumer failed: {result}")
        return result


class _More:
    def __init__(self, count: int, done: Any) -> None:
        self.count = count
        self.done = done
        self.deadline = time.monotonic() + LATENCY_MAX_WALL_S + RECEIVE_TIMEOUT_S
        self.last_n = 0
        self.last_change = time.monotonic()

    def __call__(self, received: int) -> bool:
        now = time.monotonic()
        if received != self.last_n:
            self.last_n, self.last_change = received, now
        if received >= self.count or now > self.deadline:
            return False
        return not (self.done.is_set() and now - self.last_change > IDLE_AFTER_DONE_S)


def _consumer_main(
    fn: Callable[..., dict[int, float]], args: tuple[Any, ...], ready: Any, done: Any, results: Any
) -> None:
    *head, count = args
    try:
        results.put(fn(*head, ready=ready.set, more=_More(count, done)))
    except Exception as e:  # noqa: BLE001 -- sent to the parent, which raises it with the system's name
        results.put(f"{type(e).__name__}: {e}")
