"""Transactions on a real store through check-back and restarts: check-back answers and counts, the state file,
and commits interrupted by a crash finished at start or by the check thread (test_transaction.py has the rest)."""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING

import pytest
from test_transaction import batch, service  # the store box's transaction service and a batch of entries

from broker.errors import CorruptionError
from broker.format.message import Prop, StoredMessage
from broker.format.system_topics import TRANS_OP_HALF_TOPIC
from broker.format.transaction_codec import FINISHED_TAG, encode_half_entry
from broker.semantics.transaction import (
    DEFAULT_COMMIT_MEMORY_BYTES,
    TransactionError,
    TransactionService,
    TxState,
    TxStatus,
)
from tests.support.waiting import wait_until

if TYPE_CHECKING:
    from store_box import StoreBox


def later_pass(tx: TransactionService) -> int:
    """check_once after the 1 ms transaction timeout has passed since the previous pass's checks."""
    time.sleep(0.01)
    return tx.check_once()


def test_check_back_commit_rollback_and_unknown_until_max(box: StoreBox) -> None:
    answers = {"c": TxState.COMMIT, "r": TxState.ROLLBACK, "u": TxState.UNKNOWN}
    asked: list[tuple[str, str, bytes]] = []

    def checker(group: str, txn_id: str, half: StoredMessage) -> TxState:
        asked.append((group, txn_id, half.body))
        return answers[txn_id]

    tx = service(box, checker=checker, transaction_timeout_ms=1, check_interval_ms=3_600_000, check_max=3)
    try:
        for txn_id in answers:
            tx.prepare_half("Pay", 0, txn_id.encode(), {}, "PG", txn_id=txn_id)
        time.sleep(0.01)  # older than the 1 ms timeout
        assert tx.check_once() == 3
        assert tx.transaction("c").status is TxStatus.COMMITTED  # type: ignore[union-attr]
        assert tx.transaction("r").status is TxStatus.ROLLED_BACK  # type: ignore[union-attr]
        assert tx.transaction("u").status is TxStatus.OPEN  # type: ignore[union-attr]
        assert later_pass(tx) == 1 and later_pass(tx) == 1
        assert tx.transaction("u").check_times == 3  # type: ignore[union-attr]
        assert later_pass(tx) == 0  # the 4th pass gives up: rolled back
        assert tx.transaction("u").status is TxStatus.ROLLED_BACK  # type: ignore[union-attr]
    finally:
        tx.shutdown()
    assert ("PG", "c", b"c") in asked and [a[1] for a in asked].count("u") == 3
    assert [m.body for m in box.read_topic("Pay")] == [b"c"]


def test_a_transaction_is_checked_again_only_a_timeout_after_its_last_check(box: StoreBox) -> None:
    """Passes may come faster than the transaction timeout; a check is then repeated once the timeout has passed
    since the last one, not at every pass (a producer still answering is not sent a copy per pass)."""
    asked: list[str] = []
    tx = service(box, checker=lambda g, t, h: asked.append(t), transaction_timeout_ms=300,
                 check_interval_ms=3_600_000)
    try:
        tx.prepare_half("Pay", 0, b"u", {}, "PG", txn_id="u")
        assert tx.check_once() == 0  # not idle yet
        time.sleep(0.35)
        assert tx.check_once() == 1 and tx.check_once() == 0 and tx.check_once() == 0
        time.sleep(0.35)
        assert tx.check_once() == 1
        assert asked == ["u", "u"] and tx.transaction("u").check_times == 2  # type: ignore[union-attr]
    finally:
        tx.shutdown()


def test_check_counts_survive_a_crash(box: StoreBox) -> None:
    """RocketMQ counts checks in the half message itself; here they are in transactionState.json, written before
    each pass asks: a broker that crashes and restarts does not grant a transaction check_max more checks."""
    tx = service(box, checker=lambda g, t, h: TxState.UNKNOWN, transaction_timeout_ms=1, check_interval_ms=3_600_000,
                 check_max=3)
    tx.prepare_half("Pay", 0, b"u", {}, "PG", txn_id="u")
    time.sleep(0.01)
    assert tx.check_once() == 1 and later_pass(tx) == 1
    tx._stop.set()  # its idle check thread ends; no shutdown(), so nothing more is persisted
    box.crash()  # only what check_once wrote is on disk
    box.open()
    tx = service(box, checker=lambda g, t, h: TxState.UNKNOWN, transaction_timeout_ms=1, check_interval_ms=3_600_000,
                 check_max=3)
    try:
        assert tx.transaction("u").check_times == 2  # type: ignore[union-attr]
        time.sleep(0.01)
        assert tx.check_once() == 1  # the third and last check
        assert later_pass(tx) == 0
        assert tx.transaction("u").status is TxStatus.ROLLED_BACK  # type: ignore[union-attr]
    finally:
        tx.shutdown()


def test_check_thread_runs_on_its_own(box: StoreBox) -> None:
    asked: list[tuple[str, str, bytes]] = []

    def checker(group: str, txn_id: str, half: StoredMessage) -> TxState:
        asked.append((group, txn_id, half.body))
        return TxState.COMMIT

    tx = service(box, checker=checker, transaction_timeout_ms=50, check_interval_ms=20)
    try:
        tx.prepare_half("Pay", 0, b"auto", {}, "PG", txn_id="a")
        wait_until(lambda: box.s.max_offset("Pay", 0) == 1, "commit by check-back", timeout_s=5, interval_s=0.005)
        info = tx.transaction("a")
        assert info is not None and info.status is TxStatus.COMMITTED
        assert [m.body for m in box.read_topic("Pay")] == [b"auto"]
        assert set(asked) == {("PG", "a", b"auto")}  # asked by the check thread, about that half
    finally:
        tx.shutdown()


def test_state_survives_restart(box: StoreBox) -> None:
    tx = service(box)
    tx.put_half_batch(batch("Out", [b"open-1", b"open-2"]), "spark", "open")
    tx.put_half_batch(batch("Out", [b"done"]), "spark", "done")
    tx.end_transaction("done", commit=True)
    tx.put_half_batch(batch("Out", [b"gone"]), "spark", "gone")
    tx.end_transaction("gone", commit=False)
    tx.shutdown()
    box.crash()
    box.open()
    tx = service(box)
    try:
        assert {t.txn_id: t.status for t in tx.list_transactions()} == {
            "open": TxStatus.OPEN, "done": TxStatus.COMMITTED, "gone": TxStatus.ROLLED_BACK,
        }
        assert tx.end_transaction("done", commit=False).status is TxStatus.COMMITTED
        assert tx.end_transaction("gone", commit=True).status is TxStatus.ROLLED_BACK
        out = tx.end_transaction("open", commit=True)
        assert out.restored == 2
        assert sorted(m.body for m in box.read_topic("Out")) == [b"done", b"open-1", b"open-2"]
    finally:
        tx.shutdown()


def test_a_state_file_saved_before_the_log_was_cut_back_scans_from_the_queue_ends(box: StoreBox) -> None:
    """A replica truncated after an election starts with a state file saved when its log was longer (its old
    log's first 50 halves all decided). Its half queue now ends at 2, and the halves replicated from the new
    master take offsets 2, 3, ...: a scan from 50 at promotion would never see them, and their transaction could
    not be ended. The scan starts come down to the queue ends at start-up."""
    tx = service(box)
    tx.put_half_batch(batch("Out", [b"old-1", b"old-2"]), "spark", "old")
    tx.end_transaction("old", commit=True)
    tx.shutdown()
    log_now = box.s.max_phys_offset()
    state = os.path.join(box.path, "config", "transactionState.json")
    with open(state, "w") as f:
        json.dump({"halfScanFrom": 50, "opScanFrom": 40, "checkTimes": {}, "log_end": log_now + 10_000}, f)
    op_end = box.s.queue_end(TRANS_OP_HALF_TOPIC, 0)
    tx = TransactionService(box.s, os.path.join(box.path, "config"))  # start-up: built before replication runs
    with open(state) as f:
        assert json.load(f) == {"halfScanFrom": 2, "opScanFrom": op_end, "checkTimes": {}, "log_end": log_now}
    halves = [encode_half_entry("Out", 0, body, None, "spark", "new") for body in (b"new-1", b"new-2")]
    assert box.s.put_batch(b"".join(halves)).ok  # as the new master's halves arrive by replication
    tx.start()  # taking office
    try:
        assert {t.txn_id: t.status for t in tx.list_transactions()} == {"new": TxStatus.OPEN}  # "old": forgotten
        assert tx.end_transaction("new", commit=True).restored == 2
    finally:
        tx.shutdown()


def test_a_start_refused_for_an_unreadable_state_file_leaves_it_alone(box: StoreBox) -> None:
    """Refused at recovery (state file and .bak unreadable), the service's shutdown still persisted its empty
    table over them: the next start succeeded and never saw the open transactions again."""
    tx = service(box)
    tx.put_half_batch(batch("Out", [b"open"]), "spark", "open")
    tx.shutdown()
    state = os.path.join(box.path, "config", "transactionState.json")
    for path in (state, state + ".bak"):
        with open(path, "w") as f:
            f.write('{"halfScanFrom": "garbage"}')
    refused = TransactionService(box.s, os.path.join(box.path, "config"))
    with pytest.raises(CorruptionError, match="transactionState"):
        refused.start()
    refused.shutdown()  # as the broker's aborted start does
    with open(state) as f:
        assert json.load(f) == {"halfScanFrom": "garbage"}  # untouched: the operator decides
    os.unlink(state)
    os.unlink(state + ".bak")  # as the refusal says: then recovery scans from the start
    tx = service(box)
    try:
        assert {t.txn_id: t.status for t in tx.list_transactions()} == {"open": TxStatus.OPEN}
    finally:
        tx.shutdown()


@pytest.mark.parametrize("budget", [DEFAULT_COMMIT_MEMORY_BYTES, 0], ids=["kept", "remade"])
def test_interrupted_commit_is_finished_at_start_without_duplicates(box: StoreBox, budget: int) -> None:
    tx = service(box, put_chunk_bytes=4096, commit_memory_bytes=budget)
    bodies = [f"m{i:04d}".encode() * 10 for i in range(300)]
    for i in range(0, 300, 50):
        assert tx.put_half_batch(batch("Out", bodies[i : i + 50], queue_id=i // 50 % 2), "spark", "big").ok
    chunks = {"n": 0}
    real_put_chunk = tx._put_chunk

    def dying_put_chunk(txn_id: str, entries: list[bytes]) -> int:
        chunks["n"] += 1
        if chunks["n"] == 3:
            raise OSError("simulated crash in the middle of the re-store")
        return real_put_chunk(txn_id, entries)

    tx._put_chunk = dying_put_chunk  # type: ignore[method-assign]
    out = tx.end_transaction("big", commit=True)
    assert out.status is TxStatus.COMMITTED and not out.complete
    partial = len(box.read_topic("Out"))
    assert 0 < partial < 300
    tx._stop.set()  # its check thread ends (else it would outlive the store it reads); nothing more persisted
    box.crash()  # the broker dies with the commit half done
    box.open()
    tx = service(box)
    try:
        got = sorted(m.body for m in box.read_topic("Out"))
        assert got == sorted(bodies)  # finished at start-up, nothing twice
        info = tx.transaction("big")
        assert info is not None and info.status is TxStatus.COMMITTED and info.complete
    finally:
        tx.shutdown()


def test_commit_cut_before_its_finished_marker_is_finished_at_start(box: StoreBox) -> None:
    """A crash after every committed message was re-stored but before the finished marker: start-up finds
    nothing left to store, writes the marker, and stores nothing twice."""
    tx = service(box, put_chunk_bytes=4096)
    bodies = [f"f{i:04d}".encode() * 10 for i in range(120)]
    assert tx.put_half_batch(batch("Out", bodies), "spark", "cut").ok
    real_put = tx.store.put_message

    def no_marker(topic: str, qid: int, body: bytes, props: dict[str, str], **kwargs: object) -> object:
        if topic == TRANS_OP_HALF_TOPIC and props.get(Prop.TAGS) == FINISHED_TAG:
            raise OSError("simulated crash before the finished marker")
        return real_put(topic, qid, body, props, **kwargs)  # type: ignore[arg-type]

    tx.store.put_message = no_marker  # type: ignore[method-assign,assignment]
    assert not tx.end_transaction("cut", commit=True).complete
    assert len(box.read_topic("Out")) == 120
    tx._stop.set()
    box.crash()
    box.open()
    tx = service(box)
    try:
        assert sorted(m.body for m in box.read_topic("Out")) == sorted(bodies)
        info = tx.transaction("cut")
        assert info is not None and info.status is TxStatus.COMMITTED and info.complete
    finally:
        tx.shutdown()


def test_stalled_commit_is_finished_by_the_check_thread(box: StoreBox) -> None:
    tx = service(box, put_chunk_bytes=4096, check_interval_ms=20)
    try:
        tx.put_half_batch(batch("Out", [f"x{i}".encode() * 20 for i in range(200)]), "spark", "s")
        real_put_chunk = tx._put_chunk
        calls = {"n": 0}

        def flaky(txn_id: str, entries: list[bytes]) -> int:
            calls["n"] += 1
            if calls["n"] == 2:
                raise TransactionError("store refused for now")
            return real_put_chunk(txn_id, entries)

        tx._put_chunk = flaky  # type: ignore[method-assign]
        assert not tx.end_transaction("s", commit=True).complete
        wait_until(lambda: tx.transaction("s").complete,  # type: ignore[union-attr]
                   "the background finish", timeout_s=5, interval_s=0.005)
        assert len(box.read_topic("Out")) == 200
        assert len({m.body for m in box.read_topic("Out")}) == 200
    finally:
        tx.shutdown()
