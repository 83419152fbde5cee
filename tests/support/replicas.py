"""In-process replicated brokers for component tests: real BrokerControllers (gRPC, stores, replication) in this
process, on 127.0.0.1 port 0, with small store files so that logs roll over files quickly."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from broker.config import BrokerConfig
from broker.server.broker_controller import BrokerController
from tests.support.waiting import wait_until

SMALL_STORE = {
    "mapped_file_size_commit_log": 1 << 20, "mapped_file_size_consume_queue": 3000 * 20,
    "max_hash_slot_num": 1024, "max_index_num": 8192, "max_batch_bytes": 256 * 1024, "max_message_size": 256 * 1024,
}
FAST = {"ha_max_lag_ms": 1500, "ha_ack_timeout_ms": 1500}


def broker(path: Path, store: dict[str, Any] | None = None, **settings: Any) -> BrokerController:
    settings = {"listen": "127.0.0.1:0", "broker_name": "g", **FAST, **settings}
    cfg = BrokerConfig.from_dict({"store": {**SMALL_STORE, **(store or {})}}, store_path=str(path), **settings)
    b = BrokerController(cfg)
    b.start()
    return b


def slave_of(master: BrokerController, path: Path, broker_id: int = 1, **settings: Any) -> BrokerController:
    assert master.replication is not None
    return broker(path, role="SLAVE", broker_id=broker_id,
                  ha_master_address=f"127.0.0.1:{master.replication.ha_port}", **settings)


@contextmanager
def brokers() -> Iterator[list[BrokerController]]:
    started: list[BrokerController] = []
    try:
        yield started
    finally:
        for b in reversed(started):
            b.shutdown()


def in_sync_pair(
    started: list[BrokerController], root: Path, master: dict[str, Any] | None = None,
    slave: dict[str, Any] | None = None,
) -> tuple[BrokerController, BrokerController]:
    """A SYNC_MASTER in ``root/m`` (with ``master``'s settings) and its slave in ``root/s`` (``slave``'s), both added
    to ``started`` (of ``brokers()``), once the slave is in the master's in-sync set."""
    m = broker(root / "m", role="SYNC_MASTER", **(master or {}))
    started.append(m)
    s = slave_of(m, root / "s", **(slave or {}))
    started.append(s)
    wait_until(lambda: m.replication is not None and len(m.replication.in_sync.members) == 2,  # type: ignore[union-attr]
               "the slave in sync")
    return m, s


def caught_up(master: BrokerController, slave: BrokerController) -> bool:
    if master.store is None or slave.store is None:  # restarting in place
        return False
    return slave.store.max_phys_offset() == master.store.max_phys_offset()


def commit_log_bytes(b: BrokerController) -> bytes:
    """The whole commit log, file after file, up to its end (what both replicas must hold byte for byte)."""
    assert b.store is not None
    files = b.store.commit_log.files
    out = bytearray()
    for f in files.files:
        out += f.read(0, f.wrote_position)
        if f.wrote_position < f.file_size:
            break
    return bytes(out)


def commit_log_range(b: BrokerController) -> tuple[int, int]:
    assert b.store is not None
    return b.store.min_phys_offset(), b.store.max_phys_offset()


def store_files(store: Path) -> list[str]:
    return sorted(os.listdir(store / "commitlog"))
