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
        self._wake.set()

    def wait(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.run_once()

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
    checkpoint.data = checkpoint.data._replace(physic_msg_timestamp=ts, physic_offset=flushed)
    return True


class GroupCommitService(ServiceThread):
    """SYNC_FLUSH: one fdatasync per round serves every writer that appended before it started."""

    name = "group-commit"

    def __init__(self, commit_log: CommitLog, checkpoint: Checkpoint, on_error: ErrorHandler) -> None:
        super().__init__()
        self.commit_log = commit_log
        self.checkpoint = checkpoint
        self.on_error = on_error
        self._cond = threading.Condition()
        self._requested = 0  # highest end offset a writer waits for
        self.flushed = commit_log.flushed_offset
        self.failed: str = ""

    def wait_flushed(self, end_offset: int, timeout_s: float) -> str:
        """Block until the commit log is on disk up to ``end_offset``: "" when it is, else why not."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if end_offset > self._requested:
                self._requested = end_offset
                self._cond.notify_all()
            while self.flushed < end_offset:
                if self.failed:
                    return self.failed
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return f"not flushed within {timeout_s * 1000:.0f} ms (sync_flush_timeout_ms)"
                self._cond.wait(remaining)
        return ""

    def run_once(self) -> None:
        with self._cond:
            while self._requested <= self.flushed and not self.stopped:
                self._cond.wait(0.01)
            if self.failed or self.stopped:
                self._cond.wait(0.05)
                return
        if not flush_commit_log(self.commit_log, self.checkpoint, self._fail):
            return
        with self._cond:
            self.flushed = self.commit_log.flushed_offset
            self._cond.notify_all()

    def _fail(self, reason: str) -> None:
        with self._cond:
            self.failed = reason
            self._cond.notify_all()
        self.on_error(reason)

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        super().stop()


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
            cp = self.checkpoint.data._replace(
                logics_msg_timestamp=ts, logics_offset=offset, index_msg_timestamp=ts, index_offset=offset
            )
            self.checkpoint.write(cp)
        except OSError as e:
            self.on_error(f"consume queue / index / checkpoint fdatasync failed: {e}; the store stops taking writes")
            return False
        return True
