"""Recovery: torn tails and flipped bytes cut at the first bad entry (logged with file and offset), consume-queue
units rebuilt across a file boundary after a crash (apache/rocketmq 405, 1434), the lock file, index rebuild."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from broker import json_file
from broker.errors import StoreLockedError
from broker.format.message import BODY_START, Prop, encode_entry, encode_properties
from broker.store import MessageStore, PutResult, PutStatus, mapped_file
from broker.store.consume_queue import CQ_UNIT
from broker.store.flush import flush_commit_log
from broker.store.recovery import FIRST_CHUNK_BYTES, RECOVERY_CHUNK_BYTES


def _put(s: MessageStore, n: int, topic: str = "R", start: int = 0) -> list[PutResult]:
    out = []
    for i in range(start, start + n):
        r = s.put_message(topic, 0, b"msg-%03d" % i + b"." * 150, {Prop.KEYS: f"key{i}"})
        assert r.ok
        out.append(r)
    return out


def _bodies(s: MessageStore, topic: str = "R") -> list[bytes]:
    assert s.wait_dispatched()
    out: list[bytes] = []
    off = s.min_offset(topic, 0)
    while off < s.max_offset(topic, 0):
        got = s.get_message("g", topic, 0, off, 32)
        out += [m.body[:7] for m in got.messages()]
        off = got.next_begin_offset
    return out


def _flip_body_byte(path: str, entry_at: int, body_byte: int, xor: int) -> None:
    """XOR byte ``body_byte`` of the body of the entry at file offset ``entry_at``, as bit rot would."""
    at = entry_at + BODY_START + body_byte
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ xor]))


def _last_file(s: MessageStore) -> str:
    f = s.commit_log.files.last()
    assert f is not None
    return f.path


@pytest.mark.parametrize("clean_exit", [True, False])
def test_torn_tail_is_cut_with_a_log_line(
    make_store: Callable[..., MessageStore], caplog: pytest.LogCaptureFixture, clean_exit: bool
) -> None:
    s = make_store()
    results = _put(s, 30)
    path = _last_file(s)
    last = results[-1]
    file_start = last.commitlog_offsets[0] - last.commitlog_offsets[0] % s.config.mapped_file_size_commit_log
    cut = last.commitlog_offsets[0] - file_start + 50  # mid-entry
    s.shutdown() if clean_exit else s.abandon()
    os.truncate(path, cut)  # the file is cut short, as a disk losing its tail would
    caplog.set_level(logging.WARNING)
    s2 = make_store()
    bad_at = last.commitlog_offsets[0] - file_start
    assert any(path in r.getMessage() and f"byte {bad_at}" in r.getMessage() for r in caplog.records), [
        r.getMessage() for r in caplog.records
    ]
    assert _bodies(s2) == [b"msg-%03d" % i for i in range(29)]
    assert s2.put_message("R", 0, b"msg-new").queue_offsets == [29]  # offsets stay gapless
    assert s2.query_by_key("R", "key29") == []
    assert [m.body[:7] for m in s2.query_by_key("R", "key28")] == [b"msg-028"]
    assert s2.check() == []


def test_flipped_body_byte_is_detected_by_crc(
    make_store: Callable[..., MessageStore], caplog: pytest.LogCaptureFixture
) -> None:
    s = make_store()
    results = _put(s, 30)
    victim = results[-5]  # in the last file
    size = s.config.mapped_file_size_commit_log
    rel = victim.commitlog_offsets[0] % size
    path = _last_file(s)
    assert victim.commitlog_offsets[0] // size == results[-1].commitlog_offsets[0] // size
    s.abandon()
    _flip_body_byte(path, rel, 3, 0x40)
    caplog.set_level(logging.WARNING)
    s2 = make_store()
    lines = [r.getMessage() for r in caplog.records]
    assert any(path in ln and f"byte {rel}" in ln and "CRC" in ln for ln in lines), lines
    assert _bodies(s2) == [b"msg-%03d" % i for i in range(25)]
    assert s2.recovery_report is not None and s2.recovery_report.truncated_at == victim.commitlog_offsets[0]
    assert s2.check() == []


def test_units_rebuilt_across_a_consume_queue_file_boundary(make_store: Callable[..., MessageStore]) -> None:
    """apache/rocketmq 405 / 1434: units of a run crossing a consume-queue file boundary lost after a crash."""
    slow_cq = dict(flush_interval_consume_queue_ms=600_000)  # the checkpoint only moves when we say so
    s = make_store(**slow_cq)
    _put(s, 5)
    s.flush()  # checkpoint: dispatch complete after message 4
    _put(s, 20, start=5)  # units 5..24 cross consume-queue files (10 units each)
    assert s.wait_dispatched()
    s.abandon()
    # As after power loss: the consume queue's unflushed units never reached the disk.
    d = os.path.join(s.config.consume_queue_dir, "R", "0")
    for name in ("00000000000000000200", "00000000000000000400"):
        os.unlink(os.path.join(d, name))
    with open(os.path.join(d, "00000000000000000000"), "r+b") as f:
        f.seek(5 * CQ_UNIT.size)
        f.write(bytes(5 * CQ_UNIT.size))
    s2 = make_store(**slow_cq)
    assert s2.recovery_report is not None and s2.recovery_report.abnormal
    # re-dispatched from the checkpoint or earlier (the index file newer than the checkpoint is rebuilt whole)
    assert s2.recovery_report.redispatched_entries >= 20
    assert _bodies(s2) == [b"msg-%03d" % i for i in range(25)]
    assert s2.put_message("R", 0, b"msg-025").queue_offsets == [25]
    assert s2.check() == []


def test_units_lost_below_the_queue_end_are_rewritten_by_re_dispatch(
    make_store: Callable[..., MessageStore], caplog: pytest.LogCaptureFixture
) -> None:
    """Power loss can keep a later page of a consume-queue file and lose an earlier one (or leave an older
    version of it). Re-dispatch skipped every unit below the queue's end, so the empty unit stayed: check()
    reported it and readers met a hole. Now the units are compared with the commit log and rewritten."""
    slow_cq = dict(flush_interval_consume_queue_ms=600_000)  # the checkpoint only moves when we say so
    s = make_store(**slow_cq)
    _put(s, 3)
    s.flush()  # checkpoint: dispatch complete after message 2
    _put(s, 6, start=3)
    assert s.wait_dispatched()
    s.abandon()
    d = os.path.join(s.config.consume_queue_dir, "R", "0")
    path = os.path.join(d, "00000000000000000000")
    with open(path, "r+b") as f:
        f.seek(3 * CQ_UNIT.size)
        f.write(bytes(CQ_UNIT.size))  # unit 3 lost, units 4..8 kept
        f.seek(5 * CQ_UNIT.size)
        f.write(CQ_UNIT.pack(0, 90, 0))  # unit 5 stale: another entry's position
    caplog.set_level(logging.WARNING)
    s2 = make_store(**slow_cq)
    assert s2.recovery_report is not None and s2.recovery_report.abnormal
    assert _bodies(s2) == [b"msg-%03d" % i for i in range(9)]
    lines = [r.getMessage() for r in caplog.records if "rewritten" in r.getMessage()]
    assert len(lines) == 2, lines
    assert f"unit 3 ({path} byte 60)" in lines[0] and f"unit 5 ({path} byte 100)" in lines[1]
    assert s2.check() == []
    assert s2.query_by_key("Gone", "old1") == []  # nor by key
    s2.shutdown()  # the repaired units are synced (they were below the flushed position) and stay
    s3 = make_store(**slow_cq)
    assert _bodies(s3) == [b"msg-%03d" % i for i in range(9)] and s3.check() == []


def test_abnormal_recovery_without_checkpoint_scans_everything(make_store: Callable[..., MessageStore]) -> None:
    s = make_store()
    _put(s, 40)
    s.abandon()
    os.unlink(s.config.checkpoint_path)
    s2 = make_store()
    assert s2.recovery_report is not None and s2.recovery_report.abnormal
    assert s2.recovery_report.scanned_bytes >= s2.commit_log.max_offset - s2.config.mapped_file_size_commit_log
    assert _bodies(s2) == [b"msg-%03d" % i for i in range(40)]
    assert s2.check() == []


def test_normal_restart_keeps_everything(make_store: Callable[..., MessageStore]) -> None:
    s = make_store()
    _put(s, 40)
    _put(s, 5, topic="Other")
    s.shutdown()
    assert not os.path.exists(s.config.abort_path)
    s2 = make_store()
    assert s2.recovery_report is not None and not s2.recovery_report.abnormal
    assert s2.recovery_report.redispatched_entries == 0
    assert len(_bodies(s2)) == 40 and s2.max_offset("Other", 0) == 5
    assert os.path.isdir(s2.config.config_dir) and os.path.exists(s2.config.abort_path)
    assert s2.check() == []


def test_one_broker_per_store_directory(make_store: Callable[..., MessageStore]) -> None:
    make_store()
    other = make_store(start=False)
    with pytest.raises(StoreLockedError, match="locked"):
        other.start()


def test_puts_racing_shutdown_either_land_or_are_refused(make_store: Callable[..., MessageStore]) -> None:
    s = make_store()

    def writer(k: int) -> int:
        acked = 0
        for i in range(400):
            r = s.put_message("Race", k, b"%d" % i)
            assert r.status in (PutStatus.PUT_OK, PutStatus.SERVICE_NOT_AVAILABLE), r
            acked += r.status is PutStatus.PUT_OK
        return acked

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(writer, k) for k in range(4)]
        s.shutdown()
        acked = [f.result() for f in futures]  # re-raises anything a writer raised
    s2 = make_store()
    assert [s2.max_offset("Race", k) for k in range(4)] == acked
    assert s2.check() == []


def test_files_created_but_not_preallocated_when_killed(make_store: Callable[..., MessageStore]) -> None:
    """A kill between creating a file and preallocating it leaves a 0-byte file; start-up must cope."""
    s = make_store()
    _put(s, 5)
    assert s.wait_dispatched()
    s.abandon()
    cfg = s.config
    for path in (
        os.path.join(cfg.commit_log_dir, "00000000000000016384"),
        os.path.join(cfg.consume_queue_dir, "R", "0", "00000000000000000200"),
        os.path.join(cfg.index_dir, "99991231235959999"),
    ):
        open(path, "wb").close()
    s2 = make_store()
    assert _bodies(s2) == [b"msg-%03d" % i for i in range(5)]
    _put(s2, 30, start=5)
    assert s2.wait_dispatched()
    assert [m.body[:7] for m in s2.query_by_key("R", "key33")] == [b"msg-033"]
    assert s2.check() == []


def test_large_log_scan_finds_a_flipped_byte_past_many_pieces(
    make_store: Callable[..., MessageStore], caplog: pytest.LogCaptureFixture
) -> None:
    """A log of several scan pieces (recovery.RECOVERY_CHUNK_BYTES), so the compiled walk and CRC loops do the
    work, starting with one entry larger than the first piece: a flipped body byte near the end is found at its
    file and offset, everything before it is kept."""
    big = 1 << 20
    s = make_store(
        mapped_file_size_commit_log=16 << 20, max_message_size=big + 1024, max_batch_bytes=2 << 20,
        mapped_file_size_consume_queue=20 * 30_000,
    )
    assert big > FIRST_CHUNK_BYTES * 4 and RECOVERY_CHUNK_BYTES * 3 < 7 << 20
    assert s.put_message("L", 0, b"big-first" + b"." * big).ok
    props = encode_properties({Prop.TAGS: "t"})
    n = 0
    while s.commit_log.max_offset < 7 << 20:
        buf = b"".join(encode_entry(b"L", 0, b"m-%07d" % (n + i) + b"." * (50 + i % 97), props) for i in range(5000))
        r = s.put_batch(buf)
        assert r.ok
        n += 5000
        victim = r.commitlog_offsets[1234]  # in the last batch once the loop ends
    path = _last_file(s)
    s.abandon()
    os.unlink(s.config.checkpoint_path)  # no checkpoint: the whole log is scanned
    assert victim < s.config.mapped_file_size_commit_log  # the log is one file: global offset = file offset
    _flip_body_byte(path, victim, 4, 0x01)
    caplog.set_level(logging.WARNING)
    s2 = make_store(
        mapped_file_size_commit_log=16 << 20, max_message_size=big + 1024, max_batch_bytes=2 << 20,
        mapped_file_size_consume_queue=20 * 30_000,
    )
    lines = [r.getMessage() for r in caplog.records]
    assert any(path in ln and f"byte {victim}" in ln and "CRC" in ln for ln in lines), lines
    assert s2.recovery_report is not None and s2.recovery_report.truncated_at == victim
    assert s2.wait_dispatched()
    assert s2.max_offset("L", 0) == 1 + n - 5000 + 1234  # the big one, every full batch, the victim's prefix
    first = s2.get_message("g", "L", 0, 0, 2, max_bytes=4 << 20)
    assert [m.body[:9] for m in first.messages()] == [b"big-first", b"m-0000000"]
    last = s2.get_message("g", "L", 0, s2.max_offset("L", 0) - 1, 1)
    assert [m.body[:9] for m in last.messages()] == [b"m-%07d" % (n - 5000 + 1233)]
    assert s2.check() == []


def test_power_loss_after_queues_were_flushed_past_the_commit_log(make_store: Callable[..., MessageStore]) -> None:
    """ASYNC_FLUSH: the consume queues and the checkpoint reach the disk past the commit log's last fdatasync;
    power loss then zeroes the commit log after it. Abnormal recovery started at the checkpoint's dispatch offset,
    in a later file, so the hole in the earlier one was never scanned: units pointed at zeros."""
    s = make_store(
        flush_commit_log_least_pages=10**5, flush_commit_log_thorough_interval_ms=10**9,
        flush_interval_commit_log_ms=10**6,
    )
    size = s.config.mapped_file_size_commit_log
    n = 0
    while s.commit_log.max_offset < size + 100:  # into the second file
        assert s.put_message("P", 0, b"m%05d" % n + b"x" * 200).ok
        n += 1
    assert flush_commit_log(s.commit_log, s.checkpoint, s.write_state.on_io_error)  # type: ignore[arg-type]
    flushed = s.commit_log.flushed_offset
    while s.commit_log.max_offset < 2 * size + 2000:  # into the third, never synced
        assert s.put_message("P", 0, b"m%05d" % n + b"x" * 200).ok
        n += 1
    assert s.wait_dispatched() and s._cq_flush is not None and s._cq_flush.flush_all()
    assert s.checkpoint is not None and s.checkpoint.data.logics_offset > 2 * size > flushed
    s.abandon()
    _lose_commit_log_after(s, flushed)  # every commit-log byte after the last fdatasync is lost
    s2 = make_store()
    assert s2.recovery_report is not None and s2.recovery_report.commit_log_end == flushed
    kept = s2.max_offset("P", 0)
    assert 0 < kept < n
    assert [b[:6] for b in _bodies(s2, "P")] == [b"m%05d" % i for i in range(kept)]
    assert s2.put_message("P", 0, b"after").queue_offsets == [kept]
    assert s2.check() == []


def test_a_deleted_topic_stays_deleted_after_a_crash(make_store: Callable[..., MessageStore]) -> None:
    """Recovery re-dispatched the deleted topic's entries and its queues came back, old messages and all (the
    server then listed the topic again): the deletion point is now on disk, and re-dispatch skips them. check()
    also knows the two generations apart after the restart."""
    s = make_store()
    for i in range(10):
        assert s.put_message("Gone", i % 2, b"old%d" % i, {"KEYS": f"old{i}"}).ok
    assert s.put_message("Keep", 0, b"k").ok
    assert s.wait_dispatched()
    s.delete_topic("Gone")
    assert s.put_message("Gone", 0, b"new0").ok  # created again: a new generation from offset 0
    s.abandon()
    os.unlink(s.config.checkpoint_path)  # recovery then re-dispatches the whole log, the deleted generation too
    shutil.rmtree(s.config.index_dir)  # and rebuilds the index: without the deleted generation (check() knows)
    s2 = make_store()
    assert (s2.max_offset("Gone", 0), s2.max_offset("Gone", 1), s2.max_offset("Keep", 0)) == (1, 0, 1)
    assert [m.body for m in s2.get_message("g", "Gone", 0, 0, 10).messages()] == [b"new0"]
    assert s2.check() == []
    assert s2.query_by_key("Gone", "old1") == []  # nor by key
    s2.shutdown()
    s3 = make_store()  # a clean restart: check() still tells the generations apart
    assert s3.check() == []


def _lose_commit_log_after(s: MessageStore, offset: int) -> None:
    """A power loss: every commit-log byte from ``offset`` on (what was never synced) reads back as zeros."""
    size = s.config.mapped_file_size_commit_log
    for f in s.commit_log.files.files:
        lo = max(offset - f.file_from_offset, 0)
        if lo < size:
            with open(f.path, "r+b") as fh:
                fh.seek(lo)
                fh.write(bytes(size - lo))


class _Killed(BaseException):
    """Stands for a SIGKILL inside recovery: nothing after the raise runs."""


def test_a_crash_while_recovery_truncates_leaves_the_files_contiguous(
    make_store: Callable[..., MessageStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Truncation deleted the files past the end oldest first: a crash between two deletions (a power loss, then
    a kill during the abnormal recovery) left a gap, and the next start refused the store ("not contiguous")."""
    s = make_store(
        flush_commit_log_least_pages=10**5, flush_commit_log_thorough_interval_ms=10**9,
        flush_interval_commit_log_ms=10**6,
    )
    size = s.config.mapped_file_size_commit_log
    while s.commit_log.max_offset < size + 500:
        assert s.put_message("P", 0, b"x" * 200).ok
    assert s.checkpoint is not None and flush_commit_log(s.commit_log, s.checkpoint, s.write_state.on_io_error)
    flushed = s.commit_log.flushed_offset
    while s.commit_log.max_offset < 3 * size + 500:  # two more files, never synced
        assert s.put_message("P", 0, b"x" * 200).ok
    s.abandon()
    _lose_commit_log_after(s, flushed)  # a power loss: what was not synced reads back as zeros
    deleted: list[str] = []
    real = mapped_file.MappedFile.destroy

    def destroy(f: mapped_file.MappedFile) -> None:
        deleted.append(f.path)
        if len(deleted) == 2 and "commitlog" in f.path:
            raise _Killed()
        real(f)

    monkeypatch.setattr(mapped_file.MappedFile, "destroy", destroy)
    with pytest.raises(_Killed):
        make_store(start=False).start()
    monkeypatch.setattr(mapped_file.MappedFile, "destroy", real)
    s3 = make_store()  # started: a gap in the commit log made this raise CorruptionError
    assert s3.commit_log.max_offset == flushed


@pytest.mark.parametrize("crash_at", ["save", "destroy"])
def test_a_crash_inside_delete_topic_leaves_the_topic_whole_or_gone(
    make_store: Callable[..., MessageStore], monkeypatch: pytest.MonkeyPatch, crash_at: str
) -> None:
    """The queues were destroyed before the deletion point was saved: a crash between the two brought back
    half the topic (the part after the checkpoint). Now the point is saved first, and start() removes the queues
    of a deleted generation a crash left behind: whole before the save, gone after it."""
    s = make_store(flush_interval_consume_queue_ms=10**6)
    for i in range(10):
        assert s.put_message("T", 0, b"a%d" % i).ok
    assert s.wait_dispatched() and s._cq_flush is not None and s._cq_flush.flush_all()  # the checkpoint covers a*
    for i in range(10):
        assert s.put_message("T", 0, b"b%d" % i).ok
    assert s.wait_dispatched()

    def killed(*args: object) -> list[object]:
        raise _Killed()

    if crash_at == "save":  # before the deletion point is on disk
        monkeypatch.setattr(s.topic_deletions, "save", killed)
    else:  # after it, before the queues are destroyed
        monkeypatch.setattr(s.queues, "remove_topic", killed)
    with pytest.raises(_Killed):
        s.delete_topic("T")
    s.abandon()
    monkeypatch.undo()
    s2 = make_store()
    if crash_at == "save":
        assert (s2.min_offset("T", 0), s2.max_offset("T", 0)) == (0, 20)
    else:
        assert s2.queues.find("T", 0) is None and s2.max_offset("T", 0) == 0
        assert s2.put_message("T", 0, b"new").ok and s2.wait_dispatched()  # the next generation starts at 0
        assert [m.body for m in s2.get_message("g", "T", 0, 0, 32).messages()] == [b"new"]


def test_a_deletion_point_past_the_recovered_end_comes_back_to_it(make_store: Callable[..., MessageStore]) -> None:
    """A log that lost its tail (the power loss below drops bytes delete_topic had synced, which a real one would
    keep) ended before the deletion point: the next generation's first puts landed below it, were taken for the
    deleted generation and never made readable. Recovery now brings the point back to the log's end."""
    s = make_store(
        flush_commit_log_least_pages=10**5, flush_commit_log_thorough_interval_ms=10**9,
        flush_interval_commit_log_ms=10**6,
    )
    assert s.put_message("K", 0, b"keep").ok
    assert s.checkpoint is not None and flush_commit_log(s.commit_log, s.checkpoint, s.write_state.on_io_error)
    kept = s.commit_log.flushed_offset
    for i in range(20):
        assert s.put_message("T", 0, b"old%d" % i + b"x" * 100).ok
    assert s.wait_dispatched()
    s.delete_topic("T")
    s.abandon()
    _lose_commit_log_after(s, kept)
    s2 = make_store()
    assert s2.deleted_topics["T"] == s2.commit_log.max_offset == kept
    for i in range(5):
        assert s2.put_message("T", 0, b"new%d" % i).ok
    assert s2.wait_dispatched()
    assert [m.body for m in s2.get_message("g", "T", 0, 0, 32).messages()] == [b"new%d" % i for i in range(5)]


def test_an_abnormal_start_syncs_every_recovered_file(make_store: Callable[..., MessageStore]) -> None:
    """Recovery takes what the files hold as flushed, but after a SIGKILL those pages may be in the page cache only:
    the restarted store flushed nothing of them, its checkpoint then advanced past them, and a power loss soon
    after left consume-queue units pointing at zeros that the next recovery, starting at that checkpoint, never
    scanned. An abnormal start now syncs every commit-log, consume-queue and index file before going on."""
    quiet = dict(
        flush_commit_log_least_pages=10**5, flush_commit_log_thorough_interval_ms=10**9,
        flush_interval_commit_log_ms=10**6, flush_interval_consume_queue_ms=10**6,
    )
    s = make_store(**quiet)
    size = s.config.mapped_file_size_commit_log
    i = 0
    while s.commit_log.max_offset < size + 500:  # two commit-log files, nothing synced (ASYNC)
        assert s.put_message("P", i % 2, b"m%05d" % i + b"x" * 200, {Prop.KEYS: f"k{i}"}).ok
        i += 1
    assert s.wait_dispatched()
    s.abandon()
    s2 = make_store(start=False, **quiet)
    s2.start()
    counts = s2.faults.fsync_counts
    cq_files = sum(len(cq.files.files) for cq in s2.queues.queues.values())
    assert s2.index is not None
    assert counts.get("commitlog", 0) >= len(s2.commit_log.files.files) == 2
    assert counts.get("consumequeue", 0) >= cq_files > 2
    assert counts.get("index", 0) >= len(s2.index.files) >= 1


def test_a_deletion_point_that_cannot_be_saved_deletes_nothing(
    make_store: Callable[..., MessageStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """delete_topic fails with the OSError, and the topic stays whole: the table of deletion points in memory must
    not claim a deletion the disk never recorded (check() and re-dispatch read it)."""
    s = make_store()
    for i in range(5):
        assert s.put_message("T", 0, b"a%d" % i).ok
    assert s.wait_dispatched()

    def disk_full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(json_file, "write_json_atomic", disk_full)
    with pytest.raises(OSError, match="No space left"):
        s.delete_topic("T")
    assert "T" not in s.deleted_topics
    assert [m.body for m in s.get_message("g", "T", 0, 0, 32).messages()] == [b"a%d" % i for i in range(5)]
