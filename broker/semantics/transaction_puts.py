"""Half messages coming in: single halves, half batches and in-place slices, each checked and counted against
its transaction's limits (and its producer group, through ``check_group``) before it is stored."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

from broker.errors import MessageIllegalError
from broker.format.batch import SmallBatch, ValidatedBatch, batch_properties
from broker.format.message import PREFIX, Prop, iter_entries
from broker.format.send_checks import check_entries, check_message, validate_producer_group
from broker.format.system_topics import TRANS_HALF_TOPIC
from broker.format.transaction_codec import (
    COORDINATOR,
    check_transaction_id,
    half_properties,
    half_property_conflict,
    half_sys_flag,
    is_half_batch,
    raw_property,
    refuse_delay,
    rewrite_batch_as_half,
)
from broker.semantics.half_run import check_halves
from broker.semantics.transaction_restore import CommitRestore
from broker.semantics.transaction_table import DELAY_NAME, TransactionError, TxnRecord, TxStatus, refused_record
from broker.semantics.txn_in_place import check_attempt, slice_record_properties
from broker.store import PutResult, PutStatus
from broker.store.txn_visibility import mark_in_place


class HalfPuts(CommitRestore):
    """The put side of transactions."""

    def _check_coordinator(self, txn_id: str, coordinator: str) -> None:
        """A transaction's first message here may not name a coordinator broker this one could never ask: it
        would stay open, holding its queues, for ever (coordinator_names.py). Later ones are not asked again."""
        if not coordinator or self.require_coordinator is None:
            return
        with self._lock:
            known = txn_id in self._txns
        if not known:
            self.require_coordinator(coordinator)

    def _begin_put(
        self, txn_id: str, producer_group: str, count: int = 1, *, batch: bool = False, in_place: bool = False
    ) -> TxnRecord:
        check_transaction_id(txn_id)
        self._serving()
        now = self._now()
        with self._lock:
            txn = self._txns.get(txn_id)
            if self.check_group is not None:
                self.check_group(*(("open", producer_group) if txn is None else ("join", txn.producer_group)))
            if txn is not None and txn.status is not TxStatus.OPEN:
                raise TransactionError(
                    f"transaction {txn_id!r} is {txn.status.value}; no more half messages can join it "
                    "(start a new transaction id)"
                )
            if txn is not None and txn.in_place is not None and txn.in_place != in_place:
                raise TransactionError(
                    f"transaction {txn_id!r} holds messages written "
                    f"{'in place' if txn.in_place else 'as half messages'}; one transaction cannot mix the two "
                    "(send every batch of it the same way)"
                )
            if txn is not None and now - txn.first_ms >= self.max_open_ms:
                raise TransactionError(
                    f"transaction {txn_id!r} was opened {(now - txn.first_ms) / 60_000:.1f} min ago; a transaction "
                    f"takes messages for {self.max_open_ms:,} ms (transaction_max_open_ms), since readers of its "
                    "queues wait for it: commit or roll it back (a Spark query: a lower maxOffsetsPerTrigger makes "
                    "shorter micro-batches)"
                )
            held = 0 if txn is None else len(txn.halves) + txn.inflight_halves
            if held + count > self.max_halves:  # checked before a new id is recorded: a refusal leaves no trace
                raise TransactionError(
                    f"transaction {txn_id!r} would hold {held + count} half messages, over this broker's limit "
                    f"of {self.max_halves} (transaction_max_halves); commit in smaller transactions (a Spark "
                    "query: a lower maxOffsetsPerTrigger, or smaller batch writes)"
                )
            if txn is None:
                txn = self._txns[txn_id] = TxnRecord(txn_id, producer_group, now, now)
            txn.in_place = in_place
            txn.inflight_halves += count
            txn.batch = txn.batch or batch
            floor = self.store.max_offset(TRANS_HALF_TOPIC, 0)  # the put's halves get offsets at or above this
            txn.half_floor = min(txn.half_floor, floor) if txn.inflight else floor
            txn.inflight += 1
            txn.last_ms = now
            return txn

    def _end_put(self, txn: TxnRecord, res: PutResult | None, count: int = 1, *, halves: bool = True) -> None:
        """``halves``: the put stored half messages (False: in-place entries, which are no halves)."""
        with self._lock:
            txn.inflight_halves -= count
            if halves and res is not None and res.status in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
                txn.halves.update(zip(res.queue_offsets, res.commitlog_offsets, strict=True))
                if len(res.commitlog_offsets) == 1:
                    self._by_half_cl_offset[res.commitlog_offsets[0]] = txn.txn_id
                    txn.single_puts += 1
            txn.inflight -= 1
            txn.last_ms = self._now()
            empty = txn.status is TxStatus.OPEN and not txn.halves and not txn.inflight
            if empty and self._txns.get(txn.txn_id) is txn:
                del self._txns[txn.txn_id]  # its only puts were refused: nothing to check back or remember
            self._changed.notify_all()

    def prepare_half(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: Mapping[str, str] | None,
        producer_group: str,
        txn_id: str | None = None,
        **put_kwargs: Any,
    ) -> tuple[PutResult, str]:
        """Store one half message (RocketMQ's prepared send). The id defaults to the message's
        ``__transactionId__``, else its UNIQ_KEY, else a new one. Returns (store result, transaction id).
        MessageIllegalError (nothing stored) for a message a plain send refuses too (send_checks), one that claims
        what the broker writes into a half (half_property_conflict) or one with DELAY."""
        props = dict(properties or {})
        validate_producer_group(producer_group)
        check_message(int(put_kwargs.get("sys_flag", 0)), int(put_kwargs.get("reconsume_times", 0)), props)
        conflict = half_property_conflict(props, topic, queue_id, producer_group, txn_id)
        if conflict:
            raise MessageIllegalError(f"the half message {conflict}")
        refuse_delay(props.get(Prop.DELAY), "the half message")
        txn_id = txn_id or props.get(Prop.TRANSACTION_ID) or props.get(Prop.UNIQ_KEY) or uuid.uuid4().hex.upper()
        self._check_coordinator(txn_id, props.get(COORDINATOR, ""))
        props = half_properties(props, topic, queue_id, producer_group, txn_id)
        put_kwargs["sys_flag"] = half_sys_flag(int(put_kwargs.get("sys_flag", 0)))
        txn = self._begin_put(txn_id, producer_group)
        res: PutResult | None = None
        try:
            res = self.store.put_message(TRANS_HALF_TOPIC, 0, body, props, **put_kwargs)
        finally:
            self._end_put(txn, res)
        return res, txn_id

    def put_half_batch(
        self,
        buffer: bytes | memoryview,
        producer_group: str,
        txn_id: str,
        *,
        wait_store_ok: bool | None = None,
        admit: Callable[[dict[str, tuple[int, int]]], None] | None = None,
        declared: int = 0,
        validated: SmallBatch | ValidatedBatch | None = None,
    ) -> PutResult:
        """Store a client batch as half messages of ``txn_id``; all of the batch joins, or none. The entries may be
        encoded for their real topics (re-encoded here, ~10k msgs/s) or already in half form with
        ``transaction_codec.encode_half_entry`` (only checked: the fast path). ``admit(real topic -> (lowest,
        highest) queue id)`` may refuse the real queues of half-form entries (raise) before anything is stored;
        ``declared``, when not 0, is the entry count the sender says the buffer holds (checked likewise).
        ``validated``: the store's validate_batch of ``buffer`` when the caller has it (the server: it validates
        every batch as sent, send_checks included); otherwise it is validated here. The result's offsets are the
        halves'."""
        check_transaction_id(txn_id)
        validate_producer_group(producer_group)
        if validated is None:
            validated = self.store.validate_batch(buffer)  # framing, sizes, CRCs: on the entries as sent
            check_entries(validated)
        if is_half_batch(buffer):  # fast path: the client encoded half entries (encode_half_entry)
            half_buffer = bytes(buffer)
            self._check_half_size(len(half_buffer), -1)
            checked = check_halves(half_buffer, producer_group, txn_id,
                                   run=validated.run if isinstance(validated, ValidatedBatch) else None)
            if admit is not None:
                admit(checked.real_queues)
            count = checked.messages
        else:
            half_buffer, count = rewrite_batch_as_half(buffer, producer_group, txn_id)
            self._check_half_size(len(half_buffer), count)
            validated = None  # the halves are new bytes: put_batch validates them
        if declared and declared != count:
            raise MessageIllegalError(
                f"SendBatch declares {declared} messages but the buffer holds {count}; nothing stored"
            )
        first = bytes(buffer[: PREFIX.unpack_from(buffer, 0)[0]]) if count else b""
        self._check_coordinator(txn_id, (raw_property(first, COORDINATOR) or "") if first else "")
        txn = self._begin_put(txn_id, producer_group, count, batch=True)
        res: PutResult | None = None
        try:
            res = self.store.put_batch(half_buffer, wait_store_ok=wait_store_ok, validated=validated)
        finally:
            self._end_put(txn, res, count)
        return res

    def put_in_place(
        self,
        buffer: bytes | bytearray | memoryview,
        producer_group: str,
        txn_id: str,
        *,
        attempt: str = "",
        coordinator: str = "",
        wait_store_ok: bool | None = None,
        declared: int = 0,
        validated: SmallBatch | ValidatedBatch | None = None,
    ) -> PutResult:
        """Store a client batch encoded for its real topics in place, as entries of ``txn_id``'s slice for
        ``attempt`` (txn_in_place.py); all of it or nothing. ``coordinator``: the broker that decides the
        transaction (one over several brokers). The result's offsets are the entries' own."""
        check_transaction_id(txn_id)
        validate_producer_group(producer_group)
        check_attempt(attempt)
        if validated is None:
            validated = self.store.validate_batch(buffer)
            check_entries(validated)
        count = len(validated.positions) if isinstance(validated, SmallBatch) else len(validated.run)
        if declared and declared != count:
            raise MessageIllegalError(
                f"SendBatch declares {declared} messages but the buffer holds {count}; nothing stored"
            )
        if DELAY_NAME in batch_properties(validated.data, validated):  # a cheap search; hits checked one by one
            for m in iter_entries(bytes(validated.data)):
                refuse_delay(m.properties.get(Prop.DELAY), "a message of a transaction")
        self._check_coordinator(txn_id, coordinator)
        txn = self._begin_put(txn_id, producer_group, count, batch=True, in_place=True)
        res: PutResult | None = None
        try:
            handle = self._slice(txn, attempt, coordinator)
            mark_in_place(validated, handle)
            res = self.store.put_batch(validated.data, wait_store_ok=wait_store_ok, validated=validated)
        finally:
            self._end_put(txn, res, count, halves=False)
        return res

    def _slice(self, txn: TxnRecord, attempt: str, coordinator: str) -> int:
        """The handle of ``txn``'s slice for ``attempt``, storing its slice record the first time."""
        with self._slice_lock:  # one record per attempt, whatever the number of concurrent first batches
            with self._lock:
                for handle, known in txn.slices.items():
                    if known == attempt:
                        return handle
            props = slice_record_properties(txn.txn_id, txn.producer_group, attempt, coordinator)
            res = self.store.put_message(TRANS_HALF_TOPIC, 0, b"", props, wait_store_ok=False)
            if res.status not in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
                raise refused_record(
                    res, f"transaction {txn.txn_id!r}: the slice record of attempt {attempt!r} could not be stored "
                    f"({res.status.name}: {res.error}); nothing stored"
                )
            handle = res.commitlog_offsets[0] + res.wrote_bytes  # the record's end: > 0 even at offset 0
            with self._lock:
                txn.halves[res.queue_offsets[0]] = res.commitlog_offsets[0]
                txn.slices[handle] = attempt
            return handle

    def _check_half_size(self, size: int, count: int) -> None:
        limit = self.store.config.batch_limit_bytes
        if size > limit:
            what = f"this batch of {count} messages" if count >= 0 else "this batch"
            raise MessageIllegalError(
                f"MESSAGE_SIZE_EXCEEDED: {what} is {size} bytes as half messages (each gains REAL_TOPIC/REAL_QID/"
                f"TRAN_MSG/PGROUP/__transactionId__), over the {limit}-byte batch limit; send smaller transactional "
                "batches"
            )
