"""Consume-queue files reserve their disk blocks as units are written, not whole when created: every queue has a
file (6 MB by default), and a 38 KB batch naming 400 new queues took 2.3 GB of disk at once."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

from broker.store import MessageStore, PutStatus
from broker.store.batch import split_entries
from broker.store.config import CQ_UNIT_SIZE
from broker.store.mapped_file import RESERVE_FIRST_BYTES
from broker.store.message import encode_entry

CQ_FILE_BYTES = 30_000 * CQ_UNIT_SIZE  # 600 KB: one file per queue is enough to show what preallocation cost


def allocated_bytes(root: Path) -> int:
    """Disk blocks held by the files under ``root`` (what df counts, not the files' sizes)."""
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


def test_a_new_queue_takes_a_page_not_a_file(make_store: Callable[..., MessageStore], tmp_path: Path) -> None:
    store = make_store(mapped_file_size_consume_queue=CQ_FILE_BYTES, max_batch_bytes=1 << 20,
                       mapped_file_size_commit_log=4 << 20)  # fmt: skip
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
                       mapped_file_size_commit_log=4 << 20)  # fmt: skip
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
    store = make_store(mapped_file_size_consume_queue=CQ_FILE_BYTES, dispatch_interval_ms=1)
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
