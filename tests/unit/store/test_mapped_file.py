"""MappedFile / MappedFileQueue: naming by start offset, preallocation, lookup, flush and truncation."""

from __future__ import annotations

import os

import pytest

from broker.errors import CorruptionError
from broker.store.faults import FaultInjector
from broker.store.mapped_file import MappedFileQueue, file_name


def test_files_are_named_by_20_digit_start_offsets_and_preallocated(tmp_path: object) -> None:
    q = MappedFileQueue(str(tmp_path), 4096, os.fdatasync)
    f0 = q.last_for_append()
    f0.append(b"x" * 4096)
    f1 = q.last_for_append()
    assert os.path.basename(f0.path) == "00000000000000000000"
    assert os.path.basename(f1.path) == file_name(4096) == "00000000000000004096"
    assert os.path.getsize(f1.path) == 4096  # preallocated at creation, not grown by writes
    assert q.find(4095) is f0 and q.find(4096) is f1 and q.find(8192) is None
    assert (q.min_offset, q.max_offset) == (0, 4096)
    q.close()


def test_flush_advances_only_after_a_successful_sync(tmp_path: object) -> None:
    faults = FaultInjector()
    q = MappedFileQueue(str(tmp_path), 4096, faults.fdatasync)
    q.last_for_append().append(b"abc")
    assert q.flush() == 3
    q.last_for_append().append(b"def")
    faults.fail_next_fsyncs(1, kind=None)
    with pytest.raises(OSError):
        q.flush()
    assert q.flushed_offset == 3
    q.close()


def test_a_failed_sync_is_final(tmp_path: object) -> None:
    """fsyncgate: the kernel may drop the pages of a failed writeback and report it once; a retry that returns 0
    (as it once did here, advancing the flushed offset) proves nothing. Only recovery after a restart can tell."""
    faults = FaultInjector()
    q = MappedFileQueue(str(tmp_path), 4096, faults.fdatasync)
    q.last_for_append().append(b"abc")
    faults.fail_next_fsyncs(1, kind=None)
    with pytest.raises(OSError, match="injected"):
        q.flush()
    calls = faults.fsync_calls
    with pytest.raises(OSError, match="failed earlier"):
        q.flush()
    assert q.flushed_offset == 0 and faults.fsync_calls == calls  # no sync attempted, nothing advanced
    q.close()


def test_a_closed_file_is_not_synced(tmp_path: object) -> None:
    """A file closed while a flusher is about to sync it (topic deleted, file expired) is skipped: fdatasync of
    the closed fd failed with EBADF, which turned the store read-only."""
    faults = FaultInjector()
    q = MappedFileQueue(str(tmp_path), 4096, faults.fdatasync)
    f = q.last_for_append()
    f.append(b"abc")
    f.close()
    assert f.flush() == 0 and faults.fsync_calls == 0
    q.close()


def test_truncate_zeroes_the_tail_and_deletes_later_files(tmp_path: object) -> None:
    q = MappedFileQueue(str(tmp_path), 4096, os.fdatasync)
    q.last_for_append().append(b"a" * 4096)
    q.last_for_append().append(b"b" * 100)
    q.truncate(1000)
    assert len(q.files) == 1 and q.max_offset == 1000
    assert q.files[0].read(990, 20) == b"a" * 10 + bytes(10)
    assert q.files[0].read(4000, 96) == bytes(96)
    q.close()


def test_load_rejects_a_gap_between_files(tmp_path: object) -> None:
    q = MappedFileQueue(str(tmp_path), 4096, os.fdatasync)
    for _ in range(3):
        q.last_for_append().append(b"z" * 4096)
    q.close()
    os.unlink(os.path.join(str(tmp_path), file_name(4096)))
    q2 = MappedFileQueue(str(tmp_path), 4096, os.fdatasync)
    with pytest.raises(CorruptionError, match="not contiguous"):
        q2.load()


def test_truncate_without_hole_punching_overwrites_with_zeros(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from broker.store import mapped_file

    monkeypatch.setattr(mapped_file, "_fallocate", None)  # as on a libc / file system without PUNCH_HOLE
    q = MappedFileQueue(str(tmp_path), 4096, os.fdatasync)
    q.last_for_append().append(b"c" * 3000)
    q.truncate(10)
    assert q.files[0].read(0, 3000) == b"c" * 10 + bytes(2990)
    q.close()
