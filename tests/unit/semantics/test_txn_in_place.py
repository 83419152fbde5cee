"""Batch transactions written in place (txn_in_place.py) on a real store: one copy of each message, check-back and
timeouts as for halves, attempts, limits, and refusals that store nothing."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

import pytest

import broker.semantics.transaction as transaction_module
from broker.errors import InvalidArgumentError, MessageIllegalError, ResponseCode
from broker.format.message import Prop, StoredMessage, SysFlag, encode_entry, encode_properties
from broker.format.system_topics import TRANS_HALF_TOPIC
from broker.format.transaction_codec import encode_half_entry
from broker.semantics.transaction import TransactionError, TransactionService, TxState, TxStatus

if TYPE_CHECKING:
    from store_box import StoreBox


def service(box: StoreBox, **kwargs: object) -> TransactionService:
    tx = TransactionService(box.s, os.path.join(box.path, "config"), **kwargs)  # type: ignore[arg-type]
    tx.start()
    return tx


def rows(topic: str, bodies: list[bytes], queue_id: int = 0) -> bytes:
    return b"".join(encode_entry(topic.encode(), queue_id, b, encode_properties({"k": "v"})) for b in bodies)


def test_each_message_is_written_once_and_shown_by_the_commit(box: StoreBox) -> None:
    tx = service(box)
    try:
        before = box.s.max_phys_offset()
        sent = rows("Once", [b"m%04d" % i for i in range(1000)])
        res = tx.put_in_place(sent, "spark", "q:1", attempt="a")
        assert res.ok and res.queue_offsets == list(range(1000))
        assert box.read_topic("Once") == []
        assert tx.transaction("q:1").half_count == 1000  # type: ignore[union-attr]
        out = tx.end_transaction("q:1", commit=True, expected_messages=1000)
        assert out.status is TxStatus.COMMITTED and out.complete and out.half_count == 1000
        got = box.read_topic("Once")
        assert [m.body for m in got] == [b"m%04d" % i for i in range(1000)]
        assert got[0].properties["k"] == "v" and got[0].commitlog_offset == res.commitlog_offsets[0]
        # the rows once, plus a slice record, a decision, a marker and a finished op: well under one row's copy
        overhead = box.s.max_phys_offset() - before - len(sent)
        assert 0 < overhead < 1500, overhead
        assert tx.transaction("q:1").half_count == 1000  # type: ignore[union-attr]
    finally:
        tx.shutdown()


def test_an_open_transaction_holds_its_queues_and_check_back_ends_it(box: StoreBox) -> None:
    asked: list[tuple[str, str, str]] = []

    def checker(group: str, txn_id: str, record: StoredMessage) -> TxState | None:
        asked.append((group, txn_id, record.properties.get(Prop.TRANSACTION_ID, "")))
        return TxState.UNKNOWN

    tx = service(box, checker=checker, transaction_timeout_ms=1, check_interval_ms=3_600_000, check_max=2)
    try:
        assert box.s.put_batch(rows("Held", [b"before"])).ok
        assert tx.put_in_place(rows("Held", [b"t1", b"t2"]), "PG", "open:1", attempt="a").ok
        assert box.s.put_batch(rows("Held", [b"after"])).ok
        assert box.s.wait_dispatched()
        assert box.s.queue_ranges("Held", [0]) == [(0, 0, 1)]  # the readable limit: the transaction's first row
        assert [m.body for m in box.read_topic("Held")] == [b"before"]
        time.sleep(0.01)
        assert tx.check_once() == 1 and asked == [("PG", "open:1", "open:1")]
        time.sleep(0.01)
        assert tx.check_once() == 1
        time.sleep(0.01)
        assert tx.check_once() == 0  # check_max reached: rolled back, its rows skipped, the queue free again
        assert tx.transaction("open:1").status is TxStatus.ROLLED_BACK  # type: ignore[union-attr]
        assert [m.body for m in box.read_topic("Held")] == [b"before", b"after"]
        assert box.s.queue_ranges("Held", [0]) == [(0, 0, 4)]
    finally:
        tx.shutdown()


def test_a_writer_that_never_decides_is_refused_past_the_lifetime_and_its_queues_are_freed(
    box: StoreBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer sending more often than the idle timeout never lets the check-back fire; the lifetime stops it.
    The service's clock is the test's, so no pause of the machine can make the writer look idle."""
    now_ms = [1_000_000]
    monkeypatch.setattr(transaction_module, "_now_ms", lambda: now_ms[0])
    lifetime_ms, idle_ms, every_ms = 300, 100, 20
    tx = service(box, transaction_timeout_ms=idle_ms, check_interval_ms=3_600_000, check_max=1,
                 max_open_ms=lifetime_ms)
    try:
        assert box.s.put_batch(rows("Trickle", [b"before"])).ok
        for i in range(lifetime_ms // every_ms):  # a write every 20 ms: never idle for idle_ms
            assert tx.put_in_place(rows("Trickle", [b"t%03d" % i]), "PG", "trickle:1", attempt="a").ok
            now_ms[0] += every_ms
            assert tx.check_once() == 0  # still writing: not idle, nothing checked back
        end = box.s.max_phys_offset()
        for attempt in ("a", "b"):  # the lifetime is over: refused, storing nothing
            with pytest.raises(TransactionError) as refused:
                tx.put_in_place(rows("Trickle", [b"late"]), "PG", "trickle:1", attempt=attempt)
            assert refused.value.code is ResponseCode.TRANSACTION_FAILED
            assert "transaction_max_open_ms" in refused.value.message
        assert box.s.max_phys_offset() == end
        assert box.s.wait_dispatched()
        assert [m.body for m in box.read_topic("Trickle")] == [b"before"]  # held at the first row meanwhile
        now_ms[0] += idle_ms
        assert tx.check_once() == 1  # idle now: checked back once (no checker answers) ...
        now_ms[0] += idle_ms
        tx.check_once()  # ... and rolled back after check_max checks
        assert tx.transaction("trickle:1").status is TxStatus.ROLLED_BACK  # type: ignore[union-attr]
        assert box.s.put_batch(rows("Trickle", [b"after"])).ok
        assert box.s.wait_dispatched()
        assert [m.body for m in box.read_topic("Trickle")] == [b"before", b"after"]
        # a new transaction id takes messages again
        assert tx.put_in_place(rows("Trickle", [b"next"]), "PG", "trickle:2", attempt="a").ok
    finally:
        tx.shutdown()


def test_a_restart_knows_the_attempts_and_their_rows(box: StoreBox) -> None:
    tx = service(box)
    for attempt in ("t0.0", "t0.1"):
        assert tx.put_in_place(rows("Att", [attempt.encode() + b"-%d" % i for i in range(5)]), "spark", "r:1",
                               attempt=attempt, coordinator="broker-b").ok
    tx.shutdown()
    box.crash()
    box.open()
    tx = service(box)
    try:
        info = tx.transaction("r:1")
        assert info is not None and info.status is TxStatus.OPEN and info.half_count == 10
        with pytest.raises(TransactionError, match="would make 5 messages visible but its writers sent 10"):
            tx.end_transaction("r:1", commit=True, committed_attempts=["t0.1"], expected_messages=10)
        assert tx.end_transaction("r:1", commit=True, committed_attempts=["t0.1"], expected_messages=5).complete
        assert sorted(m.body for m in box.read_topic("Att")) == [b"t0.1-%d" % i for i in range(5)]
        records = box.read_topic(TRANS_HALF_TOPIC)
        assert {(m.properties["TRAN_ATTEMPT"], m.properties["TRAN_COORDINATOR"]) for m in records} == {
            ("t0.0", "broker-b"), ("t0.1", "broker-b")
        }
    finally:
        tx.shutdown()


def test_a_transaction_cannot_mix_halves_and_rows_in_place(box: StoreBox) -> None:
    tx = service(box)
    try:
        assert tx.put_in_place(rows("Mix", [b"a"]), "spark", "mix:1").ok
        half = encode_half_entry("Mix", 0, b"h", {}, "spark", "mix:1")
        with pytest.raises(TransactionError, match="cannot mix"):
            tx.put_half_batch(half, "spark", "mix:1")
        assert tx.put_half_batch(encode_half_entry("Mix", 0, b"h", {}, "spark", "mix:2"), "spark", "mix:2").ok
        with pytest.raises(TransactionError, match="cannot mix"):
            tx.put_in_place(rows("Mix", [b"b"]), "spark", "mix:2")
    finally:
        tx.shutdown()


@pytest.mark.parametrize(
    ("attempt", "error"),
    [("a,b", InvalidArgumentError), ("x" * 300, InvalidArgumentError), ("ok", MessageIllegalError),
     ("delayed", MessageIllegalError)],
)
def test_bad_input_stores_nothing(box: StoreBox, attempt: str, error: type[Exception]) -> None:
    tx = service(box)
    try:
        before = box.s.max_phys_offset()
        buf = rows("Bad", [b"x"])
        if attempt == "ok":  # a transaction type set by the client
            buf = encode_entry(b"Bad", 0, b"x", sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE)
        if attempt == "delayed":  # a commit shows its messages at once: a delay would be ignored
            buf += encode_entry(b"Bad", 0, b"later", encode_properties({"DELAY": "3"}))
        with pytest.raises(error):
            tx.put_in_place(buf, "spark", "bad:1", attempt=attempt)
        assert box.s.max_phys_offset() == before and tx.transaction("bad:1") is None
    finally:
        tx.shutdown()


def test_a_rolled_back_transactions_rows_never_show_and_are_counted_once(box: StoreBox) -> None:
    tx = service(box)
    try:
        assert tx.put_in_place(rows("Gone", [b"g%d" % i for i in range(50)]), "spark", "gone:1").ok
        out = tx.end_transaction("gone:1", commit=False)
        assert out.status is TxStatus.ROLLED_BACK and out.complete
        assert box.read_topic("Gone") == []
        assert tx.end_transaction("gone:1", commit=True).status is TxStatus.ROLLED_BACK  # the first outcome stands
        with pytest.raises(TransactionError, match="ROLLED_BACK"):
            tx.put_in_place(rows("Gone", [b"late"]), "spark", "gone:1")
    finally:
        tx.shutdown()


def test_a_slice_whose_record_expired_undecided_is_rolled_back_by_a_marker(
    box: StoreBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of a slice no transaction names any more (its record expired with the log's first files, say while
    the broker was down) would hold their queue for ever: the check pass rolls them back with a marker, which
    replicas apply from the log like any other."""
    tx = service(box, check_interval_ms=3_600_000)
    try:
        assert box.s.put_batch(b"".join(
            encode_entry(b"Orphan", 0, b, sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE, prepared_transaction_offset=1)
            for b in (b"lost-1", b"lost-2")) + rows("Orphan", [b"behind"])).ok
        assert box.s.wait_dispatched() and box.s.max_offset("Orphan", 0) == 0
        tx.check_once()
        assert box.s.max_offset("Orphan", 0) == 0  # its handle is still inside the log: it may yet be decided
        monkeypatch.setattr(box.s, "min_phys_offset", lambda: 2)  # as if the file holding offset 1 had expired
        tx.check_once()
        assert [m.body for m in box.read_topic("Orphan")] == [b"behind"]
        assert box.s.txn_visibility.open_slices() == []
    finally:
        tx.shutdown()
