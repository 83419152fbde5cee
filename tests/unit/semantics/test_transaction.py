"""Transactions on a real store: half messages, commit / rollback, batch transactions, limits, the end of a
commit (check-back and restarts: test_transaction_restart.py)."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import TYPE_CHECKING

import pytest

from broker.errors import MessageIllegalError, QueryNotFoundError
from broker.format.message import Prop, SysFlag, decode_entry, encode_entry, encode_properties
from broker.format.system_topics import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from broker.format.transaction_codec import (
    ATTEMPT,
    RawHalf,
    commit_raw,
    committed_entry,
    decode_commit_start,
    decode_offsets,
    encode_commit_start,
    encode_half_entry,
    encode_offsets,
    raw_property,
)
from broker.semantics.transaction import (
    DEFAULT_COMMIT_MEMORY_BYTES,
    TransactionError,
    TransactionService,
    TxState,
    TxStatus,
)

if TYPE_CHECKING:
    from store_box import StoreBox


def service(box: StoreBox, **kwargs: object) -> TransactionService:
    tx = TransactionService(box.s, os.path.join(box.path, "config"), **kwargs)  # type: ignore[arg-type]
    tx.start()
    return tx


def batch(topic: str, bodies: list[bytes], queue_id: int = 0, props: dict[str, str] | None = None) -> bytes:
    raw_props = encode_properties(props or {})
    return b"".join(encode_entry(topic.encode(), queue_id, b, raw_props) for b in bodies)


def test_offset_runs_codec() -> None:
    assert encode_offsets([5, 1, 2, 3, 9, 10]) == b"1-3,5,9-10"
    assert encode_offsets([7]) == b"7"  # RocketMQ 4's body: one offset
    assert decode_offsets(b"1-3,5,9-10") == [(1, 3), (5, 5), (9, 10)]
    assert decode_offsets(b"") == []
    with pytest.raises(ValueError):
        decode_offsets(b"3-1")
    start = {("T", 0): 5, ("%RETRY%G", 3): 0}
    assert decode_commit_start(encode_commit_start(start)) == start


def test_single_half_message_commit(box: StoreBox) -> None:
    tx = service(box)
    try:
        res, txn_id = tx.prepare_half("Pay", 1, b"debit", {Prop.KEYS: "p1", Prop.UNIQ_KEY: "U1"}, "PG")
        assert res.ok and txn_id == "U1"
        assert box.s.max_offset("Pay", 1) == 0  # invisible
        half = box.read_queue(TRANS_HALF_TOPIC)[0]
        assert half.properties[Prop.REAL_TOPIC] == "Pay" and half.properties[Prop.REAL_QID] == "1"
        assert half.properties[Prop.TRAN_MSG] == "true" and half.properties[Prop.PGROUP] == "PG"
        assert SysFlag.transaction_type(half.sys_flag) == SysFlag.TRANSACTION_NOT_TYPE  # as RocketMQ stores halves
        out = tx.end_transaction_by_offset(res.commitlog_offsets[0], commit=True)
        assert out.status is TxStatus.COMMITTED and not out.already_ended and out.restored == 1 and out.complete
        [m] = box.read_queue("Pay", 1)
        assert m.body == b"debit" and m.keys == ["p1"]
        assert m.prepared_transaction_offset == half.commitlog_offset
        assert m.properties[Prop.TRAN_PREPARED_QUEUE_OFFSET] == str(half.queue_offset)
        assert SysFlag.transaction_type(m.sys_flag) == SysFlag.TRANSACTION_COMMIT_TYPE
        assert Prop.REAL_TOPIC not in m.properties and Prop.REAL_QID not in m.properties
        op = box.read_queue(TRANS_OP_HALF_TOPIC)[0]
        assert op.tags == "d" and op.body == str(half.queue_offset).encode()  # RocketMQ's op message
        again = tx.end_transaction("U1", commit=False)
        assert again.already_ended and again.status is TxStatus.COMMITTED  # the first outcome stands
        assert len(box.read_queue("Pay", 1)) == 1
    finally:
        tx.shutdown()


def test_rollback_keeps_everything_invisible(box: StoreBox) -> None:
    tx = service(box)
    try:
        _res, txn_id = tx.prepare_half("Pay", 0, b"x", {}, "PG", txn_id="T-1")
        out = tx.end_transaction(txn_id, commit=False)
        assert out.status is TxStatus.ROLLED_BACK and out.half_count == 1
        assert tx.end_transaction(txn_id, commit=True).status is TxStatus.ROLLED_BACK
        with pytest.raises(TransactionError, match="ROLLED_BACK"):
            tx.prepare_half("Pay", 0, b"late", {}, "PG", txn_id="T-1")
    finally:
        tx.shutdown()
    assert box.s.max_offset("Pay", 0) == 0


def test_batch_transaction_from_many_writers_commits_all_at_once(box: StoreBox) -> None:
    tx = service(box)
    txn_id = "query-7:batch-3"
    try:

        def writer(w: int) -> None:
            for b in range(5):
                bodies = [f"{w}-{b}-{i}".encode() for i in range(100)]
                res = tx.put_half_batch(batch("Out", bodies, queue_id=w % 4), "spark", txn_id)
                assert res.ok, res.error

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        tx.prepare_half("Out", 0, b"single", {}, "spark", txn_id=txn_id)
        info = tx.transaction(txn_id)
        assert info is not None and info.status is TxStatus.OPEN and info.half_count == 2001
        assert box.read_topic("Out") == []
        out = tx.end_transaction(txn_id, commit=True)
        assert (out.status, out.half_count, out.restored, out.complete) == (TxStatus.COMMITTED, 2001, 2001, True)
        got = box.read_topic("Out")
        assert sorted(m.body for m in got) == sorted(
            [f"{w}-{b}-{i}".encode() for w in range(4) for b in range(5) for i in range(100)] + [b"single"]
        )
        for w in range(4):  # each writer's order is kept within its queue
            mine = [m.body for m in got if m.body.startswith(f"{w}-".encode())]
            assert mine == [f"{w}-{b}-{i}".encode() for b in range(5) for i in range(100)]
        ops = box.read_queue(TRANS_OP_HALF_TOPIC)
        assert [op.tags for op in ops] == ["d", "f"]
        assert len(ops[0].body) < 64  # contiguous halves are written as runs
    finally:
        tx.shutdown()


def test_bad_batches_are_refused_whole(box: StoreBox) -> None:
    tx = service(box)
    try:
        good = batch("Out", [b"a", b"b"])
        with pytest.raises(MessageIllegalError, match="entry 2"):
            tx.put_half_batch(good + b"\x00" * 10, "spark", "t1")
        other = batch("Out", [b"c"], props={Prop.TRANSACTION_ID: "other"})
        with pytest.raises(MessageIllegalError, match="other"):
            tx.put_half_batch(good + other, "spark", "t1")
        with pytest.raises(MessageIllegalError):
            tx.put_half_batch(good, "spark", "")
        assert box.s.max_offset(TRANS_HALF_TOPIC, 0) == 0
        with pytest.raises(MessageIllegalError, match="MESSAGE_SIZE_EXCEEDED"):  # over max_message_size
            tx.put_half_batch(batch("Out", [b"x" * 70_000]), "spark", "t1")
        assert tx.transaction("t1") is None  # its only puts were refused: nothing is kept for it
    finally:
        tx.shutdown()


def test_list_by_prefix_and_end_in_bulk(box: StoreBox) -> None:
    tx = service(box)
    try:
        for i in range(3):
            tx.put_half_batch(batch("Out", [b"q1"]), "spark", f"q1:{i}")
        tx.put_half_batch(batch("Out", [b"q2"]), "spark", "q2:0")
        tx.end_transaction("q1:0", commit=True)
        assert [t.txn_id for t in tx.list_transactions("q1:")] == ["q1:0", "q1:1", "q1:2"]
        assert [t.txn_id for t in tx.list_transactions("q1:", TxStatus.OPEN)] == ["q1:1", "q1:2"]
        ended = tx.end_transactions(commit=False, prefix="q1:")
        assert [(e.txn_id, e.status) for e in ended] == [("q1:1", TxStatus.ROLLED_BACK), ("q1:2", TxStatus.ROLLED_BACK)]
        assert [m.body for m in box.read_topic("Out")] == [b"q1"]
        assert tx.transaction("q2:0").status is TxStatus.OPEN  # type: ignore[union-attr]
    finally:
        tx.shutdown()


def test_commit_only_the_listed_writer_attempts(box: StoreBox) -> None:
    tx = service(box)
    try:
        tx.put_half_batch(batch("Out", [b"p0-a0"], props={ATTEMPT: "0:0"}), "spark", "q:1")
        tx.put_half_batch(batch("Out", [b"p0-a1"], props={ATTEMPT: "0:1"}), "spark", "q:1")  # a retried task
        tx.put_half_batch(batch("Out", [b"p1-a0"], props={ATTEMPT: "1:0"}), "spark", "q:1")
        out = tx.end_transaction("q:1", commit=True, committed_attempts=["0:1", "1:0"])
        assert out.half_count == 3 and out.restored == 2
        assert sorted(m.body for m in box.read_topic("Out")) == [b"p0-a1", b"p1-a0"]
    finally:
        tx.shutdown()


@pytest.mark.parametrize(
    ("budget", "remade"),
    [(0, "all"), (250_000, "some"), (DEFAULT_COMMIT_MEMORY_BYTES, "none")],
    ids=["all-remade", "some-remade", "all-kept"],
)
def test_a_commit_past_its_memory_bound_stores_the_same_entries(box: StoreBox, budget: int, remade: str) -> None:
    """A commit keeps at most commit_memory_bytes of the committed entries it made before deciding; the halves
    past that are made again as they are stored. Either way the same entries land, in order, attempts filtered."""
    tx = service(box, put_chunk_bytes=4096, commit_memory_bytes=budget)
    made_again: list[int] = []
    real_commit_runs = tx._commit_runs

    def spy(offsets: list[int], attempts: list[str] | None) -> object:
        kept, later, queues, total = real_commit_runs(offsets, attempts)
        made_again.append(len(later))
        return kept, later, queues, total

    tx._commit_runs = spy  # type: ignore[method-assign,assignment]
    try:
        expected: dict[int, list[bytes]] = {0: [], 1: []}
        for k in range(6):  # 3,000 halves, more than one store get (run) holds; attempt 2:0 is a failed task
            bodies = [f"b{k}-{i:04d}".encode() * 4 for i in range(500)]
            attempt = f"{k % 3}:0"
            assert tx.put_half_batch(batch("Out", bodies, queue_id=k % 2, props={ATTEMPT: attempt}), "spark", "m").ok
            if attempt != "2:0":
                expected[k % 2] += bodies
        with pytest.raises(TransactionError, match="would make 2000 messages visible but its writers sent 2001"):
            tx.end_transaction("m", commit=True, committed_attempts=["0:0", "1:0"], expected_messages=2001)
        assert tx.transaction("m").status is TxStatus.OPEN  # type: ignore[union-attr]
        out = tx.end_transaction("m", commit=True, committed_attempts=["0:0", "1:0"], expected_messages=2000)
        assert out.status is TxStatus.COMMITTED and out.complete and out.restored == 2000
        assert made_again[0] == made_again[1]  # the refused commit made as many again as the one that went through
        assert {"all": made_again[1] == 3000, "some": 0 < made_again[1] < 3000, "none": made_again[1] == 0}[remade]
        for q in (0, 1):
            got = box.read_queue("Out", q)
            assert [m.body for m in got] == expected[q]
            assert all(SysFlag.transaction_type(m.sys_flag) == SysFlag.TRANSACTION_COMMIT_TYPE for m in got)
    finally:
        tx.shutdown()


def test_end_of_an_unknown_id_is_refused_unless_asked_to_record_it(box: StoreBox) -> None:
    """An unknown id was recorded as ended by every caller: `sluice tx commit typo` invented an outcome that showed
    in `tx list` and survived a restart. Only a caller that asks (the Spark sink, fencing its writers) records it."""
    tx = service(box)
    try:
        for commit in (True, False):
            with pytest.raises(QueryNotFoundError, match=r"no transaction 'typo:1'.*nothing was recorded"):
                tx.end_transaction("typo:1", commit=commit)
        with pytest.raises(QueryNotFoundError, match="'typo:2'"):
            tx.end_transactions(False, txn_ids=["typo:2"])
        assert tx.transaction("typo:1") is None and tx.list_transactions("typo") == []
        out = tx.end_transaction("empty:1", commit=True, record_unknown=True)
        assert out.status is TxStatus.COMMITTED and out.half_count == 0
        assert tx.end_transaction("empty:1", commit=False).already_ended
    finally:
        tx.shutdown()



def test_message_bigger_than_a_chunk_is_restored_alone(box: StoreBox) -> None:
    tx = service(box, put_chunk_bytes=4096)
    try:
        tx.put_half_batch(batch("Out", [b"small-1", b"B" * 10_000, b"small-2"]), "spark", "big-one")
        assert tx.end_transaction("big-one", commit=True).restored == 3
        got = box.read_topic("Out")
        assert [len(m.body) for m in got] == [7, 10_000, 7]
        assert all(SysFlag.transaction_type(m.sys_flag) == SysFlag.TRANSACTION_COMMIT_TYPE for m in got)
        assert len({m.prepared_transaction_offset for m in got}) == 3
    finally:
        tx.shutdown()


def test_fast_path_for_batches_encoded_as_halves(box: StoreBox) -> None:
    tx = service(box)
    try:
        buf = b"".join(
            encode_half_entry("Out", i % 2, f"h{i}".encode(), {"k": "v"}, "spark", "fast") for i in range(50)
        )
        assert tx.put_half_batch(buf, "spark", "fast").ok
        assert box.read_topic("Out") == []
        wrong_txn = encode_half_entry("Out", 0, b"x", {}, "spark", "other")
        wrong_group = encode_half_entry("Out", 0, b"x", {}, "flink", "fast")
        no_real = encode_entry(b"RMQ_SYS_TRANS_HALF_TOPIC", 0, b"x", encode_properties({Prop.TRANSACTION_ID: "fast"}))
        for bad in (wrong_txn, wrong_group, no_real, buf + b"\x00\x01"):
            with pytest.raises(MessageIllegalError):
                tx.put_half_batch(buf + bad, "spark", "fast")
        assert tx.end_transaction("fast", commit=True).restored == 50
        got = box.read_topic("Out")
        assert sorted(m.body for m in got) == sorted(f"h{i}".encode() for i in range(50))
        assert all(m.properties["k"] == "v" and Prop.REAL_TOPIC not in m.properties for m in got)
    finally:
        tx.shutdown()


def test_raw_commit_encoding_equals_the_decoded_one() -> None:
    props = {Prop.KEYS: "a b", "x": "é", Prop.UNIQ_KEY: "U"}
    half = encode_half_entry("Real", 5, b"body", props, "PG", "t", flag=7, born_timestamp=123, reconsume_times=2)
    raw = RawHalf(queue_offset=42, commitlog_offset=9000, entry=half)
    decoded = decode_entry(half)
    decoded.queue_offset, decoded.commitlog_offset = 42, 9000
    fast = commit_raw(raw)
    assert fast.entry == committed_entry(decoded)
    assert fast.real_queue == ("Real", 5)
    assert raw_property(half, Prop.PGROUP) == "PG" and raw_property(half, "missing") is None


def test_ended_transactions_are_forgotten_after_the_retention_time(box: StoreBox) -> None:
    tx = service(box, outcome_retention_ms=1)
    tx.put_half_batch(batch("Out", [b"old"]), "spark", "old")
    tx.end_transaction("old", commit=True)
    tx.put_half_batch(batch("Out", [b"open"]), "spark", "open")
    tx.put_half_batch(batch("Out", [b"new"]), "spark", "new")
    tx.end_transaction("new", commit=False)
    time.sleep(0.01)
    tx.persist()  # prunes: "old" is ended, finished, past retention and below every open half
    assert tx.transaction("old") is None
    assert tx.transaction("new") is not None  # its half lies above the open one: still needed at start-up
    tx.shutdown()
    box.crash()
    box.open()
    tx = service(box, outcome_retention_ms=1)
    try:
        assert tx.transaction("old") is None
        assert tx.transaction("open").status is TxStatus.OPEN  # type: ignore[union-attr]
        assert tx.transaction("new").status is TxStatus.ROLLED_BACK  # type: ignore[union-attr]
        assert tx.end_transaction("open", commit=True).restored == 1
        assert sorted(m.body for m in box.read_topic("Out")) == [b"old", b"open"]
    finally:
        tx.shutdown()


def test_at_most_max_outcomes_ended_transactions_are_remembered(box: StoreBox) -> None:
    """RocketMQ-style producers end one transaction per message; within the retention time, only the
    max_outcomes latest ended are kept, the earliest forgotten first, and a restart does not bring them back. One
    still open keeps the ones ended after its half (the start-up scan would find them undecided). A batch
    transaction (the Spark sink's) is not counted: its outcome stays for the retention time."""
    tx = service(box, max_outcomes=3)
    assert tx.put_half_batch(batch("Out", [b"b0", b"b1"]), "spark", "batch").ok
    assert tx.end_transaction("batch", commit=True).restored == 2
    # Micro-batches of one row and of none are batch transactions too (they were counted as single-message ones,
    # and forgotten early: a re-run after a crash would then write the batch again).
    assert tx.put_half_batch(batch("Out", [b"one"]), "spark", "batch1").ok
    assert tx.end_transaction("batch1", commit=True).restored == 1
    assert tx.end_transaction("batch0", commit=True, committed_attempts=["7"], record_unknown=True).half_count == 0
    for i in range(6):
        tx.prepare_half("Out", 0, b"m%d" % i, {}, "rmq", txn_id=f"t{i}")
        tx.end_transaction(f"t{i}", commit=i % 2 == 0)
        time.sleep(0.002)  # distinct end times: the earliest ended is forgotten first
    tx.persist()
    assert [t.txn_id for t in tx.list_transactions()] == ["batch", "batch0", "batch1", "t3", "t4", "t5"]
    assert tx.end_transaction("t4", commit=False).status is TxStatus.COMMITTED  # kept ones still answer
    tx.shutdown()
    box.crash()  # right after that persist: start-up reads no decision it forgot
    box.open()
    tx = service(box, max_outcomes=3)
    assert [t.txn_id for t in tx.list_transactions()] == ["batch", "batch0", "batch1", "t3", "t4", "t5"]
    tx.prepare_half("Out", 0, b"open", {}, "rmq", txn_id="open")
    for i in range(6, 9):
        tx.prepare_half("Out", 0, b"m%d" % i, {}, "rmq", txn_id=f"t{i}")
        tx.end_transaction(f"t{i}", commit=True)
    tx.persist()
    assert [t.txn_id for t in tx.list_transactions()] == ["batch", "batch0", "batch1", "open", "t3", "t4", "t5", "t6",
                                                           "t7", "t8"]
    tx.shutdown()
    box.crash()
    box.open()
    tx = service(box, max_outcomes=3)
    try:
        assert tx.transaction("t0") is None and tx.transaction("t2") is None
        assert tx.transaction("open").status is TxStatus.OPEN  # type: ignore[union-attr]
        rolled_back, committed = TxStatus.ROLLED_BACK, TxStatus.COMMITTED
        assert [t.status for t in tx.list_transactions("t")] == [rolled_back, committed, rolled_back] + [committed] * 3
        assert tx.end_transaction("open", commit=True).restored == 1
        tx.persist()
        assert [t.txn_id for t in tx.list_transactions()] == ["batch", "batch0", "batch1", "open", "t7", "t8"]
        bodies = [b"b0", b"b1", b"m0", b"m2", b"m4", b"m6", b"m7", b"m8", b"one", b"open"]
        assert sorted(m.body for m in box.read_topic("Out")) == bodies
    finally:
        tx.shutdown()


def test_persist_never_skips_halves_or_decisions_being_written(box: StoreBox) -> None:
    tx = service(box)
    state_path = os.path.join(box.path, "config", "transactionState.json")
    try:
        tx.put_half_batch(batch("Out", [b"a", b"b"]), "spark", "done")
        tx.end_transaction("done", commit=False)
        box.s.wait_dispatched()
        busy = tx._begin_put("busy", "spark")  # a put of "busy" starts: its halves will land at >= 2 ...
        tx.put_half_batch(batch("Out", [b"c", b"d", b"e"]), "spark", "other")  # ... after these (2..4)
        tx.end_transaction("other", commit=False)
        box.s.wait_dispatched()
        tx.persist()
        with open(state_path) as f:
            assert json.load(f)["halfScanFrom"] == 2  # not 5: the busy put's halves may get any offset from 2
        tx._end_put(busy, None)
        tx.persist()
        with open(state_path) as f:
            assert json.load(f)["halfScanFrom"] == 5  # nothing open or in flight: the end of the half queue
    finally:
        tx.shutdown()


def test_start_up_survives_a_commit_whose_halves_expired(box: StoreBox, caplog: pytest.LogCaptureFixture) -> None:
    # A commit decision (no finished marker) over halves that no longer exist, as if their files expired.
    props = {Prop.TAGS: "d", Prop.TRANSACTION_ID: "lost", "TRAN_DECISION": "COMMIT", "TRAN_COMMIT_START": ""}
    assert box.s.put_message(TRANS_OP_HALF_TOPIC, 0, b"7-9", props).ok
    tx = service(box)
    try:
        info = tx.transaction("lost")
        assert info is not None and info.status is TxStatus.COMMITTED and info.complete
        assert "cannot finish" in caplog.text
    finally:
        tx.shutdown()


def test_a_transaction_past_max_halves_is_refused_and_keeps_what_it_has(box: StoreBox) -> None:
    tx = service(box, max_halves=5)
    try:
        assert tx.put_half_batch(batch("Out", [b"a", b"b", b"c"]), "spark", "big").ok
        before = box.s.max_offset("RMQ_SYS_TRANS_HALF_TOPIC", 0)
        with pytest.raises(TransactionError, match="would hold 6 half messages, over this broker's limit of 5"):
            tx.put_half_batch(batch("Out", [b"d", b"e", b"f"]), "spark", "big")
        assert box.s.max_offset("RMQ_SYS_TRANS_HALF_TOPIC", 0) == before  # nothing of the refused put stored
        assert tx.put_half_batch(batch("Out", [b"d", b"e"]), "spark", "big").ok  # up to the limit still fits
        assert tx.end_transaction("big", commit=True).restored == 5
        assert sorted(m.body for m in box.read_topic("Out")) == [b"a", b"b", b"c", b"d", b"e"]
    finally:
        tx.shutdown()


def test_end_by_offset_of_any_half_of_a_batch(box: StoreBox) -> None:
    """RocketMQ's END_TRANSACTION names one half by its commit-log offset: any half of a batch transaction ends all
    of it, though only single halves are kept in the offset table (batch halves are looked up in the store)."""
    tx = service(box)
    try:
        res = tx.put_half_batch(batch("Out", [b"a", b"b", b"c"]), "spark", "by-offset")
        assert tx.end_transaction_by_offset(res.commitlog_offsets[1], commit=True).restored == 3
        assert sorted(m.body for m in box.read_topic("Out")) == [b"a", b"b", b"c"]
    finally:
        tx.shutdown()


def test_a_committed_message_bigger_than_a_re_store_chunk_goes_alone(box: StoreBox) -> None:
    tx = service(box, put_chunk_bytes=4096)
    try:
        bodies = [b"s" * 100, b"B" * 6000, b"t" * 100]  # the middle one exceeds a 4 KiB re-store chunk
        assert tx.put_half_batch(batch("Out", bodies, props={"k": "v"}), "spark", "big-one").ok
        assert tx.end_transaction("big-one", commit=True).restored == 3
        got = box.read_topic("Out")
        assert [m.body for m in got] == bodies  # in half order, the big one stored on its own between the others
        assert [m.properties["TRAN_PREPARED_QUEUE_OFFSET"] for m in got] == ["0", "1", "2"]
        assert all(m.properties["k"] == "v" and m.prepared_transaction_offset > 0 for m in got[1:])
    finally:
        tx.shutdown()
    assert box.s.check() == []


def test_ended_batch_transactions_keep_no_table_per_message(box: StoreBox) -> None:
    """Outcomes are kept a day; a finished batch transaction keeps its count and highest half, not a table entry
    per message. What is asked of it afterwards (info, ending again, pruning, restart) still answers."""
    tx = service(box)
    try:
        tx.put_half_batch(batch("Out", [b"c%d" % i for i in range(300)]), "spark", "big-commit")
        tx.put_half_batch(batch("Out", [b"r%d" % i for i in range(200)]), "spark", "big-rollback")
        single = tx.put_half_batch(batch("Out", [b"one"]), "spark", "single")
        assert tx.end_transaction("big-commit", commit=True).restored == 300
        assert tx.end_transaction("big-rollback", commit=False).half_count == 200
        tx.end_transaction("single", commit=True)
        internal = {tid: (len(t.halves), len(t.decided), t.highest_half()) for tid, t in tx._txns.items()}
        assert internal == {"big-commit": (0, 0, 299), "big-rollback": (0, 0, 499), "single": (0, 0, 500)}
        assert tx._by_half_cl_offset == {}  # RocketMQ's end-by-offset of an ended half reads its id from the store:
        by_offset = tx.end_transaction_by_offset(single.commitlog_offsets[0], commit=False)
        assert by_offset.already_ended and by_offset.status is TxStatus.COMMITTED and by_offset.half_count == 1
        assert {t.txn_id: t.half_count for t in tx.list_transactions()} == {
            "big-commit": 300, "big-rollback": 200, "single": 1,
        }
        again = tx.end_transaction("big-commit", commit=False)
        assert again.already_ended and again.status is TxStatus.COMMITTED and again.half_count == 300
        tx.persist()
    finally:
        tx.shutdown()
    box.crash()
    box.open()
    tx = service(box)
    try:
        assert {t.txn_id: (t.status, t.half_count) for t in tx.list_transactions()} == {
            "big-commit": (TxStatus.COMMITTED, 300), "big-rollback": (TxStatus.ROLLED_BACK, 200),
            "single": (TxStatus.COMMITTED, 1),
        }
        assert all(not t.halves and not t.decided for t in tx._txns.values())  # none rebuilt for finished ones
        assert {tid: t.highest_half() for tid, t in tx._txns.items()} == {
            "big-commit": 299, "big-rollback": 499, "single": 500,
        }
        assert len(box.read_topic("Out")) == 301  # nothing re-stored twice
    finally:
        tx.shutdown()


def test_a_half_at_commit_log_offset_0_is_restored_after_an_interrupted_commit(box: StoreBox) -> None:
    """Finishing a commit skips the halves its real queues already hold. Plain messages carry PREPARED TRANSACTION
    OFFSET 0, which is also the commit-log offset of the first half a fresh broker stores: only entries this
    transaction committed may count as re-stored, or that half is never made visible."""
    tx = service(box, check_interval_ms=3_600_000)
    res = tx.put_half_batch(batch("Out", [b"row0", b"row1", b"row2"]), "spark", "zero")
    assert res.commitlog_offsets[0] == 0

    def refused(txn_id: str, pieces: object) -> int:
        raise TransactionError("store refused for now")

    tx._put_chunk = refused  # type: ignore[method-assign,assignment]
    assert not tx.end_transaction("zero", commit=True).complete  # decided, nothing re-stored
    assert box.s.put_message("Out", 0, b"plain", {}).ok  # a plain send to the same queue: prepared offset 0
    tx._stop.set()
    box.crash()
    box.open()
    tx = service(box, check_interval_ms=3_600_000)
    try:
        info = tx.transaction("zero")
        assert info is not None and info.status is TxStatus.COMMITTED and info.complete
        assert sorted(m.body for m in box.read_queue("Out", 0)) == [b"plain", b"row0", b"row1", b"row2"]
    finally:
        tx.shutdown()


def test_entries_of_other_transactions_do_not_count_as_restored(box: StoreBox) -> None:
    """Another transaction's committed entry in the same queue names a different half: it must not stand in for
    one of ours, whatever its PREPARED TRANSACTION OFFSET."""
    tx = service(box, check_interval_ms=3_600_000)
    try:
        tx.put_half_batch(batch("Out", [b"a0", b"a1"]), "spark", "A")
        calls = {"n": 0}
        real_put_chunk = tx._put_chunk

        def first_refused(txn_id: str, pieces: list[tuple[bytes, object]]) -> int:
            calls["n"] += 1
            if calls["n"] == 1:
                raise TransactionError("store refused for now")
            return real_put_chunk(txn_id, pieces)  # type: ignore[arg-type]

        tx._put_chunk = first_refused  # type: ignore[method-assign,assignment]
        assert not tx.end_transaction("A", commit=True).complete
        # a plain message whose header claims A's first half (a client may set the field on a plain send)
        a0 = box.read_queue(TRANS_HALF_TOPIC)[0].commitlog_offset
        assert box.s.put_message("Out", 0, b"fake", {}, prepared_transaction_offset=a0).ok
        assert tx.check_once() == 0
        assert tx.transaction("A").complete  # type: ignore[union-attr]
        assert sorted(m.body for m in box.read_queue("Out", 0)) == [b"a0", b"a1", b"fake"]
    finally:
        tx.shutdown()


def _expire_every_half(box: StoreBox) -> None:
    """Roll the 1 MiB commit-log files with filler and delete the expired ones (file_reserved_time_hours=0)."""
    for _ in range(40):
        assert box.s.put_message("Filler", 0, b"f" * 60_000, {}).ok
    box.s.flush()
    assert box.s.wait_dispatched()
    assert box.s.cleanup.clean_once(manual=True).deleted_commit_log_files >= 1


def test_a_commit_that_can_never_finish_does_not_stop_check_back(
    box: StoreBox, caplog: pytest.LogCaptureFixture
) -> None:
    """A commit whose halves (and decision) expired before its re-store finished must not stop the pass: failing
    on it before checking back anyone, open transactions would never be asked nor rolled back."""
    box.close()
    box.open(file_reserved_time_hours=0)
    asked: list[str] = []
    tx = service(box, check_interval_ms=3_600_000, transaction_timeout_ms=1,
                 checker=lambda g, t, h: asked.append(t) or None)
    try:
        tx.put_half_batch(batch("Out", [b"x%d" % i for i in range(5)]), "PG", "C")
        real_put_chunk = tx._put_chunk

        def refused(txn_id: str, pieces: object) -> int:
            raise TransactionError("store refused for now")

        tx._put_chunk = refused  # type: ignore[method-assign,assignment]
        assert not tx.end_transaction("C", commit=True).complete
        tx._put_chunk = real_put_chunk  # type: ignore[method-assign]
        _expire_every_half(box)
        tx.prepare_half("Pay", 0, b"debit", {}, "PG", txn_id="O")
        time.sleep(0.01)
        assert tx.check_once() == 1  # no exception: C is given up on, O is asked
        assert asked == ["O"]
        info = tx.transaction("C")
        assert info is not None and info.status is TxStatus.COMMITTED and info.complete  # given up, not retried
        assert "cannot finish" in caplog.text
    finally:
        tx.shutdown()


def test_one_failing_transaction_does_not_stop_a_check_pass(box: StoreBox, caplog: pytest.LogCaptureFixture) -> None:
    """Every check of a pass is counted before any is asked; a failure while finishing one commit, asking one
    transaction or ending it must not leave the others counted but unasked (nor stop the pass)."""
    asked: list[str] = []
    tx = service(box, check_interval_ms=3_600_000, transaction_timeout_ms=1,
                 checker=lambda g, t, h: asked.append(t) or TxState.COMMIT)
    try:
        tx.put_half_batch(batch("Out", [b"s0", b"s1"]), "PG", "stalled")
        real_put_chunk = tx._put_chunk

        def refused(txn_id: str, pieces: object) -> int:
            raise TransactionError("store refused for now")

        tx._put_chunk = refused  # type: ignore[method-assign,assignment]
        assert not tx.end_transaction("stalled", commit=True).complete
        for txn_id in ("a", "b", "c"):
            tx.prepare_half("Pay", 0, txn_id.encode(), {}, "PG", txn_id=txn_id)
        real_ask, real_end = tx._ask, tx.end_transaction

        def ask(t: object) -> TxState | None:
            if getattr(t, "txn_id", "") == "a":
                raise OSError("simulated read failure")
            return real_ask(t)  # type: ignore[arg-type]

        def end(txn_id: str, commit: bool, **kwargs: object) -> object:
            if txn_id == "b":
                raise TransactionError("simulated failure to decide")
            return real_end(txn_id, commit, **kwargs)  # type: ignore[arg-type]

        tx._ask = ask  # type: ignore[method-assign,assignment]
        tx.end_transaction = end  # type: ignore[method-assign,assignment]
        time.sleep(0.01)
        assert tx.check_once() == 3
        assert asked == ["b", "c"]
        assert {t.txn_id: t.status for t in tx.list_transactions()} == {
            "stalled": TxStatus.COMMITTED, "a": TxStatus.OPEN, "b": TxStatus.OPEN, "c": TxStatus.COMMITTED,
        }
        assert not tx.transaction("stalled").complete  # type: ignore[union-attr]  # retried next pass
        tx._put_chunk = real_put_chunk  # type: ignore[method-assign]
        tx.check_once()
        assert tx.transaction("stalled").complete  # type: ignore[union-attr]
        assert "stalled" in caplog.text and "simulated read failure" in caplog.text
    finally:
        tx.shutdown()


def test_multi_half_transactions_leave_no_end_by_offset_entries(box: StoreBox) -> None:
    """Each single-message put gets an end-by-offset entry; once a transaction ends and finishes, all of its
    entries go, not only a one-half transaction's."""
    tx = service(box)
    try:
        for i in range(10):
            for _ in range(3):
                tx.prepare_half("T", 0, b"x", {}, "PG", txn_id=f"tx-{i}")
            tx.end_transaction(f"tx-{i}", commit=i % 2 == 0)
        assert tx._by_half_cl_offset == {}
    finally:
        tx.shutdown()


def test_a_refused_first_put_leaves_no_transaction(box: StoreBox) -> None:
    tx = service(box, max_halves=2)
    try:
        with pytest.raises(TransactionError, match="over this broker's limit of 2"):
            tx.put_half_batch(batch("T", [b"a", b"b", b"c"]), "PG", "big")
        assert tx.list_transactions() == []
        assert tx.put_half_batch(batch("T", [b"a", b"b"]), "PG", "big").ok  # a fitting put still starts it
        assert [t.txn_id for t in tx.list_transactions()] == ["big"]
    finally:
        tx.shutdown()


def test_delayed_transactional_messages_are_refused(box: StoreBox) -> None:
    """A committed half is stored in its real topic at once; RocketMQ's producer drops DELAY on transactional
    sends. Sluice says so instead of delivering a 'delayed' message immediately."""
    tx = service(box)
    try:
        with pytest.raises(MessageIllegalError, match="delayed transactional messages are not supported"):
            tx.prepare_half("Pay", 0, b"x", {Prop.DELAY: "3"}, "PG", txn_id="D")
        delayed = batch("Out", [b"a", b"b"], props={Prop.DELAY: "2"})
        with pytest.raises(MessageIllegalError, match="delayed transactional messages are not supported"):
            tx.put_half_batch(delayed, "spark", "D")
        half_form = encode_half_entry("Out", 0, b"h", {Prop.DELAY: "1"}, "spark", "D")
        with pytest.raises(MessageIllegalError, match="delayed transactional messages are not supported"):
            tx.put_half_batch(half_form, "spark", "D")
        assert box.s.max_offset(TRANS_HALF_TOPIC, 0) == 0 and tx.list_transactions() == []
        assert tx.prepare_half("Pay", 0, b"x", {Prop.DELAY: "0"}, "PG", txn_id="D")[0].ok  # level 0: no delay
        assert tx.put_half_batch(batch("Out", [b"body DELAY\x013\x02"]), "spark", "D").ok  # only in a body
    finally:
        tx.shutdown()
