"""Flush services: when bytes written to the page cache are forced to disk.

* ASYNC_FLUSH (``AsyncFlushService``, RocketMQ's FlushRealTimeService): every ``flush_interval_commit_log_ms``,
  fdatasync the commit log if at least ``flush_commit_log_least_pages`` 4 KiB pages are dirty, or whatever is dirty
  once ``flush_commit_log_thorough_interval_ms`` has passed since the last thorough flush.
* SYNC_FLUSH (``GroupCommitService``): a writer appends, then waits until the flushed offset passes its entry.
  The service flushes everything written so far with one fdatasync, so one sync serves every writer waiting at
  that moment (group commit). A writer waits at most ``sync_flush_timeout_ms`` (FLUSH_DISK_TIMEOUT).
* ``ConsumeQueueFlushService``: consume queues and index every ``flush_interval_consume_queue_ms``, then the
  checkpoint.

A failed fdatasync never advances a flushed position and never acknowledges a waiting writer (apache/rocketmq
2706, 3129). After one the kernel may have dropped the dirty pages, so the store stops taking writes
(``on_error``) until it is restarted and recovery re-reads the log with CRC checks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from broker.store.checkpoint import Checkpoint
from broker.store.commit_log import CommitLog
from broker.store.consume_queue_table import ConsumeQueueTable
from broker.store.dispatcher import Dispatcher
from broker.store.index_file import IndexService
from broker.store.store_config import OS_PAGE_SIZE, StoreConfig

log = logging.getLogger(__name__)

ErrorHandler = Callable[[str], None]


class ServiceThread:
    """A daemon thread running ``run_once`` until stopped; ``wakeup()`` cuts the current wait short."""

    name = "service"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def wakeup(self) -> None:
        if not self._wake.is_set():  # set() takes the Event's lock; puts call this often
            self._wake.set()

    def wait(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # a service must outlive a bug in one pass; the traceback goes to the log
                log.exception("%s: pass failed; retrying in 1 s", self.name)
                self._stop.wait(1.0)

    def run_once(self) -> None:
        raise NotImplementedError


class AsyncFlushService(ServiceThread):
    name = "commitlog-flush"

    def __init__(self, config: StoreConfig, commit_log: CommitLog, checkpoint: Checkpoint, on_error: ErrorHandler):
        super().__init__()
        self.config = config
        self.commit_log = commit_log
        self.checkpoint = checkpoint
        self.on_error = on_error
        self._last_thorough = time.monotonic()

    def run_once(self) -> None:
        self.wait(self.config.flush_interval_commit_log_ms / 1000)
        if self.stopped:  # shutdown flushes by itself; a crash (abandon) must not flush at all
            return
        now = time.monotonic()
        thorough = (now - self._last_thorough) * 1000 >= self.config.flush_commit_log_thorough_interval_ms
        least = 0 if thorough else self.config.flush_commit_log_least_pages * OS_PAGE_SIZE
        if self.commit_log.files.dirty_bytes() > max(least - 1, 0):
            if flush_commit_log(self.commit_log, self.checkpoint, self.on_error) and thorough:
                self._last_thorough = now
        elif thorough:
            self._last_thorough = now


def flush_commit_log(commit_log: CommitLog, checkpoint: Checkpoint, on_error: ErrorHandler) -> bool:
    """fdatasync the commit log; record it in the checkpoint (not synced: the next checkpoint flush does it)."""
    ts = commit_log.last_store_timestamp
    try:
        flushed = commit_log.files.flush()
    except OSError as e:
        on_error(
            f"commit log fdatasync failed: {e}; the store takes no more writes: restart the broker, whose recovery "
            "re-checks the log"
        )
        return False
    checkpoint.set(physic_msg_timestamp=ts, physic_offset=flushed)
    return True


class _SyncWaiter:
    """One writer waiting for the group commit. ``wake`` is a plain lock held from creation and released once by
    the flusher when a sync covers the writer (an Event costs a Condition, a second lock and a deque per wait;
    measured to matter with dozens of writer threads)."""

    __slots__ = ("end", "wake")

    def __init__(self, end: int) -> None:
        self.end = end
        self.wake = threading.Lock()
        self.wake.acquire()


class GroupCommitService(ServiceThread):
    """SYNC_FLUSH group commit by one flusher thread, as RocketMQ's GroupCommitService.

    A writer appends, queues a waiter and wakes the flusher if it is idle. The flusher runs one fdatasync over
    everything written so far, wakes exactly the waiters it covered, and goes again at once while any are left:
    one fdatasync serves every writer that appended before it started.

    Why a thread of its own rather than a writer that takes the sync itself (leader/follower, what Sluice did
    before): ``sluice broker`` runs this thread on a CPU away from the GIL-sharing Python threads
    (thread_placement.py). There, the fdatasync's own CPU work (about 50 us a call here) does not take the
    writers' CPU, and when the disk answers, the thread runs at once instead of queueing behind writer threads
    that may not preempt one another (SCHED_BATCH). Measured, 32 single-message SYNC writers at 100 B
    (bench.store, alternating runs): fdatasync wall time under that load 395-453 us -> 236-249 us, and
    40.7-41.9k -> 49.7-50.6k msgs/s. The flusher takes the GIL twice per sync, not per message.
    """

    name = "group-commit"

    def __init__(self, commit_log: CommitLog, checkpoint: Checkpoint, on_error: ErrorHandler) -> None:
        super().__init__()
        self.commit_log = commit_log
        self.checkpoint = checkpoint
        self.on_error = on_error
        self._lock = threading.Lock()
        self._waiters: list[_SyncWaiter] = []
        self._requested = 0  # highest end offset anyone asked to be flushed
        self._syncing = False  # the flusher is between being woken and finding nothing left to sync
        self.flushed = commit_log.flushed_offset
        self.failed: str = ""

    def request(self, end_offset: int) -> None:
        """Ask for a flush up to ``end_offset`` without waiting for it."""
        with self._lock:
            self._requested = max(self._requested, end_offset)
            idle = not self._syncing
        if idle:
            self.wakeup()

    def wait_flushed(self, end_offset: int, timeout_s: float) -> str:
        """Block until the commit log is on disk up to ``end_offset``: "" when it is, else why not."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            if self.flushed >= end_offset:
                return ""
            if self.failed:
                return self.failed
            self._requested = max(self._requested, end_offset)
            me = _SyncWaiter(end_offset)
            self._waiters.append(me)
            idle = not self._syncing
        if idle and self.stopped:  # queued as the flusher ended (shutdown): serve it here, not after the timeout
            self._drain()
        elif idle:
            self.wakeup()
        if not me.wake.acquire(True, timeout_s):
            with self._lock:
                if me in self._waiters:  # not covered yet: stop waiting
                    self._waiters.remove(me)
                    return f"not flushed within {timeout_s * 1000:.0f} ms (sync_flush_timeout_ms)"
            # covered (or failed) just as the wait ran out: the flusher took it off the list first
        if self.failed and self.flushed < end_offset:
            return self.failed
        if time.monotonic() > deadline:
            return f"flushed, but later than {timeout_s * 1000:.0f} ms (sync_flush_timeout_ms)"
        return ""

    def run_once(self) -> None:
        self.wait(0.01)
        self._drain()

    def stop(self) -> None:
        super().stop()
        self._drain()  # writers that queued as the thread ended (the store stops appends before its services)

    def _drain(self) -> None:
        """Sync while something asked for is not on disk, until a sync fails or gets no further (files closed
        under a late writer: it then gets FLUSH_DISK_TIMEOUT, never a false success)."""
        progress = True
        while True:
            with self._lock:
                if self._requested <= self.flushed or self.failed or not progress:
                    self._syncing = False
                    return
                self._syncing = True
                before = self.flushed
            self._sync()
            progress = self.flushed > before

    def _sync(self) -> None:
        """One fdatasync for everyone written so far; wake whom it covered (everyone, if it failed)."""
        ok = flush_commit_log(self.commit_log, self.checkpoint, self._fail)
        with self._lock:
            if ok:
                self.flushed = self.commit_log.flushed_offset
                done = [w for w in self._waiters if w.end <= self.flushed]
                self._waiters = [w for w in self._waiters if w.end > self.flushed]
            else:
                done, self._waiters = self._waiters, []
        for w in done:
            w.wake.release()

    def _fail(self, reason: str) -> None:
        self.failed = reason
        self.on_error(reason)


class ConsumeQueueFlushService(ServiceThread):
    """Flush consume queues and index, then write the checkpoint saying how far they are complete."""

    name = "consumequeue-flush"

    def __init__(
        self,
        config: StoreConfig,
        queues: ConsumeQueueTable,
        index: IndexService | None,
        dispatcher: Dispatcher,
        checkpoint: Checkpoint,
        on_error: ErrorHandler,
    ) -> None:
        super().__init__()
        self.config = config
        self.queues = queues
        self.index = index
        self.dispatcher = dispatcher
        self.checkpoint = checkpoint
        self.on_error = on_error

    def run_once(self) -> None:
        self.wait(self.config.flush_interval_consume_queue_ms / 1000)
        if not self.stopped:
            self.flush_all()

    def flush_all(self, final: bool = False) -> bool:
        """``final``: the store is shutting down; the transaction-visibility state is written whether or not it
        changed, so the next start re-dispatches nothing."""
        # Snapshot first: everything dispatched before this point is in the files we are about to sync.
        offset = self.dispatcher.dispatched_offset
        ts = self.dispatcher.last_dispatched_timestamp
        try:
            for cq in list(self.queues.queues.values()):
                cq.flush()
            if self.index is not None:
                self.index.flush()
            if self.dispatcher.txn is not None:
                self.dispatcher.txn.save(self.dispatcher.commit_log.min_offset, force=final)
            self.checkpoint.update(
                logics_msg_timestamp=ts, logics_offset=offset, index_msg_timestamp=ts, index_offset=offset
            )
        except OSError as e:
            self.on_error(f"consume queue / index / checkpoint fdatasync failed: {e}; the store stops taking writes")
            return False
        return True
