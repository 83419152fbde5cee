"""Transactions written in place (txn_in_place.py) across crashes: SIGKILL between the rows and the decision, during
the decision and marker, after them; a decision whose marker never got written; a reader polling through a commit
of a million rows. Every outcome is all of the kept attempt's rows once, or none, and never a dropped attempt's."""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter

import pytest
from test_transaction_crash import CONFIG, bodies_of, run_child

from broker.client.outgoing_message import Message, encode_message
from broker.semantics.transaction import TransactionService, TxStatus
from broker.store import MessageStore, StoreConfig
from tests.support.crash import crash_seed

CHILD = os.path.join(os.path.dirname(__file__), "in_place_crash_child.py")
COUNT = 40_000
QUEUES = 4
CYCLES = 5
KEPT, DROPPED = "task-0.1", "task-0.0"  # as the child names them


def kept_rows(txn_id: str, n: int = COUNT) -> set[bytes]:
    return {b"%s:%s:%06d" % (txn_id.encode(), KEPT.encode(), i) for i in range(n)}


# Where the kill lands: before the commit starts (the rows stored, no decision), right as it starts (usually
# before or during the decision and marker: an in-place commit takes milliseconds), and after it ended.
KILL_POINTS = [("PUT", 0.0), ("COMMITTING", 0.0), ("COMMITTING", 0.005), ("COMMITTING", 0.05), ("DONE", 0.0)]


@pytest.mark.slow
def test_sigkill_anywhere_in_an_in_place_transaction_is_all_or_nothing(tmp_path: object) -> None:
    store_dir = str(tmp_path)
    seed = crash_seed("in-place")
    rng = random.Random(seed)
    outcomes = []
    for cycle in range(CYCLES):
        txn_id, topic = f"query-2:{cycle}", f"InPlace{cycle}"
        kill_at, delay = KILL_POINTS[cycle % len(KILL_POINTS)]
        last = run_child(store_dir, txn_id, topic, delay * rng.uniform(0.5, 1.5), child=CHILD, count=COUNT,
                         kill_at=kill_at)
        store = MessageStore(StoreConfig(store_path=store_dir, **CONFIG))  # type: ignore[arg-type]
        store.start()
        tx = TransactionService(store, os.path.join(store_dir, "config"))
        tx.start()  # recovery writes a marker a decision is owed
        try:
            seen = bodies_of(store, topic)
            info = tx.transaction(txn_id)
            assert info is not None
            where = f"seed {seed}, cycle {cycle}, killed after {last}"
            assert all(n == 1 for n in seen.values()), f"{where}: duplicates"
            if info.status is TxStatus.COMMITTED:  # the decision was stored before the kill
                assert info.complete and seen.keys() == kept_rows(txn_id), f"{where}: {len(seen)} visible"
                outcomes.append(f"{last}: committed")
            else:  # killed before the decision: still open, nothing visible, every queue held at its first row
                assert info.status is TxStatus.OPEN and last != "DONE", (where, info.status)
                assert len(seen) == 0, f"{where}: open but {len(seen)} visible"
                assert info.half_count == 2 * COUNT  # both attempts' rows, counted from the store
                assert [r[2] for r in store.queue_ranges(topic, range(QUEUES))] == [0] * QUEUES
                outcomes.append(f"{last}: open")
                out = tx.end_transaction(txn_id, commit=True, committed_attempts=[KEPT], expected_messages=COUNT)
                assert out.status is TxStatus.COMMITTED and out.complete
                assert bodies_of(store, topic).keys() == kept_rows(txn_id)
            assert tx.end_transaction(txn_id, commit=False).status is TxStatus.COMMITTED  # the first outcome stands
        finally:
            tx.shutdown()
            if cycle == CYCLES - 1:
                assert store.wait_dispatched()
                assert store.check() == []
            store.shutdown()
    print("outcomes:", outcomes)
    assert any(o.endswith("open") for o in outcomes), f"seed {seed}: no kill landed before a decision"


def _put_rows(tx: TransactionService, txn_id: str, topic: str, n: int, attempt: str, batch: int = 2000) -> None:
    for first in range(0, n, batch):
        buf = b"".join(
            encode_message(Message(topic, b"%s:%s:%06d" % (txn_id.encode(), attempt.encode(), i)), i % QUEUES)
            for i in range(first, min(n, first + batch))
        )
        assert tx.put_in_place(buf, "spark", txn_id, attempt=attempt).ok


@pytest.mark.parametrize("commit", [True, False])
def test_a_decision_whose_marker_never_got_written_is_finished_at_start(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch, commit: bool
) -> None:
    """The process dies right after the decision is on disk (the marker not written): the restarted broker reports
    the decision and writes the marker, so the rows show (commit) or are skipped for good (rollback)."""
    store_dir = str(tmp_path)
    store = MessageStore(StoreConfig(store_path=store_dir, **CONFIG))  # type: ignore[arg-type]
    store.start()
    tx = TransactionService(store, os.path.join(store_dir, "config"))
    tx.start()
    _put_rows(tx, "t:1", "Owed", 500, KEPT)
    _put_rows(tx, "t:1", "Owed", 300, DROPPED)
    assert store.put_batch(encode_message(Message("Owed", b"plain"), 0)).ok  # after the rows: held back with them
    with monkeypatch.context() as m:
        m.setattr(TransactionService, "_mark", lambda *a: None)  # dies before the marker
        out = tx.end_transaction("t:1", commit=commit, committed_attempts=[KEPT] if commit else None)
    assert out.status is (TxStatus.COMMITTED if commit else TxStatus.ROLLED_BACK)
    assert bodies_of(store, "Owed") == Counter()  # decided, but no marker: readers still held
    store.abandon()  # SIGKILL: no shutdown, no state saved
    store = MessageStore(StoreConfig(store_path=store_dir, **CONFIG))  # type: ignore[arg-type]
    store.start()
    tx = TransactionService(store, os.path.join(store_dir, "config"))
    tx.start()
    try:
        info = tx.transaction("t:1")
        assert info is not None and info.complete and info.status is out.status
        expected = kept_rows("t:1", 500) if commit else set()
        assert set(bodies_of(store, "Owed")) == expected | {b"plain"}
        assert store.check() == []
    finally:
        tx.shutdown()
        store.shutdown()


@pytest.mark.slow
def test_a_reader_polling_through_a_commit_of_a_million_rows_sees_none_or_all(tmp_path: object) -> None:
    n = 1_000_000
    config = {**CONFIG, "max_batch_bytes": 4 << 20, "mapped_file_size_commit_log": 64 << 20}
    store = MessageStore(StoreConfig(store_path=str(tmp_path), **config))  # type: ignore[arg-type]
    store.start()
    tx = TransactionService(store, os.path.join(str(tmp_path), "config"))
    tx.start()
    try:
        _put_rows(tx, "big:1", "Big", n, KEPT, batch=20_000)
        seen: set[int] = set()
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                seen.add(sum(hi - lo for _, lo, hi in store.queue_ranges("Big", range(QUEUES))))

        reader = threading.Thread(target=poll)
        reader.start()
        try:
            time.sleep(0.05)
            out = tx.end_transaction("big:1", commit=True, expected_messages=n)
            time.sleep(0.05)
        finally:
            stop.set()
            reader.join()
        assert out.complete and seen == {0, n}, sorted(seen)[:10]
        assert sum(bodies_of(store, "Big").values()) == n
    finally:
        tx.shutdown()
        store.shutdown()
