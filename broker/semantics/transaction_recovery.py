"""Start-up recovery: the op and half queues scanned from the state file's positions, interrupted commits finished
(or given up when their halves or decision expired), and the positions written back for the next start."""

from __future__ import annotations

import heapq
import logging

import numpy as np

from broker.errors import BrokerError
from broker.format.message import I64, POS_PREPARED_TX_OFFSET, POS_STORE_TIMESTAMP, Prop, StoredMessage, decode_entry
from broker.format.system_topics import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from broker.format.transaction_codec import (
    ATTEMPT,
    BATCH,
    COMMIT,
    COMMIT_START,
    COMMITTED_ATTEMPTS,
    DECISION,
    FINISHED_TAG,
    REMOVE_TAG,
    decode_commit_start,
    decode_offsets,
    raw_property,
)
from broker.ha.metadata_sync import LOG_END_KEY
from broker.json_file import load_json, write_json_atomic
from broker.semantics.half_run import commit_halves
from broker.semantics.transaction_decisions import Decisions
from broker.semantics.transaction_state_file import parse_checker_state
from broker.semantics.transaction_table import (
    DecisionGoneError,
    HalvesGoneError,
    TransactionError,
    TxnRecord,
    TxStatus,
    committed_by,
)
from broker.semantics.txn_in_place import IN_PLACE, MESSAGES, SLICE

log = logging.getLogger(__name__)


class Recovery(Decisions):
    """What a restart needs: rebuilding the table, finishing commits, persisting the scan positions."""

    def recover(self) -> None:
        """Rebuild the transaction table from the op and half queues; finish interrupted commits."""
        self._wait_for_dispatch()
        half_from, op_from, check_times = load_json(self.path, parse_checker_state) or (0, 0, {})
        decisions: dict[str, StoredMessage] = {}
        finished: set[str] = set()
        # Both scans read the whole log, past the read limit: a new master starts these services before its
        # replicas have confirmed its log's end, and the entries past the confirmed offset are its log all the same
        # (they will be confirmed, never cut back). A slice record or decision missed here would leave its
        # transaction unknown, and rows written in place would hold their queues for good.
        for op in self._scan(TRANS_OP_HALF_TOPIC, 0, op_from, confirmed_only=False):
            tid = op.properties.get(Prop.TRANSACTION_ID)
            if tid is None:
                continue  # a RocketMQ-written op message without an id: not ours to resolve
            if op.tags == REMOVE_TAG:
                decisions.setdefault(tid, op)  # the first decision is the outcome
            elif op.tags == FINISHED_TAG:
                finished.add(tid)
        txns: dict[str, TxnRecord] = {}
        for raw in self._scan_raw(TRANS_HALF_TOPIC, 0, half_from, confirmed_only=False):  # undecoded: may be millions
            tid = raw_property(raw.entry, Prop.TRANSACTION_ID) or raw_property(raw.entry, Prop.UNIQ_KEY)
            if tid is None:
                tid = decode_entry(raw.entry).msg_id
            stored_ms = I64.unpack_from(raw.entry, POS_STORE_TIMESTAMP)[0]
            t = txns.get(tid)
            if t is None:
                t = txns[tid] = TxnRecord(tid, raw_property(raw.entry, Prop.PGROUP) or "", stored_ms, stored_ms)
            t.halves[raw.queue_offset] = raw.commitlog_offset
            t.last_ms = max(t.last_ms, stored_ms)
            if raw_property(raw.entry, SLICE) == "1":
                t.slices[raw.commitlog_offset + len(raw.entry)] = raw_property(raw.entry, ATTEMPT) or ""
            t.in_place = bool(t.slices)
        for tid, times in check_times.items():
            if tid in txns:
                txns[tid].check_times = times
        for tid, op in decisions.items():
            group = op.properties.get(Prop.PGROUP, "")
            t = txns.get(tid) or TxnRecord(tid, group, op.store_timestamp, op.store_timestamp)
            txns[tid] = t
            commit = op.properties.get(DECISION) == COMMIT
            t.status = TxStatus.COMMITTED if commit else TxStatus.ROLLED_BACK
            t.ended_ms = op.store_timestamp
            t.decision_op_offset = op.queue_offset
            t.batch = op.properties.get(BATCH) == "true" or COMMITTED_ATTEMPTS in op.properties
            ranges = decode_offsets(op.body)
            in_place = op.properties.get(IN_PLACE) == "true"  # its rollback also owes a marker
            t.finished = tid in finished if in_place else not commit or tid in finished
            if t.finished:  # only its count and highest half are asked of it: no set of a million offsets
                t.decided_total = sum(b - a + 1 for a, b in ranges)
                if in_place:
                    t.decided_total = int(op.properties.get(MESSAGES, "0") or 0)
                t.top_half = max((b for _, b in ranges), default=-1)  # drop_tables adds its halves
            else:  # its re-store is to be finished: the halves it covers are needed one by one
                t.decided = frozenset(o for a, b in ranges for o in range(a, b + 1))
        with self._lock:
            self._txns = txns
            self._by_half_cl_offset = {cl: t.txn_id for t in txns.values() if len(t.halves) == 1
                                       for cl in t.halves.values()}
            for t in txns.values():
                t.single_puts = int(len(t.halves) == 1)
            for t in txns.values():
                if t.finished and t.status is not TxStatus.OPEN:
                    self._drop_tables(t)
        for t in list(txns.values()):
            if not t.finished:
                try:
                    self._finish_commit(t, decisions[t.txn_id])
                except (HalvesGoneError, DecisionGoneError) as e:
                    self._give_up_commit(t, e)  # do not block start-up over it
                except (BrokerError, OSError) as e:
                    log.error("transaction %s: finishing the commit failed (%s); the check thread retries", t.txn_id, e)
        self.persist()
        log.info("transactions recovered: %d known, %d open", len(txns),
                 sum(t.status is TxStatus.OPEN for t in txns.values()))

    def _give_up_commit(self, t: TxnRecord, why: TransactionError) -> None:
        """A commit whose halves or decision are gone: nothing can bring them back, so it is marked finished
        (never retried) and said so in the log."""
        with self._lock:
            t.finished = True
            self._drop_tables(t)
        log.error("transaction %s: committed, but its interrupted re-store cannot finish: %s", t.txn_id, why)

    def _decision_op(self, t: TxnRecord) -> StoredMessage:
        for op in self._scan(TRANS_OP_HALF_TOPIC, 0, t.decision_op_offset, t.decision_op_offset + 1,
                             confirmed_only=False):
            return op
        raise DecisionGoneError(
            f"decision of transaction {t.txn_id!r} (op offset {t.decision_op_offset}) is gone (expired?); the "
            "commit cannot be completed"
        )

    def _finish_commit(self, t: TxnRecord, op: StoredMessage | None = None) -> None:
        """Re-store the committed halves not yet in their real topics (idempotent), then mark finished."""
        self._wait_for_dispatch()  # re-stores of an earlier attempt must be in the consume queues we scan
        op = op or self._decision_op(t)
        if op.properties.get(IN_PLACE) == "true":
            self._finish_in_place(t, op)
            return
        attempts = op.properties.get(COMMITTED_ATTEMPTS)
        allowed = None if attempts is None else (attempts.split(",") if attempts else [])
        done: set[int] = set()
        queues = decode_commit_start(op.properties.get(COMMIT_START, ""))  # every queue the commit writes to
        for (topic, qid), start in queues.items():
            # every copy this log holds, confirmed or not: a new master's read limit may lag the copies its old
            # master stored before it died, and a copy not seen here would be stored a second time
            for e in self._scan_raw(topic, qid, start, confirmed_only=False):
                if committed_by(e.entry, t.txn_id):
                    done.add(I64.unpack_from(e.entry, POS_PREPARED_TX_OFFSET)[0])
        skip = np.array(sorted(done), np.int64)
        todo = (commit_halves(r, attempts=allowed, skip=skip) for r in self._iter_half_runs(sorted(t.decided)))
        restored = self._restore(t, todo, queues)
        log.warning("transaction %s: finished an interrupted commit of %d halves: stored the %d not yet visible",
                    t.txn_id, len(t.decided), restored)

    def _forget_ended(self, now: int, half_from: int) -> None:
        """Under _lock: forget ended transactions past outcome_retention_ms, and the earliest ended single-message
        ones beyond max_outcomes (RocketMQ-style producers end one transaction per message: a day of them could
        take gigabytes). Batch transactions are few (one per Spark micro-batch) and keep their outcome for the
        whole retention time: the exactly-once sink asks for it when it re-runs a batch after a crash.
        Only transactions whose halves the next start-up scan no longer reaches (below half_from) are forgotten;
        it would find the others again, undecided."""
        done = [t for t in self._txns.values() if t.finished and t.status in (TxStatus.COMMITTED, TxStatus.ROLLED_BACK)
                and t.highest_half() < half_from]
        old = [t for t in done if now - t.ended_ms >= self.outcome_retention_ms]
        singles = [t for t in done if now - t.ended_ms < self.outcome_retention_ms and not t.batch
                   and t.decided_count() <= 1]
        if len(singles) > self.max_outcomes:
            excess = len(singles) - self.max_outcomes
            old += heapq.nsmallest(excess, singles, key=lambda t: t.ended_ms)
            log.warning("transactions: %d single-message outcomes kept, over max_outcomes=%d; forgetting the %d "
                        "earliest", len(singles), self.max_outcomes, excess)
        for t in old:  # finished and ended: _drop_tables already took its end-by-offset entry
            del self._txns[t.txn_id]

    def persist(self) -> None:
        """Write where the next start-up scans from: the oldest half still needed, and the oldest op message that
        still matters (a decision about such halves, an unfinished commit, or one within the retention time)."""
        now = self._now()
        with self._lock:
            half_max = self.store.max_offset(TRANS_HALF_TOPIC, 0)
            op_max = self.store.max_offset(TRANS_OP_HALF_TOPIC, 0)
            live = [t for t in self._txns.values() if t.status in (TxStatus.OPEN, TxStatus.ENDING) or not t.finished]
            half_from = min(
                [min(t.halves) for t in live if t.halves] + [t.half_floor for t in live if t.inflight],
                default=half_max,
            )
            self._forget_ended(now, half_from)  # first: a forgotten decision need not be re-read at start-up
            op_from = min(
                (
                    t.decision_op_offset
                    for t in self._txns.values()
                    if t.decision_op_offset >= 0
                    and (not t.finished or now - t.ended_ms < self.outcome_retention_ms
                         or t.highest_half() >= half_from)
                ),
                default=op_max,
            )
            op_from = min([op_from] + [t.op_floor for t in self._txns.values() if t.status is TxStatus.ENDING])
            checks = {tid: t.check_times for tid, t in sorted(self._txns.items())
                      if t.status is TxStatus.OPEN and t.check_times}
            # with the log's end, which every decision and re-store the positions pass over lies below (metadata_sync)
            write_json_atomic(self.path, {"halfScanFrom": half_from, "opScanFrom": op_from, "checkTimes": checks,
                                          LOG_END_KEY: self.store.max_phys_offset()})
