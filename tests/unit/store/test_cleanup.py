"""Expiry by time (at delete_when) and by disk ratio (75% expired-only, 85% forced only with
clean_file_forcibly_enable, 90% refuse writes)."""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable

import pytest

from broker.format.message import Prop
from broker.store import GetStatus, MessageStore, PutStatus

HOUR_MS = 3600 * 1000


class DiskProbe:
    """The injectable disk-usage probe: tests set the ratio the store sees."""

    def __init__(self) -> None:
        self.ratio = 0.10

    def __call__(self, path: str) -> float:
        return self.ratio


def _fill(s: MessageStore, n: int = 140) -> None:
    for i in range(n):
        assert s.put_message("E", 0, b"%04d" % i + b"." * 400, {Prop.KEYS: f"k{i}"}).ok
    s.flush()


def _age_files(s: MessageStore, count: int, hours: float) -> None:
    """Make the oldest ``count`` commit-log files look ``hours`` old (expiry uses mtime, as RocketMQ)."""
    old = time.time() - hours * 3600
    for f in s.commit_log.files.files[:count]:
        os.utime(f.path, (old, old))


def test_expired_files_go_at_delete_when(make_store: Callable[..., MessageStore]) -> None:
    probe = DiskProbe()
    hour = time.localtime().tm_hour
    s = make_store(file_reserved_time_hours=1, delete_when=f"{(hour + 12) % 24:02d}", disk_usage_probe=probe)
    _fill(s)
    n_files = len(s.commit_log.files.files)
    assert n_files >= 4
    _age_files(s, 2, hours=2)
    assert s.cleanup is not None
    now = time.time_ns() // 1_000_000
    assert s.cleanup.clean_once(now).deleted_commit_log_files == 0  # not the hour, disk fine
    s.config.delete_when = f"{(hour + 1) % 24:02d};{hour:02d}"
    report = s.cleanup.clean_once(now)
    assert report.deleted_commit_log_files == 2  # only the two expired ones
    assert len(s.commit_log.files.files) == n_files - 2
    lo = s.min_offset("E", 0)
    r = s.get_message("g", "E", 0, 0)
    assert (r.status, r.next_begin_offset) == (GetStatus.OFFSET_TOO_SMALL, lo)
    assert s.get_message("g", "E", 0, lo).status is GetStatus.FOUND
    assert report.deleted_consume_queue_files >= 1
    assert s.query_by_key("E", "k0") == []
    assert s.check() == []


def test_disk_ratio_over_75_deletes_expired_files_at_once(make_store: Callable[..., MessageStore]) -> None:
    probe = DiskProbe()
    s = make_store(file_reserved_time_hours=1, delete_when="", disk_usage_probe=probe)
    _fill(s)
    _age_files(s, 1, hours=2)
    assert s.cleanup is not None
    probe.ratio = 0.80
    assert s.cleanup.clean_once().deleted_commit_log_files == 1  # expired only, not forced yet
    assert s.cleanup.clean_once().deleted_commit_log_files == 0
    assert s.is_writable()
    assert s.check() == []


def test_disk_ratio_over_85_deletes_nothing_unexpired_by_default(
    make_store: Callable[..., MessageStore], caplog: pytest.LogCaptureFixture
) -> None:
    """Unexpired files hold acknowledged messages: disk pressure alone deletes none of them, and says so once."""
    probe = DiskProbe()
    s = make_store(file_reserved_time_hours=72, delete_when="", disk_usage_probe=probe)
    _fill(s)
    files = [f.path for f in s.commit_log.files.files]
    assert s.cleanup is not None and len(files) > 1
    caplog.set_level(logging.WARNING)
    for ratio in (0.87, 0.95, 1.0):
        probe.ratio = ratio
        report = s.cleanup.clean_once()
        assert report.deleted_commit_log_files == 0 and report.deleted_consume_queue_files == 0
    assert [f.path for f in s.commit_log.files.files] == files
    assert s.get_message("g", "E", 0, 0).status is GetStatus.FOUND  # the oldest message is still there
    assert not s.is_writable() and s.disk_full  # sends are refused instead
    said = [r.getMessage() for r in caplog.records if "clean_file_forcibly_enable is off" in r.getMessage()]
    assert len(said) == 1, said
    probe.ratio = 0.5
    s.cleanup.clean_once()
    assert s.is_writable() and not s.disk_full


def test_disk_ratio_over_85_deletes_even_unexpired_files_when_enabled(
    make_store: Callable[..., MessageStore],
) -> None:
    """clean_file_forcibly_enable: RocketMQ's forced cleaning, which deletes unexpired (unconsumed) messages."""
    probe = DiskProbe()
    s = make_store(file_reserved_time_hours=72, delete_when="", disk_usage_probe=probe, delete_files_batch_max=2,
                   clean_file_forcibly_enable=True)
    _fill(s)
    n_files = len(s.commit_log.files.files)
    assert s.cleanup is not None
    probe.ratio = 0.87
    assert s.cleanup.clean_once().deleted_commit_log_files == 2  # at most delete_files_batch_max per pass
    for _ in range(10):
        s.cleanup.clean_once()
    assert len(s.commit_log.files.files) == 1  # never the file being written
    assert n_files > 1 and s.is_writable()
    assert s.check() == []


def test_writes_refused_over_90_and_accepted_after_freeing(make_store: Callable[..., MessageStore]) -> None:
    probe = DiskProbe()
    s = make_store(file_reserved_time_hours=72, delete_when="", disk_usage_probe=probe, delete_files_batch_max=1)
    _fill(s, 40)
    assert s.cleanup is not None
    probe.ratio = 0.95
    report = s.cleanup.clean_once()
    assert report.disk_full and report.deleted_commit_log_files == 0  # forced cleaning is off by default
    assert not s.is_writable()
    refused = s.put_message("E", 0, b"no room")
    assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE and "90%" in refused.error
    assert s.put_batch(b"anything").status is PutStatus.SERVICE_NOT_AVAILABLE
    lo = s.min_offset("E", 0)
    assert s.get_message("g", "E", 0, lo).status is GetStatus.FOUND  # reads go on
    probe.ratio = 0.60  # space freed
    assert not s.cleanup.clean_once(clean=False).disk_full
    assert s.is_writable()
    assert s.put_message("E", 0, b"room again").status is PutStatus.PUT_OK
    assert s.check() == []


def test_background_service_notices_a_full_disk(make_store: Callable[..., MessageStore]) -> None:
    probe = DiskProbe()
    s = make_store(disk_usage_probe=probe, delete_when="")
    probe.ratio = 0.99
    deadline = time.monotonic() + 5
    while s.is_writable() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not s.is_writable()
    probe.ratio = 0.2
    deadline = time.monotonic() + 5
    while not s.is_writable() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert s.is_writable()


def test_enospc_creating_a_file_refuses_writes_until_space_returns(make_store: Callable[..., MessageStore]) -> None:
    probe = DiskProbe()
    s = make_store(disk_usage_probe=probe, delete_when="")
    s.faults.fail_allocations(errno.ENOSPC)  # preallocation of the next file fails: the disk is full
    results = [s.put_message("N", 0, b"." * 1000) for _ in range(20)]  # enough to need a second file
    statuses = [r.status for r in results]
    assert PutStatus.SERVICE_NOT_AVAILABLE in statuses
    failed = results[statuses.index(PutStatus.SERVICE_NOT_AVAILABLE)]
    assert "disk full" in failed.error
    assert not s.is_writable()
    s.faults.fail_allocations(None)
    assert s.cleanup is not None
    s.cleanup.clean_once(clean=False)  # the probe says the disk has room again
    assert s.put_message("N", 0, b"after").ok
    assert s.check() == []


def test_other_create_failures_are_create_mapped_file_failed(make_store: Callable[..., MessageStore]) -> None:
    s = make_store()
    s.faults.fail_allocations(errno.EIO)
    statuses = {s.put_message("N", 0, b"." * 1000).status for _ in range(20)}
    assert PutStatus.CREATE_MAPPED_FILE_FAILED in statuses
    s.faults.fail_allocations(None)
    assert s.put_message("N", 0, b"after").ok
    assert s.check() == []


def test_a_restart_between_expiry_and_queue_cleanup(make_store: Callable[..., MessageStore]) -> None:
    """Killed after deleting commit-log files but before cleaning the consume queues: the restarted queue's
    minimum looked only at its first file (an offset whose message was gone), and its expired files stayed until
    some later pass expired another commit-log file, perhaps days later."""
    s = make_store(disk_usage_probe=DiskProbe(), delete_when="")
    _fill(s, 150)
    s.commit_log.files.delete_first(3)  # the first half of a cleanup pass ...
    s.abandon()  # ... and the process dies
    s = make_store(disk_usage_probe=DiskProbe(), delete_when="")
    cq = s.queues.find("E", 0)
    assert cq is not None
    first_readable = next(q for q in range(150) if cq.unit(q).commitlog_offset >= s.min_phys_offset())  # type: ignore[union-attr]
    assert s.min_offset("E", 0) == first_readable > 0  # at load, past the wholly expired files
    r = s.get_message("g", "E", 0, s.min_offset("E", 0))
    assert r.status is GetStatus.FOUND and r.queue_offsets[0] == first_readable
    assert s.cleanup is not None
    report = s.cleanup.clean_once(manual=True)  # a pass that expires nothing new still cleans the queues
    assert report.deleted_commit_log_files == 0 and report.deleted_consume_queue_files > 0
    assert s.min_offset("E", 0) == first_readable and s.check() == []


def test_a_topic_deleted_during_a_cleanup_pass(make_store: Callable[..., MessageStore]) -> None:
    """delete_topic closed a queue's files while the pass read them: ValueError escaped the pass, and the queues
    after it and the index were not cleaned."""
    s = make_store(disk_usage_probe=DiskProbe(), delete_when="", file_reserved_time_hours=1)
    for i in range(150):
        for topic in ("Gone", "Keep"):
            assert s.put_message(topic, 0, b"%04d" % i + b"." * 200).ok
    s.flush()
    _age_files(s, 3, 2)
    gone = s.queues.find("Gone", 0)
    assert gone is not None
    expire = gone.delete_expired

    def delete_topic_meanwhile(cl_min: int) -> int:
        assert gone is not None
        taken = gone.files.files  # the pass's view of the files ...
        s.delete_topic("Gone")  # ... when the admin's delete closes them
        gone.files.files = taken
        return expire(cl_min)

    gone.delete_expired = delete_topic_meanwhile  # type: ignore[method-assign]
    assert s.cleanup is not None
    report = s.cleanup.clean_once(manual=True)
    assert report.deleted_commit_log_files == 3 and report.deleted_consume_queue_files > 0  # Keep's
    keep = s.queues.find("Keep", 0)
    assert keep is not None and keep.unit(s.min_offset("Keep", 0)).commitlog_offset >= s.min_phys_offset()  # type: ignore[union-attr]
    assert s.check() == []
