"""Requests that come while a starting transaction service rebuilds its table are refused (ServiceNotAvailableError,
nothing stored or decided), on a real store. A new master starts the service after it became master, so half sends
and EndTransaction calls can arrive while the recovery scans: a half put then was missed by the table the recovery
swapped in (never checked back: a committed transaction lost), and a decision taken on the old table was taken again
on the new one by a check-back (a committed transaction stored twice), as an hour's soak saw."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.errors import ServiceNotAvailableError
from broker.format.system_topics import TRANS_HALF_TOPIC
from broker.semantics import half_scan
from broker.semantics.transaction import TransactionService, TxStatus
from broker.store import GetStatus, MessageStore, StoreConfig

TOPIC = "Window"
CONFIG = {"mapped_file_size_commit_log": 4 << 20, "mapped_file_size_consume_queue": 1000 * 20,
          "max_message_size": 64 << 10, "max_batch_bytes": 256 << 10}


def _bodies(store: MessageStore) -> list[bytes]:
    res = store.get_message("CHECK", TOPIC, 0, 0, 64)
    return [m.body for m in res.messages()] if res.status is GetStatus.FOUND else []


def test_puts_and_decisions_during_recovery_are_refused_and_change_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MessageStore(StoreConfig(store_path=str(tmp_path), **CONFIG))  # type: ignore[arg-type]
    store.start()
    config_dir = os.path.join(tmp_path, "config")
    tx = TransactionService(store, config_dir)
    tx.start()
    _, open_id = tx.prepare_half(TOPIC, 0, b"open", {}, "producers")
    tx.shutdown()
    half_end = store.max_offset(TRANS_HALF_TOPIC, 0)

    tx = TransactionService(store, config_dir)
    refused: list[str] = []
    scan = half_scan.HalfScans._scan_raw

    def scan_then_call(self: TransactionService, topic: str, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        yield from scan(self, topic, *args, **kwargs)  # type: ignore[arg-type]
        if topic == TRANS_HALF_TOPIC:  # the recovery's half scan is done; its table is not swapped in yet
            for name, call in (("half", lambda: self.prepare_half(TOPIC, 0, b"late", {}, "producers")),
                               ("end", lambda: self.end_transaction(open_id, True)),
                               ("bulk end", lambda: self.end_transactions(True, txn_ids=[open_id]))):
                with pytest.raises(ServiceNotAvailableError, match="being recovered"):
                    call()
                refused.append(name)

    monkeypatch.setattr(half_scan.HalfScans, "_scan_raw", scan_then_call)
    tx.start()
    monkeypatch.undo()
    try:
        assert refused == ["half", "end", "bulk end"]
        assert store.max_offset(TRANS_HALF_TOPIC, 0) == half_end  # the refused half stored nothing
        info = tx.transaction(open_id)
        assert info is not None and info.status is TxStatus.OPEN  # nothing decided while recovering
        assert tx.end_transaction(open_id, True).complete  # served once started
        assert store.wait_dispatched()
        assert _bodies(store) == [b"open"]
    finally:
        tx.shutdown()
        store.shutdown()
