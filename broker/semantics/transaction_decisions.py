"""Ending transactions: the decision stored as an op message, then the commit's re-store or the in-place marks,
and the finished marker. Ending an ended transaction returns its first outcome."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Collection
from typing import Any

from broker.errors import BrokerError, InvalidArgumentError, QueryNotFoundError
from broker.format.message import I64, POS_PHYSICAL_OFFSET, Prop, StoredMessage
from broker.format.system_topics import TRANS_HALF_TOPIC, TRANS_MARKER_TOPIC, TRANS_OP_HALF_TOPIC
from broker.format.transaction_codec import (
    ATTEMPT,
    BATCH,
    COMMIT,
    COMMIT_START,
    COMMITTED_ATTEMPTS,
    DECISION,
    MAX_ATTEMPTS_PROPERTY_CHARS,
    REMOVE_TAG,
    ROLLBACK,
    check_transaction_id,
    encode_commit_start,
    encode_offsets,
    raw_property,
)
from broker.semantics.half_run import commit_halves
from broker.semantics.transaction_puts import HalfPuts
from broker.semantics.transaction_table import (
    DISPATCH_WAIT_S,
    EndResult,
    TransactionError,
    TxnRecord,
    TxStatus,
    refused_record,
)
from broker.semantics.txn_in_place import IN_PLACE, MESSAGES, split_slices
from broker.store import PutResult, PutStatus
from broker.store.txn_visibility import MARKER_QUEUE_ID, encode_marker

log = logging.getLogger(__name__)


class Decisions(HalfPuts):
    """Commit and rollback decisions, by id, by half offset and for several at once."""

    def end_transaction(
        self,
        txn_id: str,
        commit: bool,
        *,
        from_check: bool = False,
        committed_attempts: Collection[str] | None = None,
        producer_group: str = "",
        expected_messages: int | None = None,
        record_unknown: bool = False,
    ) -> EndResult:
        """Commit or roll back every half of the transaction, atomically; a no-op reporting the first outcome if it
        has ended already. ``committed_attempts``: commit only halves whose ``TRAN_ATTEMPT`` property is listed (the
        others are dropped), so a writer's failed attempts never become visible. ``expected_messages``: a commit
        is refused (TransactionError, nothing decided, still open) unless it would commit exactly this many
        messages: the writers' count, so that halves lost in a crash fail the batch instead of committing part of
        it. An id this broker has no record of is refused (QueryNotFoundError, nothing recorded: an outcome for a
        transaction that never existed is an invented one, RocketMQ refuses it too) unless ``record_unknown``: then
        the outcome is recorded for an empty transaction, asking again reports it, and halves sent under the id
        later are refused (a writer that finished with nothing to send, or one fenced out before it sent).
        ``producer_group``: the group an id recorded now is recorded under; with ``record_unknown``, an id already
        recorded under another group is refused (TransactionError, nothing changed)."""
        check_transaction_id(txn_id)
        self._serving()
        attempts = None if committed_attempts is None else sorted(set(committed_attempts))
        if attempts is not None:
            if len(",".join(attempts)) > MAX_ATTEMPTS_PROPERTY_CHARS:
                raise InvalidArgumentError(f"committed_attempts: over {MAX_ATTEMPTS_PROPERTY_CHARS} characters in all")
            if any(not a or "," in a or "\x01" in a or "\x02" in a for a in attempts):
                raise InvalidArgumentError("committed_attempts: each attempt id must be non-empty, without ','")
        with self._lock:
            txn = self._txns.get(txn_id)
            if self.check_group is not None:  # an unknown id: decided on the group it would be recorded under
                self.check_group("end", producer_group if txn is None else txn.producer_group)
            if record_unknown and producer_group and txn is not None and txn.producer_group != producer_group:
                # The caller claims the id for its group: an outcome recorded under another group is not its own
                # to report (another user's record of a predictable id must not pass for this writer's commit).
                raise TransactionError(
                    f"transaction {txn_id!r} is recorded under another producer group than {producer_group!r}; "
                    "nothing changed (a transaction id belongs to the group that opened or recorded it)"
                )
            if txn is None and not record_unknown:
                raise QueryNotFoundError(
                    f"no transaction {txn_id!r} on this broker (no half message was sent under that id, or it ended "
                    "so long ago that its outcome is forgotten); nothing was recorded"
                )
            if txn is None:
                now = self._now()
                txn = self._txns[txn_id] = TxnRecord(txn_id, producer_group, now, now)
            while txn.status is TxStatus.ENDING:  # another call is deciding: report its outcome
                self._changed.wait()
            if txn.status is not TxStatus.OPEN:
                return EndResult(txn_id, txn.status, True, txn.decided_count(), 0, txn.finished)
            txn.status = TxStatus.ENDING  # from here new halves are refused ...
            txn.op_floor = self.store.max_offset(TRANS_OP_HALF_TOPIC, 0)
            while txn.inflight:  # ... and the ones already sent land before the decision lists them
                self._changed.wait()
            halves = dict(txn.halves)
        if from_check:
            log.info("transaction %s: check-back answered %s", txn_id, COMMIT if commit else ROLLBACK)
        try:
            return self._decide(txn, halves, commit, attempts, expected_messages)
        except BaseException:
            with self._lock:
                if txn.status is TxStatus.ENDING:  # the decision was not stored: still open
                    txn.status = TxStatus.OPEN
                self._changed.notify_all()
            raise

    def producer_group_of(self, txn_id: str, half_commitlog_offset: int | None = None) -> str | None:
        """The producer group of a transaction this broker holds (by id, or by a half's commit-log offset); None
        when it holds none (what a transaction's rights are decided on: broker/auth/operations.py)."""
        with self._lock:
            if half_commitlog_offset is not None:
                txn_id = self._by_half_cl_offset.get(half_commitlog_offset, "")
            txn = self._txns.get(txn_id) if txn_id else None
            return txn.producer_group if txn is not None else None

    def end_transaction_by_offset(self, half_commitlog_offset: int, commit: bool, **kwargs: Any) -> EndResult:
        """RocketMQ's END_TRANSACTION, which names the half message by its commit-log offset."""
        self._serving()  # before the lookup: the offsets table is rebuilt by the recovery too
        with self._lock:
            txn_id = self._by_half_cl_offset.get(half_commitlog_offset)
        if txn_id is None:
            half = self.store.lookup_message(half_commitlog_offset)
            if half is None or half.topic != TRANS_HALF_TOPIC:
                if self.check_group is not None:  # the same answer to those who may not learn what lies there
                    self.check_group("end", kwargs.get("producer_group", ""))
                raise QueryNotFoundError(f"no half message at commit-log offset {half_commitlog_offset}")
            txn_id = half.properties.get(Prop.TRANSACTION_ID) or half.properties.get(Prop.UNIQ_KEY) or half.msg_id
            if half.properties.get(Prop.PGROUP):  # an id recorded now takes the half's own group
                kwargs["producer_group"] = half.properties[Prop.PGROUP]
        return self.end_transaction(txn_id, commit, **kwargs)

    def end_transactions(
        self, commit: bool, *, prefix: str | None = None, txn_ids: Collection[str] = (), open_only: bool = True
    ) -> list[EndResult]:
        """End many transactions: every listed id and every (open) one whose id starts with ``prefix``. A listed id
        this broker has no record of is refused before any is ended (QueryNotFoundError, nothing recorded)."""
        self._serving()
        with self._lock:
            unknown = [i for i in txn_ids if i not in self._txns]
        if unknown:
            raise QueryNotFoundError(
                f"no transaction {unknown[0]!r} on this broker ({len(unknown)} of the listed ids are unknown); "
                "nothing was ended"
            )
        ids = list(txn_ids)
        if prefix is not None:
            ids += [t.txn_id for t in self.list_transactions(prefix) if not open_only or t.status is TxStatus.OPEN]
        ids = list(dict.fromkeys(ids))
        if self.check_group is not None:  # every one is allowed before any is ended
            with self._lock:
                groups = {t.producer_group for i in ids if (t := self._txns.get(i)) is not None}
            for g in sorted(groups):
                self.check_group("end", g)
        return [self.end_transaction(i, commit) for i in ids]

    def _decide(
        self,
        txn: TxnRecord,
        halves: dict[int, int],
        commit: bool,
        attempts: list[str] | None,
        expected: int | None = None,
    ) -> EndResult:
        if txn.slices:
            return self._decide_in_place(txn, halves, commit, attempts, expected)
        kept, later, queues, total = self._commit_runs(sorted(halves), attempts) if commit else ([], [], set(), 0)
        if commit and expected is not None and total != expected:
            raise TransactionError(
                f"transaction {txn.txn_id!r}: the commit would make {total} messages visible but its writers sent "
                f"{expected}; nothing decided, the transaction is still open (roll it back and write the batch again: "
                "halves were lost, e.g. by a crash of the machine under ASYNC_FLUSH)"
            )
        props: dict[str, str] = {}
        if txn.batch or attempts is not None:
            txn.batch = True
            props[BATCH] = "true"
        if commit:
            start = {q: self.store.max_offset(*q) for q in sorted(queues)}
            props[COMMIT_START] = encode_commit_start(start)
        res = self._store_decision(txn, halves, commit, attempts, props)
        with self._lock:
            txn.status = TxStatus.COMMITTED if commit else TxStatus.ROLLED_BACK
            txn.ended_ms = self._now()
            txn.decision_op_offset = res.queue_offsets[0]
            txn.decided = frozenset(halves)
            txn.finished = not commit
            txn.restoring = commit
            if not commit:
                self._drop_tables(txn)
            self._changed.notify_all()
        restored, complete = 0, True
        try:
            if commit and len(halves) > 1:
                # A batch decision is acknowledged to a writer that will never send its rows again: force it to disk
                # (under ASYNC_FLUSH too). Atomicity needs no flush: the re-stored entries follow the decision in
                # the commit log, and recovery truncates at the first bad entry, so they cannot outlive it.
                self.store.flush()
            if commit:
                remade = (commit_halves(r, attempts=attempts) for r in self._iter_half_runs(later))
                restored = self._restore(txn, itertools.chain(kept, remade), queues)
        except (BrokerError, OSError) as e:
            complete = False
            log.error("transaction %s decided but not completed (%s); the check thread retries", txn.txn_id, e)
        finally:
            with self._lock:
                txn.restoring = False
        return EndResult(txn.txn_id, txn.status, False, len(halves), restored, complete)

    def _store_decision(
        self, txn: TxnRecord, halves: dict[int, int], commit: bool, attempts: list[str] | None, props: dict[str, str]
    ) -> PutResult:
        """Store and flush the decision op message (the commit point): the halves it covers and ``props`` beside
        the properties every decision carries. TransactionError, nothing decided, if the store refuses it."""
        props = {Prop.TAGS: REMOVE_TAG, Prop.TRANSACTION_ID: txn.txn_id, DECISION: COMMIT if commit else ROLLBACK,
                 **props}
        if txn.producer_group:
            props[Prop.PGROUP] = txn.producer_group
        if attempts is not None:
            props[COMMITTED_ATTEMPTS] = ",".join(attempts)
        res = self.store.put_message(TRANS_OP_HALF_TOPIC, 0, encode_offsets(halves), props, wait_store_ok=True)
        if res.status not in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
            raise refused_record(
                res, f"transaction {txn.txn_id!r}: the decision could not be stored ({res.status.name}: {res.error}); "
                "nothing changed, end it again later"
            )
        return res

    def _decide_in_place(
        self, txn: TxnRecord, halves: dict[int, int], commit: bool, attempts: list[str] | None, expected: int | None
    ) -> EndResult:
        """_decide for a transaction that wrote in place (txn_in_place.py): the decision, the marker, the finish."""
        self._wait_for_dispatch()  # every entry of its slices registered: the count below is what readers get
        with self._lock:
            slices = dict(txn.slices)
        keep, drop = split_slices(slices, commit, attempts)
        entries = {s.handle: s.entries for s in self.store.txn_visibility.open_slices()}
        total = sum(entries.get(h, 0) for h in keep)
        if commit and expected is not None and total != expected:
            raise TransactionError(
                f"transaction {txn.txn_id!r}: the commit would make {total} messages visible but its writers sent "
                f"{expected}; nothing decided, the transaction is still open (roll it back and write the batch again: "
                "messages were lost, e.g. by a crash of the machine under ASYNC_FLUSH)"
            )
        res = self._store_decision(txn, halves, commit, attempts,
                                   {BATCH: "true", IN_PLACE: "true", MESSAGES: str(total)})
        with self._lock:
            txn.status = TxStatus.COMMITTED if commit else TxStatus.ROLLED_BACK
            txn.ended_ms = self._now()
            txn.decision_op_offset = res.queue_offsets[0]
            txn.decided = frozenset(halves)
            txn.batch = True
            txn.finished = False
            txn.restoring = True
            self._changed.notify_all()
        complete = True
        try:
            if commit:
                self.store.flush()  # acknowledged to writers that never send again: on disk under ASYNC_FLUSH too
            self._mark(txn, keep, drop, total)
        except (BrokerError, OSError) as e:
            complete = False
            log.error("transaction %s decided but its marker is not written (%s); the check thread retries",
                      txn.txn_id, e)
        finally:
            with self._lock:
                txn.restoring = False
        return EndResult(txn.txn_id, txn.status, False, total, total, complete)

    def _mark(self, txn: TxnRecord, keep: list[int], drop: list[int], total: int) -> None:
        """Write the marker deciding the slices (unless the store has applied one), wait until readers see it, then
        the finished op message."""
        if keep + drop and any(self.store.txn_visibility.decision(h) is None for h in keep + drop):
            res = self.store.put_message(TRANS_MARKER_TOPIC, MARKER_QUEUE_ID, encode_marker(keep, drop),
                                         {Prop.TRANSACTION_ID: txn.txn_id}, wait_store_ok=True)
            if res.status not in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
                raise TransactionError(f"marker of {txn.txn_id!r} not stored: {res.status.name} {res.error}")
            if not self.store.wait_dispatched(DISPATCH_WAIT_S, up_to=res.commitlog_offsets[0] + res.wrote_bytes):
                raise TransactionError(f"marker of {txn.txn_id!r} stored but not dispatched in {DISPATCH_WAIT_S} s")
        self._store_finished(txn)
        with self._lock:
            txn.decided_total = total

    def _finish_in_place(self, t: TxnRecord, op: StoredMessage) -> None:
        """_finish_commit for a transaction that wrote in place: its slices from its slice records, then _mark."""
        commit = op.properties.get(DECISION) == COMMIT
        listed = op.properties.get(COMMITTED_ATTEMPTS)
        attempts = None if listed is None else (listed.split(",") if listed else [])
        slices: dict[int, str] = {}
        for run in self._iter_half_runs(sorted(t.decided)):
            assert run.positions is not None  # runs read from the store know where each entry starts
            ends = [*run.positions[1:], len(run.buffer)]
            for a, b in zip(run.positions, ends, strict=True):
                entry = run.buffer[a:b]
                slices[I64.unpack_from(entry, POS_PHYSICAL_OFFSET)[0] + len(entry)] = raw_property(entry, ATTEMPT) or ""
        keep, drop = split_slices(slices, commit, attempts)
        self._mark(t, keep, drop, int(op.properties.get(MESSAGES, "0") or 0))
        log.warning("transaction %s: finished an interrupted %s of %d slices written in place", t.txn_id,
                    "commit" if commit else "rollback", len(slices))
