"""A commit interrupted after its copies were stored (no finished marker yet), finished by a broker whose read limit
lags those copies (a new master: its confirmed offset catches up with its log only as its replicas report): the
recovery sees the copies past the limit and stores none again (the soak found committed transactions readable twice
after a master SIGKILL); and every other thing a starting broker rebuilds from its transaction queues, seen past
the limit too."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.format.message import encode_entry, encode_properties
from broker.format.txn_decision import Share, make_decision
from broker.semantics.decision_log import DecisionLog
from broker.semantics.transaction import TransactionService, TxStatus
from broker.semantics.transaction_restore import TransactionError
from broker.store import GetStatus, MessageStore, StoreConfig

TOPIC = "Committed"
CONFIG = {"mapped_file_size_commit_log": 4 << 20, "mapped_file_size_consume_queue": 1000 * 20,
          "max_message_size": 64 << 10, "max_batch_bytes": 256 << 10}


def _open(tmp_path: Path) -> tuple[MessageStore, str]:
    """A started store in ``tmp_path`` and the config directory of its services."""
    store = MessageStore(StoreConfig(store_path=str(tmp_path), **CONFIG))  # type: ignore[arg-type]
    store.start()
    return store, os.path.join(tmp_path, "config")


def rows(bodies: list[bytes]) -> bytes:
    return b"".join(encode_entry(TOPIC.encode(), 0, b, encode_properties({})) for b in bodies)


def _bodies(store: MessageStore) -> list[bytes]:
    res = store.get_message("CHECK", TOPIC, 0, 0, 64)
    return [m.body for m in res.messages()] if res.status is GetStatus.FOUND else []


def test_recovery_past_the_read_limit_stores_no_copy_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, config_dir = _open(tmp_path)
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


def test_recovery_knows_an_open_in_place_transaction_past_the_read_limit(tmp_path: Path) -> None:
    """A transaction written in place whose slice record and rows a new master holds but has not confirmed yet when
    it starts its services: the recovery knows the transaction (its attempt, its rows), so the writer's commit of
    another attempt rolls this one's rows back and the queue is readable again. Unknown, its rows would hold the
    queue for good (the Spark sink's failover test saw 2,600 of 20,000 rows readable)."""
    store, config_dir = _open(tmp_path)
    tx = TransactionService(store, config_dir)
    tx.start()
    try:
        assert store.put_batch(rows([b"before"])).ok
        confirmed = store.max_phys_offset()
        assert tx.put_in_place(rows([b"lost-attempt"]), "spark", "q:1", attempt="t0.0").ok
    finally:
        tx.shutdown()
    assert store.wait_dispatched()
    store.read_limit = lambda: confirmed  # the slice record and its row are past the confirmed offset
    tx = TransactionService(store, config_dir)
    tx.start()  # the new master's recovery, before its replicas confirmed its log's end
    try:
        store.read_limit = None  # the replicas caught up
        info = tx.transaction("q:1")
        assert info is not None and info.status is TxStatus.OPEN and info.half_count == 1
        assert tx.put_in_place(rows([b"kept"]), "spark", "q:1", attempt="t0.1").ok
        assert tx.end_transaction("q:1", commit=True, committed_attempts=["t0.1"], expected_messages=1).complete
        assert store.put_batch(rows([b"after"])).ok
        assert store.wait_dispatched()
        assert _bodies(store) == [b"before", b"kept", b"after"]
    finally:
        tx.shutdown()
        store.shutdown()


def test_halves_and_a_coordinators_decision_past_the_read_limit_are_known(tmp_path: Path) -> None:
    """A half message and a coordinator's decision a new master's log holds past its confirmed offset: the recovery
    knows both, the half's commit re-stores it (not 'halves gone'), and the decision stands (a later ABORT gets the
    COMMIT back)."""
    store, config_dir = _open(tmp_path)
    tx, decisions = TransactionService(store, config_dir), DecisionLog(store, config_dir)
    tx.start()
    decisions.start()
    try:
        confirmed = store.max_phys_offset()
        _, txn_id = tx.prepare_half(TOPIC, 0, b"half", {}, "producers")
        first = decisions.record(make_decision("q:9", True, [Share("b", ("b-att",), 1)]))
    finally:
        tx.shutdown()
        decisions.shutdown()
    assert store.wait_dispatched()
    store.read_limit = lambda: confirmed
    tx, decisions = TransactionService(store, config_dir), DecisionLog(store, config_dir)
    tx.start()
    decisions.start()
    try:
        assert decisions.get("q:9") == first
        assert decisions.record(make_decision("q:9", False)) == first
        assert tx.end_transaction(txn_id, commit=True).complete
        store.read_limit = None
        assert store.wait_dispatched()
        assert _bodies(store) == [b"half"]
    finally:
        tx.shutdown()
        decisions.shutdown()
        store.shutdown()


def test_a_commit_past_the_read_limit_is_not_made_again(tmp_path: Path) -> None:
    """A single-message transaction committed (decision, copy, finished marker) on the old master, all of it past the
    new master's confirmed offset when it starts: the producer's EndTransaction retried there, or a check-back's
    answer, gets the first outcome back and stores no second copy (the soak read committed transactions twice)."""
    store, config_dir = _open(tmp_path)
    tx = TransactionService(store, config_dir)
    tx.start()
    try:
        _, txn_id = tx.prepare_half(TOPIC, 0, b"once", {}, "producers")
        confirmed = store.max_phys_offset()
        assert tx.end_transaction(txn_id, commit=True).complete
    finally:
        tx.shutdown()
    assert store.wait_dispatched()
    store.read_limit = lambda: confirmed  # the decision, the copy and the marker are past the confirmed offset
    tx = TransactionService(store, config_dir)
    tx.start()
    try:
        again = tx.end_transaction(txn_id, commit=True)
        assert again.already_ended and again.status is TxStatus.COMMITTED and again.restored == 0
        store.read_limit = None
        assert store.wait_dispatched()
        assert _bodies(store) == [b"once"]
    finally:
        tx.shutdown()
        store.shutdown()
