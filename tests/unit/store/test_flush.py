"""Flush: SYNC group commit, per-message WAIT, FLUSH_DISK_TIMEOUT, failed fsync (apache/rocketmq 2706, 3129),
ASYNC least pages."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable

import pytest

from broker.store import MessageStore, PutStatus


def test_sync_flush_acks_only_what_is_on_disk(make_store: Callable[..., MessageStore]) -> None:
    s = make_store(flush_disk_type="SYNC_FLUSH")
    r = s.put_message("S", 0, b"durable")
    assert r.status is PutStatus.PUT_OK
    assert s.commit_log.flushed_offset >= r.commitlog_offsets[0] + r.wrote_bytes
    assert s.check() == []


def test_group_commit_serves_many_writers_per_fsync(make_store: Callable[..., MessageStore]) -> None:
    s = make_store(flush_disk_type="SYNC_FLUSH", mapped_file_size_commit_log=1 << 20)
    s.faults.delay_fsyncs(0.002)  # a disk with 2 ms syncs makes writers pile up behind each one
    statuses: list[PutStatus] = []

    def writer(k: int) -> None:
        for i in range(20):
            statuses.append(s.put_message("GC", k % 4, b"%d-%d" % (k, i)).status)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(32)]
    before = s.faults.fsync_counts.get("commitlog", 0)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == [PutStatus.PUT_OK] * 640
    syncs = s.faults.fsync_counts["commitlog"] - before
    assert syncs < 640 / 2  # group commit: far fewer commit-log syncs than messages
    s.faults.delay_fsyncs(0)
    assert s.check() == []


def test_failed_fsync_does_not_ack_nor_advance(make_store: Callable[..., MessageStore]) -> None:
    """apache/rocketmq 2706 / 3129: an fsync error must not be taken for success."""
    s = make_store(flush_disk_type="SYNC_FLUSH")
    ok = s.put_message("F", 0, b"first")
    flushed_before = s.commit_log.flushed_offset
    s.faults.fail_next_fsyncs(1)
    r = s.put_message("F", 0, b"second")
    assert r.status is PutStatus.FLUSH_DISK_TIMEOUT
    assert "fdatasync failed" in r.error
    assert s.commit_log.flushed_offset == flushed_before < r.commitlog_offsets[0] + r.wrote_bytes
    # the store is read-only now: the kernel may have dropped the dirty pages
    assert not s.is_writable()
    after = s.put_message("F", 0, b"third")
    assert after.status is PutStatus.SERVICE_NOT_AVAILABLE and "read-only" in after.error
    s.wait_dispatched()
    assert [m.body for m in s.get_message("g", "F", 0, 0).messages()] == [b"first", b"second"]  # reads go on
    assert ok.ok
    s.shutdown()  # keeps the abort file: the next start re-checks the log
    s2 = make_store(flush_disk_type="SYNC_FLUSH")
    assert s2.recovery_report is not None and s2.recovery_report.abnormal
    assert s2.put_message("F", 0, b"after restart").ok
    assert s2.check() == []


def test_flush_timeout_then_recovers(make_store: Callable[..., MessageStore]) -> None:
    s = make_store(flush_disk_type="SYNC_FLUSH", sync_flush_timeout_ms=50)
    s.faults.delay_fsyncs(0.3)
    r = s.put_message("T", 0, b"slow")
    assert r.status is PutStatus.FLUSH_DISK_TIMEOUT and "sync_flush_timeout_ms" in r.error
    s.faults.delay_fsyncs(0)
    deadline = time.monotonic() + 5
    while s.commit_log.flushed_offset < r.commitlog_offsets[0] + r.wrote_bytes and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.commit_log.flushed_offset >= r.commitlog_offsets[0] + r.wrote_bytes
    assert s.is_writable() and s.put_message("T", 0, b"fast").ok


def test_wait_false_does_not_wait_for_the_disk(make_store: Callable[..., MessageStore]) -> None:
    s = make_store(flush_disk_type="SYNC_FLUSH", sync_flush_timeout_ms=50)
    s.faults.delay_fsyncs(0.3)
    fire_and_forget = s.put_message("W", 0, b"x", {"WAIT": "false"})
    assert fire_and_forget.status is PutStatus.PUT_OK
    assert s.put_message("W", 0, b"y", wait_store_ok=False).status is PutStatus.PUT_OK
    assert s.put_message("W", 0, b"z").status is PutStatus.FLUSH_DISK_TIMEOUT
    s.faults.delay_fsyncs(0)


def test_async_flush_waits_for_least_pages(make_store: Callable[..., MessageStore]) -> None:
    s = make_store(flush_commit_log_thorough_interval_ms=60_000, mapped_file_size_commit_log=1 << 20)
    s.put_message("A", 0, b"small")
    time.sleep(0.15)  # several 20 ms intervals: fewer than 4 dirty pages, no thorough flush due
    assert s.commit_log.flushed_offset == 0
    for _ in range(20):
        s.put_message("A", 0, b"x" * 1000)  # > 4 pages now
    deadline = time.monotonic() + 5
    while s.commit_log.flushed_offset == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.commit_log.flushed_offset > 16 * 1024


def test_a_writer_queued_as_the_flusher_stops_is_served_at_once(make_store: Callable[..., MessageStore]) -> None:
    """Shutdown stops appends, then the flusher; a writer that appended just before and queues just after is
    synced by the stopping thread or by itself, not left to its 5 s timeout."""
    s = make_store(flush_disk_type="SYNC_FLUSH")
    gc = s._group_commit
    assert gc is not None
    gc.stop()  # the flusher thread is gone, as at the end of a shutdown
    started = time.monotonic()
    r = s.put_message("Q", 0, b"late")
    assert r.status is PutStatus.PUT_OK and time.monotonic() - started < 3.0  # not the 5 s timeout
    assert s.commit_log.flushed_offset >= r.commitlog_offsets[0] + r.wrote_bytes


def test_a_failed_commit_log_fsync_is_final(make_store: Callable[..., MessageStore]) -> None:
    """fsyncgate: after a failed fdatasync the kernel may have dropped the dirty pages, so a retry that returns 0
    proves nothing. Later flushes once advanced the flushed offset past the lost bytes and store.flush() returned
    normally."""
    s = make_store(flush_commit_log_least_pages=0)  # ASYNC: the flush service syncs every 20 ms
    s.faults.fail_next_fsyncs(1)
    r = s.put_message("F", 0, b"x" * 100)
    assert r.ok  # ASYNC: acknowledged before the flush, as RocketMQ
    deadline = time.monotonic() + 5
    while s.is_writable() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # several more flush intervals
    assert s.faults.fsync_counts["commitlog"] == 1  # never synced again
    assert s.commit_log.flushed_offset == 0 < s.commit_log.max_offset
    with pytest.raises(OSError, match="restart the broker"):
        s.flush()
    assert s.commit_log.flushed_offset == 0
    refused = s.put_message("F", 0, b"y")
    assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE and "restart the broker" in refused.error
    s.shutdown()
    assert os.path.exists(s.config.abort_path)  # the next start recovers abnormally: the log is re-checked
    s2 = make_store()
    assert s2.recovery_report is not None and s2.recovery_report.abnormal
    assert s2.put_message("F", 0, b"after restart").ok
    assert s2.check() == []


def test_a_failed_sync_flush_acks_no_later_writer(make_store: Callable[..., MessageStore]) -> None:
    s = make_store(flush_disk_type="SYNC_FLUSH")
    s.faults.fail_next_fsyncs(1)
    assert s.put_message("F", 0, b"lost?").status is PutStatus.FLUSH_DISK_TIMEOUT
    flushed = s.commit_log.flushed_offset
    gc = s._group_commit
    assert gc is not None
    gc.request(s.commit_log.max_offset)  # a retry through the group commit syncs nothing either
    time.sleep(0.1)
    assert s.commit_log.flushed_offset == flushed and s.faults.fsync_counts["commitlog"] == 1
    assert gc.wait_flushed(s.commit_log.max_offset, 0.5) != ""


def test_a_shutdown_whose_step_fails_keeps_the_abort_file(
    make_store: Callable[..., MessageStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dispatch failing at shutdown (a consume-queue file that cannot be created) raised out of shutdown after
    the abort file was removed, and before the commit log was flushed: the next start took the store for clean."""
    s = make_store(flush_commit_log_least_pages=10**5, flush_interval_commit_log_ms=10**6)
    monkeypatch.setattr(s.dispatcher, "dispatch_available", _raise_enospc)
    r = s.put_message("S", 0, b"x" * 100)
    with pytest.raises(OSError, match="No space"):
        s.shutdown()
    assert os.path.exists(s.config.abort_path)
    assert s.faults.fsync_counts.get("commitlog") == 1  # the commit log was flushed all the same
    monkeypatch.undo()
    s2 = make_store()
    assert s2.recovery_report is not None and s2.recovery_report.abnormal
    assert s2.lookup_message(r.commitlog_offsets[0]) is not None
    assert s2.check() == []


def _raise_enospc(notify: bool = True) -> int:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_queue_deleted_while_it_is_flushed_is_skipped(make_store: Callable[..., MessageStore]) -> None:
    """delete_topic closed a consume-queue file while the flusher was in its fdatasync: EBADF reached on_error and
    made the whole store read-only."""
    s = make_store(flush_interval_consume_queue_ms=20)
    in_sync, sync_done = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    fdatasync = s.faults.fdatasync

    def slow_first_queue_sync(fd: int, kind: str = "") -> None:
        """The first consume-queue sync (D/0's, the only queue) signals, then takes 0.3 s: the deletion's window."""
        if kind != "consumequeue" or in_sync.is_set():
            return fdatasync(fd, kind)
        in_sync.set()
        try:
            time.sleep(0.3)
            fdatasync(fd, kind)
        except BaseException as e:
            errors.append(e)
            raise
        finally:
            sync_done.set()

    s.faults.fdatasync = slow_first_queue_sync  # type: ignore[method-assign]  # the syncers look it up per call
    for _ in range(3):
        assert s.put_message("D", 0, b"x").ok
    assert s.wait_dispatched()
    assert in_sync.wait(5), "the flusher never synced the consume queue"
    s.delete_topic("D")  # while the flusher is inside the sync of D/0's file
    assert sync_done.wait(5)
    assert errors == []  # the file was not closed under the sync (EBADF)
    assert s.is_writable(), s.write_state.write_error
    assert s.put_message("Other", 0, b"y").ok and s.wait_dispatched()
    assert s.topics() == ["Other"]
    assert s.check() == []
