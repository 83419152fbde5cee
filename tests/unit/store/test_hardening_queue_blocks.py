"""Consume-queue files reserve their disk blocks as units are written, not whole when created: every queue has a
file (6 MB by default), and a 38 KB batch naming 400 new queues took 2.3 GB of disk at once."""

from __future__ import annotations

import errno
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.format.batch import split_entries
from broker.format.message import encode_entry
from broker.store import MessageStore, PutStatus
from broker.store.consume_queue import CQ_DTYPE, CQ_UNIT, ConsumeQueue
from broker.store.mapped_file import RESERVE_FIRST_BYTES
from broker.store.store_config import CQ_UNIT_SIZE

CQ_FILE_BYTES = 30_000 * CQ_UNIT_SIZE  # 600 KB: one file per queue is enough to show what preallocation cost


def allocated_bytes(root: Path) -> int:
    """Disk blocks held by the files under ``root`` (what df counts, not the files' sizes)."""
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


def test_a_new_queue_takes_a_page_not_a_file(make_store: Callable[..., MessageStore], tmp_path: Path) -> None:
    store = make_store(mapped_file_size_consume_queue=CQ_FILE_BYTES, max_batch_bytes=1 << 20,
                       mapped_file_size_commit_log=4 << 20)
    topics, queues = 16, 8
    batch = b"".join(encode_entry(f"New{t}".encode(), q, b"x") for t in range(topics) for q in range(queues))
    assert store.put_batch(batch).ok
    assert store.wait_dispatched()
    root = tmp_path / "store" / "consumequeue"
    files = [p for p in root.rglob("*") if p.is_file()]
    assert len(files) == topics * queues and all(p.stat().st_size == CQ_FILE_BYTES for p in files)
    assert allocated_bytes(root) <= topics * queues * RESERVE_FIRST_BYTES  # was topics * queues * CQ_FILE_BYTES


def test_blocks_are_reserved_ahead_of_every_write(make_store: Callable[..., MessageStore], tmp_path: Path) -> None:
    """Every unit written lies in reserved blocks (a write into a hole of a full disk would be a SIGBUS); the
    reservation grows in steps, so a busy queue makes few fallocate calls."""
    store = make_store(mapped_file_size_consume_queue=CQ_FILE_BYTES, max_batch_bytes=1 << 20,
                       mapped_file_size_commit_log=4 << 20)
    path = tmp_path / "store" / "consumequeue" / "Busy" / "0" / f"{0:020d}"
    for n in (1, 300, 5000, 20_000):
        have = store.max_offset("Busy", 0)
        for chunk, _ in split_entries(encode_entry(b"Busy", 0, b"") * (n - have), 1 << 19):
            assert store.put_batch(chunk).ok
        assert store.wait_dispatched()
        cq = store.queues.find("Busy", 0)
        assert cq is not None and store.max_offset("Busy", 0) == n
        written = n * CQ_UNIT_SIZE
        f = cq.files.files[0]
        assert written <= f.reserved <= max(2 * written, RESERVE_FIRST_BYTES) + RESERVE_FIRST_BYTES
        assert path.stat().st_blocks * 512 >= written


def test_a_full_disk_at_a_reservation_refuses_writes_until_space_is_back(
    make_store: Callable[..., MessageStore],
) -> None:
    """ENOSPC reserving consume-queue blocks is a system call's error (never a SIGBUS on a mapped page): dispatch
    backs off, the store refuses puts meanwhile, and everything is dispatched once space is back."""
    # No disk reserve: with one, the refusal names the reserve given back (test_full_disk.py)
    store = make_store(mapped_file_size_consume_queue=CQ_FILE_BYTES, dispatch_interval_ms=1, disk_reserve_bytes=0)
    store.faults.fail_allocations(errno.ENOSPC, kind="consumequeue")
    assert store.put_message("Full", 0, b"acknowledged").ok
    deadline = time.monotonic() + 10
    while store.is_writable() and time.monotonic() < deadline:
        time.sleep(0.01)
    refused = store.put_message("Other", 0, b"y")
    assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE and "No space left" in refused.error
    store.faults.fail_allocations(None, kind="consumequeue")
    assert store.wait_dispatched(timeout_s=10)
    deadline = time.monotonic() + 10
    while not store.is_writable() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.put_message("Other", 0, b"y").ok and store.wait_dispatched()
    assert [m.body for m in store.get_message("g", "Full", 0, 0).messages()] == [b"acknowledged"]


def test_sparse_queue_files_recover_after_a_crash(make_store: Callable[..., MessageStore], tmp_path: Path) -> None:
    """A queue file reserved only in part reads as zeros past its units: recovery finds its end as before, and
    writes after the restart reserve what they need."""
    store = make_store(mapped_file_size_consume_queue=CQ_FILE_BYTES)
    for i in range(50):
        assert store.put_message("Sparse", 1, f"m{i}".encode()).ok
    assert store.wait_dispatched()
    store.abandon()
    again = make_store(mapped_file_size_consume_queue=CQ_FILE_BYTES)
    assert again.max_offset("Sparse", 1) == 50
    for i in range(50, 400):
        assert again.put_message("Sparse", 1, f"m{i}".encode()).ok
    assert again.wait_dispatched()
    bodies = [m.body for m in again.get_message("g", "Sparse", 1, 0, 400).messages()]
    assert bodies == [f"m{i}".encode() for i in range(400)]
    f = again.queues.find("Sparse", 1)
    assert f is not None and os.stat(f.files.files[0].path).st_blocks * 512 >= 400 * CQ_UNIT_SIZE


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 29_999), st.integers(0, 3)), max_size=30), st.integers(0, 1 << 20))
def test_the_end_of_a_sparse_queue_is_the_full_scan_s(writes: list[tuple[int, int]], log_end: int) -> None:
    """Recovery reads only the ranges of a queue file that may hold data (SEEK_DATA/SEEK_HOLE): the end it finds is
    the one a scan of every unit finds, wherever units were written (holes between them, reserved zeros, units
    past the commit log's end)."""
    with tempfile.TemporaryDirectory() as d:
        cq = ConsumeQueue(d, "T", 0, CQ_FILE_BYTES, lambda fd: None)
        cq.files.load()
        for unit, kind in writes:
            size = (0, 10, 10, 10)[kind]  # kind 0: a reserved unit that stays zero
            offset = unit * 1000 if kind != 3 else (1 << 20) + unit  # kind 3: an entry past the log's end
            cq.put_units(unit, CQ_UNIT.pack(offset, size, 0))
        f = cq.files.files[0] if cq.files.files else None
        want = -1
        if f is not None:
            units = np.frombuffer(f.mm, CQ_DTYPE)
            ok = np.flatnonzero((units["size"] > 0) & (units["offset"] + units["size"] <= log_end))
            del units
            want = (int(ok[-1]) + 1) * CQ_UNIT_SIZE if ok.size else -1
        assert cq._find_end(log_end) == want
        cq.close()
