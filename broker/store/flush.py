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
from broker.store.config import OS_PAGE_SIZE, StoreConfig
from broker.store.dispatcher import ConsumeQueueTable, Dispatcher
from broker.store.index_file import IndexService

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
        on_error(f"commit log fdatasync failed: {e}; the store stops taking writes (restart to recover)")
        return False
    checkpoint.set(physic_msg_timestamp=ts, physic_offset=flushed)
    return True


class _Waiter:
    """One writer waiting for the group commit. ``wake`` is a plain lock held from creation and released once by
    the leader that covers it (an Event costs a Condition, a second lock and a deque per wait; measured to matter
    with dozens of writer threads)."""

    __slots__ = ("end", "lead", "wake")

    def __init__(self, end: int) -> None:
        self.end = end
        self.wake = threading.Lock()
        self.wake.acquire()
        self.lead = False  # set (before the release) when this waiter is handed the next sync


class GroupCommitService(ServiceThread):
    """SYNC_FLUSH group commit, leader/follower style.

    A writer that needs its entry on disk and finds no sync in progress becomes the leader and runs fdatasync
    itself over everything written so far; writers arriving meanwhile queue up. When the sync returns, exactly the
    waiters it covered are woken, and if some are left the first of them is handed the next sync. So one
    fdatasync serves every writer that appended before it started, no hand-off to another thread sits on the
    latency path, and no writer is woken only to go back to sleep. The service thread serves writers that asked
    not to wait (WAIT=false), so their entries still reach the disk promptly.
    """

    name = "group-commit"

    def __init__(self, commit_log: CommitLog, checkpoint: Checkpoint, on_error: ErrorHandler) -> None:
        super().__init__()
        self.commit_log = commit_log
        self.checkpoint = checkpoint
        self.on_error = on_error
        self._lock = threading.Lock()
        self._waiters: list[_Waiter] = []
        self._requested = 0  # highest end offset anyone asked to be flushed
        self._syncing = False  # a leader owns the next/current fdatasync
        self.flushed = commit_log.flushed_offset
        self.failed: str = ""

    def request(self, end_offset: int) -> None:
        """Ask for a flush up to ``end_offset`` without waiting for it."""
        with self._lock:
            self._requested = max(self._requested, end_offset)
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
            me = _Waiter(end_offset)
            if self._syncing:
                self._waiters.append(me)
            else:
                self._syncing = me.lead = True
        while True:
            if me.lead:
                self._lead()
                break
            if not me.wake.acquire(True, max(0.0, deadline - time.monotonic())):
                with self._lock:
                    if not me.lead:  # not handed the sync in the meantime: give up waiting
                        if me in self._waiters:
                            self._waiters.remove(me)
                        if self.flushed >= end_offset and not self.failed:
                            break  # covered just as the wait ran out
                        return f"not flushed within {timeout_s * 1000:.0f} ms (sync_flush_timeout_ms)"
                continue
            if not me.lead:
                break
        if self.failed and self.flushed < end_offset:
            return self.failed
        if time.monotonic() > deadline:
            return f"flushed, but later than {timeout_s * 1000:.0f} ms (sync_flush_timeout_ms)"
        return ""

    def _lead(self) -> None:
        """Run one fdatasync for everyone written so far, wake whom it covered, hand the next one on."""
        ok = flush_commit_log(self.commit_log, self.checkpoint, self._fail)
        with self._lock:
            if ok:
                self.flushed = self.commit_log.flushed_offset
            done = [w for w in self._waiters if w.end <= self.flushed or not ok]
            self._waiters = [w for w in self._waiters if w.end > self.flushed and ok]
            if self._waiters:
                nxt = self._waiters.pop(0)
                nxt.lead = True
                done.append(nxt)
            else:
                self._syncing = False
        for w in done:
            w.wake.release()

    def run_once(self) -> None:
        self.wait(0.01)
        with self._lock:
            if self._requested <= self.flushed or self._syncing or self.failed or self.stopped:
                return
            self._syncing = True
        self._lead()

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

    def flush_all(self) -> bool:
        # Snapshot first: everything dispatched before this point is in the files we are about to sync.
        offset = self.dispatcher.dispatched_offset
        ts = self.dispatcher.last_dispatched_timestamp
        try:
            for cq in list(self.queues.queues.values()):
                cq.flush()
            if self.index is not None:
                self.index.flush()
            self.checkpoint.update(
                logics_msg_timestamp=ts, logics_offset=offset, index_msg_timestamp=ts, index_offset=offset
            )
        except OSError as e:
            self.on_error(f"consume queue / index / checkpoint fdatasync failed: {e}; the store stops taking writes")
            return False
        return True
