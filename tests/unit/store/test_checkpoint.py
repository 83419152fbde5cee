"""The checkpoint file: layout decoded independently, flush records, a torn checkpoint ignored."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable

from broker.store import MessageStore
from broker.store.checkpoint import CHECKPOINT, Checkpoint


def test_checkpoint_records_flushes(make_store: Callable[..., MessageStore]) -> None:
    s = make_store()
    r = s.put_message("C", 0, b"x")
    s.flush()
    s.shutdown()
    with open(s.config.checkpoint_path, "rb") as f:
        raw = f.read(CHECKPOINT.size)
    physic_ts, logics_ts, index_ts, physic_off, logics_off, index_off, crc = struct.unpack(">qqqqqqI", raw)
    assert physic_ts == logics_ts == index_ts == r.store_timestamp
    assert physic_off == logics_off == index_off == r.wrote_bytes
    assert crc == zlib.crc32(raw[:48])


def test_torn_checkpoint_is_ignored(tmp_path: object) -> None:
    path = f"{tmp_path}/checkpoint"
    cp = Checkpoint(path, lambda fd: None)
    cp.update(physic_offset=123, logics_offset=100, index_offset=90)
    cp.close()
    assert Checkpoint(path, lambda fd: None).data.min_dispatch_offset == 90
    with open(path, "r+b") as f:
        f.seek(30)
        f.write(b"\xff")
    torn = Checkpoint(path, lambda fd: None)
    assert not torn.valid and torn.data.physic_offset == 0
