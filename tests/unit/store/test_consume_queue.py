"""Consume-queue units: layout, file naming per queue, boundary crossing, and loading an empty last file."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable

from broker.format.message import tag_hash_code
from broker.store import MessageStore
from broker.store.consume_queue import CQ_UNIT


def _units(path: str) -> list[tuple[int, int, int]]:
    """Independent decoder: 20-byte big-endian (offset q, size i, tag q) until the first zero unit."""
    with open(path, "rb") as f:
        raw = f.read()
    out = []
    for pos in range(0, len(raw), 20):
        off, size, tag = struct.unpack_from(">qiq", raw, pos)
        if size == 0:
            break
        out.append((off, size, tag))
    return out


def test_units_point_at_entries(store: MessageStore) -> None:
    results = [store.put_message("Cq", 1, b"m%d" % i, {"TAGS": "TagA" if i % 2 else "TagB"}) for i in range(5)]
    store.wait_dispatched()
    store.flush()
    path = os.path.join(store.config.consume_queue_dir, "Cq", "1", "00000000000000000000")
    units = _units(path)
    assert [u[0] for u in units] == [r.commitlog_offsets[0] for r in results]
    assert [u[1] for u in units] == [r.wrote_bytes for r in results]
    assert [u[2] for u in units] == [tag_hash_code("TagA" if i % 2 else "TagB") for i in range(5)]
    assert CQ_UNIT.size == 20
    assert store.check() == []


def test_units_cross_consume_queue_file_boundaries(store: MessageStore) -> None:
    for i in range(25):  # 10 units per file: three files
        assert store.put_message("Cross", 0, b"%d" % i).ok
    store.wait_dispatched()
    d = os.path.join(store.config.consume_queue_dir, "Cross", "0")
    assert sorted(os.listdir(d)) == ["00000000000000000000", "00000000000000000200", "00000000000000000400"]
    bodies: list[bytes] = []
    offset = 0
    while offset < 25:
        got = store.get_message("g", "Cross", 0, offset, 32)
        bodies += [m.body for m in got.messages()]
        offset = got.next_begin_offset
    assert bodies == [b"%d" % i for i in range(25)]
    assert store.check() == []


def test_start_with_an_empty_last_consume_queue_file(make_store: Callable[..., MessageStore]) -> None:
    """apache/rocketmq 9728: a preallocated but empty last file must not break start-up."""
    s = make_store()
    for i in range(10):  # exactly fills the first file
        assert s.put_message("Empty", 0, b"%d" % i).ok
    s.shutdown()
    d = os.path.join(s.config.consume_queue_dir, "Empty", "0")
    with open(os.path.join(d, "00000000000000000200"), "wb") as f:
        f.truncate(200)  # an empty next file, as a crash right after creating it leaves
    s2 = make_store()
    assert s2.max_offset("Empty", 0) == 10
    assert s2.put_message("Empty", 0, b"10").queue_offsets == [10]
    s2.wait_dispatched()
    assert [m.body for m in s2.get_message("g", "Empty", 0, 10).messages()] == [b"10"]
    assert s2.check() == []
