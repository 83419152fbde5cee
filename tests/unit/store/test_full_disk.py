"""A store on a file system that really fills (a small tmpfs): every acknowledged message stays readable while the
disk is full and after a restart, nothing unexpired is deleted for room unless clean_file_forcibly_enable says
so, and writes resume by themselves once space is freed."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from small_fs import fill, free_bytes, tmpfs

from broker.format.message import encode_entry, encode_properties
from broker.semantics.journal import Journal
from broker.store import GetStatus, MessageStore, PutStatus, StoreConfig
from broker.store.store_results import PutResult

FS_MIB = 8
COMMIT_LOG_FILE = 256 * 1024
BODY = b"m" * 900
# Thresholds at 100%: these tests are about a real ENOSPC, which the 90% refusal would otherwise come before.
AT_FULL = dict(disk_max_used_space_ratio=100, disk_space_clean_forcibly_ratio=100, disk_space_warning_level_ratio=100)


def _config(path: Path, **overrides: Any) -> StoreConfig:
    settings: dict[str, Any] = dict(
        mapped_file_size_commit_log=COMMIT_LOG_FILE, mapped_file_size_consume_queue=50 * 20, max_hash_slot_num=64,
        max_index_num=1024, max_message_size=4096, max_batch_bytes=64 * 1024, flush_disk_type="SYNC_FLUSH",
        flush_interval_consume_queue_ms=20, delete_when="", **AT_FULL,
    )
    return StoreConfig(store_path=str(path), **{**settings, **overrides})


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "fs", FS_MIB) as mount:
        yield mount


@pytest.fixture
def open_store(small_disk: Path) -> Iterator[Callable[..., MessageStore]]:
    """``open_store(**overrides)`` -> a started store on the small disk; every store still running at the end must
    pass check() and is shut down before the file system is unmounted."""
    started: list[MessageStore] = []

    def factory(**overrides: Any) -> MessageStore:
        store = MessageStore(_config(small_disk / "store", **overrides))
        store.start()
        started.append(store)
        return store

    yield factory
    problems = [p for s in started if s._running for p in s.check()]
    for s in started:
        if s._running:
            s.shutdown()
    assert problems == []


def _batch(topic: str, first: int, count: int, queues: int = 1) -> bytes:
    return b"".join(
        encode_entry(topic.encode(), i % queues, b"%06d" % i + BODY, encode_properties({"KEYS": f"k{i}"}))
        for i in range(first, first + count)
    )


def _read_all(s: MessageStore, topic: str, queue_id: int) -> list[bytes]:
    out: list[bytes] = []
    offset = s.min_offset(topic, queue_id)
    while True:
        r = s.get_message("g", topic, queue_id, offset, max_msgs=256, max_bytes=1 << 20)
        if r.status is not GetStatus.FOUND:
            return out
        out += [m.body[:6] for m in r.messages()]
        offset = r.next_begin_offset


def _acked_bodies(results: list[tuple[int, PutResult]], per_put: int) -> list[bytes]:
    return [b"%06d" % i for first, r in results if r.ok for i in range(first, first + per_put)]


def test_next_commit_log_file_that_cannot_be_created(open_store: Callable[..., MessageStore], small_disk: Path) -> None:
    """Batches until the next commit-log file does not fit: refused with SERVICE_NOT_AVAILABLE and nothing stored,
    every acknowledged one readable while full, after a crash and restart, and sends resume once space is freed."""
    s = open_store()
    fill(small_disk, leave=COMMIT_LOG_FILE + COMMIT_LOG_FILE // 2)  # room for one more commit-log file, not two
    results: list[tuple[int, PutResult]] = []
    per_put, n = 20, 0
    while True:
        r = s.put_batch(_batch("T", n, per_put))
        results.append((n, r))
        n += per_put
        if not r.ok:
            break
        assert n < 100_000, "the disk never filled"
    refused = results[-1][1]
    assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE and "disk full" in refused.error, refused
    acked = _acked_bodies(results, per_put)
    files = [f.path for f in s.commit_log.files.files]
    assert s.wait_dispatched()
    assert _read_all(s, "T", 0) == acked  # reads go on while the disk is full
    assert s.query_by_key("T", "k0")[0].body[:6] == b"000000"
    assert not s.is_writable() and s.disk_full
    still = s.put_message("T", 0, b"still full")
    # refused for the commit-log file that does not fit or, when the last units' dispatch met ENOSPC too (whether
    # the file system still had their room is a matter of its block accounting), for the disk reserve it released
    assert still.status is PutStatus.SERVICE_NOT_AVAILABLE and (
        "next commit-log file" in still.error or "disk reserve" in still.error), still
    assert s.check() == []

    s.abandon()  # a crash while the disk is full; restarted once space is back
    (small_disk / "filler").unlink()
    s2 = open_store()
    assert [f.path for f in s2.commit_log.files.files] == files  # nothing deleted, nothing left half-made
    assert _read_all(s2, "T", 0) == acked
    assert s2.check() == []
    assert s2.put_batch(_batch("T", n, per_put)).ok


def test_writes_resume_by_themselves_once_space_is_freed(
    open_store: Callable[..., MessageStore], small_disk: Path
) -> None:
    s = open_store()
    fill(small_disk, leave=COMMIT_LOG_FILE // 2)
    first = None
    for i in range(10_000):
        r = s.put_message("T", 0, b"%06d" % i + BODY)
        if not r.ok:
            first = r
            break
    assert first is not None and first.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert s.disk_full
    assert free_bytes(small_disk) < COMMIT_LOG_FILE
    (small_disk / "filler").unlink()
    assert s.cleanup is not None
    s.cleanup.clean_once(clean=False)  # what the service does within DISK_PROBE_INTERVAL_S
    assert not s.disk_full and s.put_message("T", 0, b"after").ok


def test_dispatch_cut_by_enospc_in_the_middle_of_a_batch(
    open_store: Callable[..., MessageStore], small_disk: Path
) -> None:
    """Without a disk reserve: a batch to 40 new queues is stored (the commit-log file was allocated whole) but its
    consume-queue units stop part way for want of space. Sends are refused meanwhile, reads of what is indexed go
    on; after a crash and a restart every acknowledged message is read back and check() is clean."""
    s = open_store(disk_reserve_bytes=0)
    assert s.put_message("W", 0, b"first").ok
    assert s.wait_dispatched()
    fill(small_disk, leave=3 * 4096)
    r = s.put_batch(_batch("W", 0, 40, queues=40))
    assert r.ok, r  # on disk: the commit log needed no new space
    time.sleep(0.2)
    assert s.dispatcher.dispatched_offset < s.commit_log.max_offset  # cut part way
    assert not s.is_writable()
    refused = s.put_message("W", 0, b"no room")
    assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE and "No space" in refused.error, refused
    assert _read_all(s, "W", 0)[:1] == [b"first"]  # what was indexed stays readable
    s.abandon()
    (small_disk / "filler").unlink()
    s2 = open_store(disk_reserve_bytes=0)
    assert _read_all(s2, "W", 0) == [b"first", b"000000"]
    assert [_read_all(s2, "W", q) for q in range(1, 40)] == [[b"%06d" % q] for q in range(1, 40)]
    assert s2.check() == []
    assert s2.put_message("W", 0, b"again").ok


def test_the_disk_reserve_makes_stored_messages_readable_on_a_full_disk(
    open_store: Callable[..., MessageStore], small_disk: Path
) -> None:
    """The same batch with the disk reserve (the default): dispatch meets ENOSPC, the store gives the reserve back,
    and every acknowledged message is readable while the disk stays full; new sends may not take that room, and
    resume once space is freed, with the reserve taken again."""
    s = open_store(disk_reserve_bytes=1 << 20)
    assert s.disk_reserve.held
    assert s.put_message("W", 0, b"first").ok
    assert s.wait_dispatched()
    fill(small_disk)
    assert s.put_batch(_batch("W", 0, 40, queues=40)).ok
    assert s.wait_dispatched(5)  # with the reserve's room
    assert not s.disk_reserve.held
    assert [_read_all(s, "W", q) for q in range(40)] == [[b"first", b"000000"]] + [[b"%06d" % q] for q in range(1, 40)]
    refused = s.put_message("W", 0, b"no room")
    assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE and "disk reserve" in refused.error, refused
    assert s.cleanup is not None
    s.cleanup.clean_once(clean=False)
    assert not s.is_writable()  # the probe does not lift it while the reserve cannot be taken again
    (small_disk / "filler").unlink()
    s.cleanup.clean_once(clean=False)
    assert s.disk_reserve.held and s.is_writable()
    assert s.put_message("W", 0, b"again").ok
    assert s.check() == []


def test_a_start_on_a_full_disk_fails_cleanly_and_damages_nothing(
    open_store: Callable[..., MessageStore], small_disk: Path
) -> None:
    """Recovery that must write consume-queue units finds no room: the start fails with the OSError (it once died
    of SIGBUS, reading a hole of a consume-queue file through its mapping on a full tmpfs), and a start once space
    is back recovers everything. (No disk reserve: with one, the first store had dispatched everything.)"""
    s = open_store(disk_reserve_bytes=0)
    assert s.put_message("W", 0, b"first").ok
    assert s.wait_dispatched()
    fill(small_disk, leave=3 * 4096)
    assert s.put_batch(_batch("W", 0, 40, queues=40)).ok
    s.abandon()
    with pytest.raises(OSError) as failed:
        open_store(disk_reserve_bytes=0)
    assert failed.value.errno == errno.ENOSPC
    (small_disk / "filler").unlink()
    s2 = open_store(disk_reserve_bytes=0)
    assert [_read_all(s2, "W", q) for q in range(40)] == [[b"first", b"000000"]] + [[b"%06d" % q] for q in range(1, 40)]
    assert s2.check() == []


@pytest.mark.parametrize("forcibly", [False, True])
def test_forced_cleaning_deletes_unexpired_messages_only_when_enabled(
    open_store: Callable[..., MessageStore], small_disk: Path, forcibly: bool
) -> None:
    """At the default thresholds on a really full disk: by default every file stays and sends are refused;
    clean_file_forcibly_enable brings back RocketMQ's forced cleaning, which deletes the oldest files and the
    unconsumed messages in them (a reader of offset 0 gets OFFSET_TOO_SMALL)."""
    s = open_store(clean_file_forcibly_enable=forcibly, disk_max_used_space_ratio=75,
                   disk_space_clean_forcibly_ratio=85, disk_space_warning_level_ratio=90)
    for n in range(0, 4 * COMMIT_LOG_FILE // len(BODY), 20):
        assert s.put_batch(_batch("T", n, 20)).ok
    s.flush()
    files = [f.path for f in s.commit_log.files.files]
    fill(small_disk)
    assert s.cleanup is not None
    report = s.cleanup.clean_once(clean=False)
    assert report.disk_ratio_percent >= 85
    if forcibly:
        assert report.deleted_commit_log_files >= 1 and files[0] not in [f.path for f in s.commit_log.files.files]
        assert s.get_message("g", "T", 0, 0).status is GetStatus.OFFSET_TOO_SMALL
    else:
        assert report.deleted_commit_log_files == 0 and [f.path for f in s.commit_log.files.files] == files
        assert _read_all(s, "T", 0)[0] == b"000000"
        assert s.disk_full and not s.is_writable()


def test_the_journal_falls_behind_on_a_full_disk_and_catches_up_by_a_checkpoint(small_disk: Path) -> None:
    """The pop and timer journal on a disk that fills during an append: the part written is cut off (a torn record
    once hid every later one), the service goes on with its changes in memory, and the checkpoint written once
    space returns holds them; recovery reads that state and the records after it."""
    folder = small_disk / "journal"
    journal = Journal(str(folder))
    journal.recover(lambda state: None, lambda record: None)
    journal.append({"n": 0})
    fill(small_disk, leave=4096)
    journal.append({"n": 1, "pad": "x" * 64 * 1024})  # larger than the room left: part of it lands, then ENOSPC
    journal.append({"n": 2})  # not written either: replay must not skip record 1
    assert journal.due
    fill(small_disk)  # and the room the cut part gave back
    for _ in range(3):  # still full: tried again at each due check (a second for the pop service)
        with pytest.raises(OSError) as failed:
            journal.checkpoint({"applied": [0, 1, 2]})
        assert failed.value.errno == errno.ENOSPC
    assert journal.due
    assert sorted(os.listdir(folder)) == ["journal.1", "journal.2"]  # not a new empty journal per attempt
    (small_disk / "filler").unlink()
    journal.checkpoint({"applied": [0, 1, 2]})
    assert not journal.due
    journal.append({"n": 3})
    journal.close()
    again = Journal(str(folder))
    restored: list[dict[str, Any] | None] = []
    seen: list[int] = []
    again.recover(restored.append, lambda record: seen.append(record["n"]))
    again.close()
    assert restored == [{"applied": [0, 1, 2]}] and seen == [3]


def test_a_decision_refused_by_a_full_disk_says_try_later_and_decides_nothing(
    open_store: Callable[..., MessageStore], small_disk: Path
) -> None:
    """A coordinator's decision the full store refuses is SERVICE_NOT_AVAILABLE (the exactly-once sink waits that
    out), not a failed transaction, and nothing is decided; once space is back the same decision is recorded."""
    from broker.errors import ServiceNotAvailableError
    from broker.format.txn_decision import Share, make_decision
    from broker.semantics.decision_log import DecisionLog

    s = open_store()
    log = DecisionLog(s, str(small_disk / "config"))
    log.start()
    fill(small_disk, leave=COMMIT_LOG_FILE // 2)
    while s.put_message("T", 0, BODY).ok:  # until the store says the disk is full
        pass
    decision = make_decision("spark:q:7:r1@b", True, [Share("a", ("a-att",), 3)])
    with pytest.raises(ServiceNotAvailableError, match="could not be stored"):
        log.record(decision)
    assert log.get(decision.txn_id) is None
    (small_disk / "filler").unlink()
    assert s.cleanup is not None
    s.cleanup.clean_once(clean=False)  # what the service does within DISK_PROBE_INTERVAL_S
    assert log.record(decision).commit and log.get(decision.txn_id) is not None
    log.shutdown()


def test_a_decision_stands_when_its_scan_position_cannot_be_saved(
    open_store: Callable[..., MessageStore], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A coordinator on a full disk answered a decision INTERNAL (`OSError: No space left on device`, seen in a
    soak): the decision was in the log, and saving the decision log's scan position, a new file, failed. The decision
    stands and is answered; stopping and starting on the full disk work and find every decision; the position is
    saved once there is room. The position's directory is a file system of its own that fills, so that the store's
    own flushes (which a full disk makes read-only) cannot refuse the decision first."""
    from broker.format.txn_decision import Share, make_decision
    from broker.semantics import decision_log

    monkeypatch.setattr(decision_log, "PERSIST_INTERVAL_S", 0.0)  # every decision saves the position
    s = open_store()
    with tmpfs(tmp_path / "config-fs", 1) as config_fs:
        config = config_fs / "config"
        log = decision_log.DecisionLog(s, str(config))
        log.start()
        first = log.record(make_decision("spark:q:1:r1@b", True, [Share("a", ("a-att",), 3)]))
        filler = fill(config_fs)
        second = log.record(make_decision("spark:q:2:r1@b", False))
        assert not second.commit and log.get(second.txn_id) == second
        assert not (config / f"{decision_log.STATE_FILE}.tmp").exists()  # no half-written copy left
        log.shutdown()  # the disk still full: the position is not saved, and stopping does not fail
        again = decision_log.DecisionLog(s, str(config))
        again.start()  # nor does starting
        assert again.get(first.txn_id) == first and again.get(second.txn_id) == second
        state = config / decision_log.STATE_FILE
        saved = state.stat().st_mtime_ns
        filler.unlink()
        again.shutdown()  # room again: saved
        assert state.stat().st_mtime_ns > saved
