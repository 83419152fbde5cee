"""Durable directories: a new file or directory counts as flushed only after its parent directory was fsynced
(broker/store/directory.py), so an acknowledged SYNC_FLUSH message in a freshly rolled file survives a power loss.
A power loss cannot be simulated here; these tests prove the order of the syncs and that a failed directory sync
is treated like a failed fdatasync."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.store import MessageStore, PutStatus
from broker.store import index_file as index_file_module
from broker.store.directory import fsync_directory, make_dirs
from broker.store.faults import FaultInjector
from broker.store.index_file import IndexService
from broker.store.mapped_file import MappedFileQueue


def test_make_dirs_names_the_parent_of_every_directory_it_created(tmp_path: Path) -> None:
    deep = tmp_path / "a" / "b" / "c"
    assert make_dirs(str(deep)) == [str(tmp_path), str(tmp_path / "a"), str(tmp_path / "a" / "b")]
    assert deep.is_dir()
    assert make_dirs(str(deep)) == []  # nothing created, nothing to sync
    assert make_dirs(str(tmp_path / "a" / "d")) == [str(tmp_path / "a")]
    fsync_directory(str(deep))  # a real fsync of a directory works here
    with pytest.raises(NotADirectoryError):
        (tmp_path / "file").write_bytes(b"")
        fsync_directory(str(tmp_path / "file"))


class _Recorder:
    """Syncs that really happen, recorded in order: ("file", path) / ("dir", path)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.on_file_sync: Callable[[], None] | None = None

    def file(self, fd: int) -> None:
        self.calls.append(("file", os.readlink(f"/proc/self/fd/{fd}")))
        os.fdatasync(fd)
        hook, self.on_file_sync = self.on_file_sync, None
        if hook is not None:
            hook()

    def directory(self, path: str) -> None:
        self.calls.append(("dir", path))
        fsync_directory(path)


def test_a_new_file_counts_as_flushed_only_after_its_directory_was_synced(tmp_path: Path) -> None:
    rec = _Recorder()
    q = MappedFileQueue(str(tmp_path / "cq" / "T" / "0"), 4096, rec.file, sync_dir=rec.directory)
    f0 = q.last_for_append()
    f0.append(b"x" * 100)
    assert q.flush() == 100
    made = [("dir", str(tmp_path)), ("dir", str(tmp_path / "cq")), ("dir", str(tmp_path / "cq" / "T"))]
    assert rec.calls == [*made, ("dir", q.directory), ("file", f0.path)]  # every directory before the data
    rec.calls.clear()
    f0.append(b"y" * 100)
    assert q.flush() == 200
    assert rec.calls == [("file", f0.path)]  # no new entry: no directory sync
    q.close()


def test_a_file_created_during_a_flush_waits_for_the_next_directory_sync(tmp_path: Path) -> None:
    """The flusher takes the files and the directories to sync together: a file created while it syncs (a put
    rolling the commit log) is not counted as flushed by that pass, whose directory sync came before it."""
    rec = _Recorder()
    q = MappedFileQueue(str(tmp_path), 4096, rec.file, sync_dir=rec.directory)
    f0 = q.last_for_append()
    f0.append(b"x" * 4096)
    created = []

    def roll() -> None:
        f1 = q.last_for_append()
        f1.append(b"z" * 10)
        created.append(f1)

    rec.on_file_sync = roll
    assert q.flush() == 4096  # f0 only: f1 appeared after this pass took its snapshot
    (f1,) = created
    rec.calls.clear()
    assert q.flush() == 4096 + 10
    assert rec.calls == [("dir", q.directory), ("file", f1.path)]
    q.close()


def test_a_failed_directory_sync_is_final(tmp_path: Path) -> None:
    faults = FaultInjector()
    q = MappedFileQueue(str(tmp_path), 4096, faults.syncer("commitlog"), sync_dir=faults.dir_syncer("commitlog"))
    q.last_for_append().append(b"abc")
    faults.fail_next_fsyncs(1, kind="commitlog-dir")
    with pytest.raises(OSError, match="injected directory fsync failure"):
        q.flush()
    assert q.flushed_offset == 0 and faults.fsync_counts.get("commitlog", 0) == 0  # the data was not counted
    with pytest.raises(OSError, match=f"fsync of directory {tmp_path} failed earlier"):
        q.flush()
    assert q.flushed_offset == 0
    q.close()


def test_sync_flush_acknowledges_a_rolled_file_only_after_the_directory_sync(
    make_store: Callable[..., MessageStore],
) -> None:
    s = make_store(flush_disk_type="SYNC_FLUSH")
    assert s.faults.fsync_counts.get("store-dir", 0) >= 1  # the abort file's directory, at start
    body = b"b" * 1000
    files = len(s.commit_log.files.files)
    while len(s.commit_log.files.files) == files:
        assert s.put_message("D", 0, body).status is PutStatus.PUT_OK
    assert s.faults.fsync_counts["commitlog-dir"] >= 2  # the first file's and the rolled one's
    # the next roll's directory sync fails: that put is not acknowledged, and the store stops taking writes
    s.faults.fail_next_fsyncs(1, kind="commitlog-dir")
    files = len(s.commit_log.files.files)
    statuses = []
    while len(s.commit_log.files.files) == files:
        statuses.append(s.put_message("D", 0, body).status)
    assert statuses[-1] is PutStatus.FLUSH_DISK_TIMEOUT
    assert set(statuses[:-1]) <= {PutStatus.PUT_OK}
    assert not s.is_writable()
    assert s.put_message("D", 0, body).status is PutStatus.SERVICE_NOT_AVAILABLE


def test_consume_queue_and_index_directories_are_synced_by_their_flush(
    make_store: Callable[..., MessageStore],
) -> None:
    s = make_store()
    assert s.put_message("NewTopic", 3, b"x", {"KEYS": "k"}).status is PutStatus.PUT_OK
    assert s.wait_dispatched()
    s.flush()  # commit log, consume queues and index
    assert s.faults.fsync_counts.get("consumequeue-dir", 0) >= 2  # consumequeue/ (for NewTopic/) and NewTopic/
    assert s.faults.fsync_counts.get("index-dir", 0) >= 1
    assert s.check() == []


def test_index_file_names_stay_ordered_when_the_clock_steps_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Index files are loaded in name order (local time in ms, as RocketMQ names them). A clock stepping back
    (NTP, or the local time at a DST change) must not give the newest file the smallest name, or after a restart
    it would be taken for the oldest."""
    now_ns = [1_790_000_000_000 * 1_000_000]
    monkeypatch.setattr(index_file_module.time, "time_ns", lambda: now_ns[0])
    idx = IndexService(str(tmp_path), slots=4, entries=4, sync=os.fdatasync)
    phys = 0
    for step_ms in (0, -3_600_000, -5, 0):  # one hour back, then a little more, then standing still
        now_ns[0] += step_ms * 1_000_000
        for _ in range(3):  # entries=4 holds 3 (entry 0 is unused): each round fills one file
            idx.put("T", ["k"], phys, 1)
            phys += 100
    names = [os.path.basename(f.path) for f in idx.files]
    assert len(names) == 4 and names == sorted(names) and len(set(names)) == 4
    idx.flush()
    reloaded = IndexService(str(tmp_path), slots=4, entries=4, sync=os.fdatasync)
    reloaded.load()
    assert [f.path for f in reloaded.files] == [f.path for f in idx.files]
    assert reloaded.lookup("T", "k", 100, 0, 2**62)[0] == phys - 100  # newest first, from the newest file
    for f in idx.files + reloaded.files:
        f.close()


def test_a_topic_deleted_during_the_queue_flush_leaves_the_store_writable(
    make_store: Callable[..., MessageStore],
) -> None:
    """The consume-queue flusher takes its list of queues, then flushes each; a topic deleted in between had
    its new directories removed, and their fsync (FileNotFoundError) turned the whole store read-only."""
    s = make_store(flush_interval_consume_queue_ms=600_000)
    assert s.put_message("A", 0, b"x").ok and s.put_message("Gone", 0, b"y").ok
    assert s.wait_dispatched()
    first = s.queues.find("A", 0)
    assert first is not None and s._cq_flush is not None
    flush_first = first.flush

    def flush_then_delete() -> None:  # the admin's delete lands between two queues of one flush pass
        flush_first()
        s.delete_topic("Gone")

    first.flush = flush_then_delete  # type: ignore[method-assign]
    assert s._cq_flush.flush_all()
    assert s.is_writable() and s.put_message("A", 0, b"z").status is PutStatus.PUT_OK
    assert s.wait_dispatched() and s.check() == []


def test_a_flush_beside_another_waits_for_the_directory_sync(tmp_path: Path) -> None:
    """Two flushes at once (a request thread's beside the flusher's): the second found the directory list
    already taken by the first, synced the new file and reported it flushed while the directory's fsync was still
    under way, and would have kept that report had the fsync failed."""
    release = threading.Event()
    entered = threading.Event()

    def slow_dir_sync(path: str) -> None:
        entered.set()
        assert release.wait(10)
        fsync_directory(path)

    q = MappedFileQueue(str(tmp_path / "q"), 4096, os.fdatasync, sync_dir=slow_dir_sync)
    q.last_for_append().append(b"x" * 100)
    first = threading.Thread(target=q.flush)
    first.start()
    assert entered.wait(10)
    second: list[int] = []
    t = threading.Thread(target=lambda: second.append(q.flush()))
    t.start()
    t.join(0.3)
    assert second == [] and q.flushed_offset == 0  # waits on the directory like the first
    release.set()
    first.join(10)
    t.join(10)
    assert second == [100] and q.flushed_offset == 100
    q.close()


def test_a_failed_index_directory_sync_is_tried_again(tmp_path: Path) -> None:
    faults = FaultInjector()
    idx = IndexService(str(tmp_path / "index"), 4, 8, faults.syncer("index"), faults.dir_syncer("index"))
    idx.put("T", ["k"], 100, 1)
    faults.fail_next_fsyncs(1, kind="index-dir")
    with pytest.raises(OSError, match="injected"):
        idx.flush()
    idx.flush()  # the directories still unsynced are synced now; before, they were forgotten
    assert faults.fsync_counts["index-dir"] >= 3  # the failed one, then it and its parent's again
    for f in idx.files:
        f.close()


def test_a_file_system_without_directory_fsync_is_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Some FUSE and network mounts answer EINVAL to fsync of a directory: their entries are durable some other
    way or not at all, and the store must not turn read-only at its first new file (PostgreSQL does the same)."""
    real_fsync = os.fsync

    def no_directory_fsync(fd: int) -> None:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EINVAL, "Invalid argument")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", no_directory_fsync)
    fsync_directory(str(tmp_path))  # no error
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(OSError, match="I/O error"):
        fsync_directory(str(tmp_path))  # a real failure still is one
