"""A commit interrupted after its copies were stored (no finished marker yet), finished by a broker whose read limit
lags those copies (a new master: its confirmed offset catches up with its log only as its replicas report): the
recovery sees the copies past the limit and stores none again (the soak found committed transactions readable twice
after a master SIGKILL)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.semantics.transaction import TransactionService
from broker.semantics.transaction_restore import TransactionError
from broker.store import GetStatus, MessageStore, StoreConfig

TOPIC = "Committed"
CONFIG = {"mapped_file_size_commit_log": 4 << 20, "mapped_file_size_consume_queue": 1000 * 20,
          "max_message_size": 64 << 10, "max_batch_bytes": 256 << 10}


def _bodies(store: MessageStore) -> list[bytes]:
    res = store.get_message("CHECK", TOPIC, 0, 0, 64)
    return [m.body for m in res.messages()] if res.status is GetStatus.FOUND else []


def test_recovery_past_the_read_limit_stores_no_copy_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = MessageStore(StoreConfig(store_path=str(tmp_path), **CONFIG))  # type: ignore[arg-type]
    store.start()
    config_dir = os.path.join(tmp_path, "config")
    tx = TransactionService(store, config_dir)
    tx.start()
    try:
        _, txn_id = tx.prepare_half(TOPIC, 0, b"once", {}, "producers")

        def no_marker(_self: object, _txn: object) -> None:  # the broker dies after the copies, before the marker
            raise TransactionError("killed before the finished marker")

        monkeypatch.setattr(type(tx), "_store_finished", no_marker)
        tx.end_transaction(txn_id, commit=True)  # decided; "the check thread retries" the rest
    finally:
        tx.shutdown()
        monkeypatch.undo()
    assert store.wait_dispatched()
    assert _bodies(store) == [b"once"]
    copy = store.get_message("CHECK", TOPIC, 0, 0, 1)
    first_copy_at = next(iter(copy.messages())).commitlog_offset
    store.read_limit = lambda: first_copy_at  # everything before the copy is confirmed, the copy not yet
    assert _bodies(store) == []
    tx = TransactionService(store, config_dir)
    tx.start()  # recovery finishes the interrupted commit
    tx.shutdown()
    store.read_limit = None  # the replicas caught up
    assert store.wait_dispatched()
    assert _bodies(store) == [b"once"]
    store.shutdown()
