"""Transactions over several brokers: the coordinator's durable decisions, the first decision of each standing.

Why. A batch transaction (transaction.py) is atomic on one broker. A writer whose batch spans brokers (the Spark
sink in a cluster) holds one transaction per broker under one id, and ending those one after another leaves the
batch half visible when the writer dies in between. As Kafka's transaction coordinator does (a log partition
chosen by hashing the transactional id keeps each transaction's state), one broker, the coordinator, keeps the
decision, and the brokers holding the halves, the participants, end their parts by it:

1. Writers send their rows as halves of the transaction to each participant. Every half carries the coordinator's
   broker name in ``TRAN_COORDINATOR`` (participant_resolver.py).
2. The committer records the decision on the coordinator (``RecordDecision``): COMMIT, with each participant's
   share (the writer attempts whose halves it keeps, and their message count). The first decision recorded for a
   transaction stands; recording another returns the first. It is on disk (the store flushed, whatever the flush
   mode) before the answer: this is the commit point.
3. The committer ends the transaction on each participant with its share (``EndTransaction`` with
   committed_attempts and expected_messages). A participant a COMMIT does not name rolls its halves back.
4. When the committer dies before or during 3, participants' halves stay open. A participant's check pass does not
   check such a transaction back with a producer (who may be gone): it asks the coordinator, found through the
   name servers, and ends its part by the decision (participant_resolver.py). Without a decision it waits; once
   the transaction had ``transaction_check_max`` checks (where a producer's transaction is rolled back), it asks
   the coordinator to decide ABORT unless a decision exists (``QueryDecisions`` with abort_undecided), and the
   first-decision rule makes a committer's later COMMIT come back as that ABORT. So a committer that never returns
   leaves every participant with one outcome, and no participant ever rolls back alone a transaction that another
   may have committed (presumed abort, with the coordinator the one place that decides).

What the coordinator keeps: each decision as one message of ``SLUICE_SYS_TRANS_DECISION_TOPIC`` (queue 0; the body
is the ``TransactionDecision`` protobuf, declared once in coordinator.proto), and a table in memory rebuilt at start
by scanning that queue from the position saved in ``config/transactionDecisions.json``. A decision needs no halves
on the coordinator: it may hold no part of the transaction. When it does, that part is an ordinary transaction of
its TransactionService, ended like any participant's.

Limits. Decisions are kept ``retention_ms`` (24 h by default, as transaction outcomes) and at most
``max_decisions`` (500,000, a few hundred bytes each), the earliest forgotten first, with a warning. A participant
away longer than that with open halves of a transaction whose committer died finds no decision and aborts, so the
retention bounds how long a broker may be away then. A query names at most ``MAX_QUERY_IDS`` transactions and
returns at most ``MAX_QUERY_RESULTS`` decisions.

Not covered. A participant that lost halves it had acknowledged (an OS crash under ASYNC_FLUSH) refuses its share
(expected_messages), logs it at every pass and keeps the rest open for an operator, while the other participants'
parts are visible; a SYNC_FLUSH broker loses no acknowledged half. The decision lives on one broker: until brokers
are replicated, participants of a coordinator that is gone for good keep their open halves (never rolling back
alone) until an operator ends them (``sluice tx commit|rollback``).
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from broker.errors import InvalidArgumentError
from broker.format.message import Prop
from broker.format.system_topics import TRANS_DECISION_TOPIC, TRANS_READER_GROUP
from broker.format.transaction_codec import check_transaction_id
from broker.format.txn_decision import TxnDecision, make_decision
from broker.json_file import load_json, write_json_atomic
from broker.proto import coordinator_pb2 as cpb
from broker.proto.decision import from_pb, to_pb
from broker.semantics.transaction import DEFAULT_OUTCOME_RETENTION_MS, TransactionError
from broker.semantics.transaction_table import refused_record
from broker.store import GetStatus, MessageStore, PutStatus

log = logging.getLogger(__name__)

STATE_FILE = "transactionDecisions.json"
DEFAULT_RETENTION_MS = DEFAULT_OUTCOME_RETENTION_MS
DEFAULT_MAX_DECISIONS = 500_000
MAX_QUERY_IDS = 10_000  # transactions one query names: a participant asks about its open ones in one call
MAX_QUERY_RESULTS = 10_000  # decisions one prefix query returns; a longer prefix narrows it
PERSIST_INTERVAL_S = 5.0  # the scan position is saved at most this often (and at shutdown)
SCAN_BATCH = 1024
DISPATCH_WAIT_S = 30.0


@dataclass(slots=True)
class _LoggedDecision:
    decision: TxnDecision
    queue_offset: int  # where the decision lies in the decision queue


class DecisionLog:
    def __init__(
        self, store: MessageStore, config_dir: str, *, retention_ms: int = DEFAULT_RETENTION_MS,
        max_decisions: int = DEFAULT_MAX_DECISIONS,
    ) -> None:
        if retention_ms <= 0 or max_decisions < 1:
            raise InvalidArgumentError("decision retention must be positive and at least one decision kept")
        self.store = store
        self.path = os.path.join(config_dir, STATE_FILE)
        self.retention_ms = retention_ms
        self.max_decisions = max_decisions
        self._lock = threading.Lock()  # also serialises records: the check for an earlier decision and the put
        self._table: dict[str, _LoggedDecision] = {}  # in the order recorded, so the earliest are first
        self._ids: list[str] = []  # the table's ids, sorted: prefix queries
        self._next_persist = 0.0
        self.forgotten_early = 0  # decisions forgotten within the retention time (past max_decisions)

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Rebuild the table from the decision queue; call before serving."""
        if not self.store.wait_dispatched(DISPATCH_WAIT_S):
            raise TransactionError(f"the store's dispatcher did not reach the commit-log end in {DISPATCH_WAIT_S} s")
        scan_from = load_json(self.path, lambda raw: int(raw["scanFrom"])) or 0
        table: dict[str, _LoggedDecision] = {}
        for offset, body in self._scan(scan_from):
            try:
                d = from_pb(cpb.TransactionDecision.FromString(body))
            except (DecodeError, InvalidArgumentError) as e:  # written by this module: a bug, not a reason to stop
                log.error("decision at offset %d of %s cannot be read (%s); skipped", offset, TRANS_DECISION_TOPIC, e)
                continue
            table.setdefault(d.txn_id, _LoggedDecision(d, offset))  # the first decision stands
        with self._lock:
            self._table = table
            self._forget(_now_ms())
            self._ids = sorted(self._table)
        self._save_position()
        log.info("transaction decisions recovered: %d", len(table))

    def shutdown(self) -> None:
        self._save_position()

    # ------------------------------------------------------------------------------------------ decisions

    def get(self, txn_id: str) -> TxnDecision | None:
        with self._lock:
            e = self._table.get(txn_id)
        return None if e is None else e.decision

    def record(self, decision: TxnDecision) -> TxnDecision:
        """Record ``decision`` unless one stands; returns the decision that stands, on disk."""
        with self._lock:
            e = self._table.get(decision.txn_id)
            if e is not None:
                return e.decision
            stamped = decision.stamped()
            res = self.store.put_message(
                TRANS_DECISION_TOPIC, 0, to_pb(stamped).SerializeToString(),
                {Prop.TRANSACTION_ID: stamped.txn_id, Prop.TAGS: stamped.outcome}, wait_store_ok=True,
            )
            if res.status not in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
                raise refused_record(
                    res, f"the decision of {stamped.txn_id!r} could not be stored ({res.status.name}: {res.error}); "
                    "nothing is decided, record it again later"
                )
            # In the table before the flush: the put is in the log, so a later question must get this decision
            # even when the flush below fails (the failure reaches the caller, who cannot know the outcome).
            self._add(stamped, res.queue_offsets[0])
            self.store.flush()
        log.info("transaction %s decided %s (%d participants)", stamped.txn_id, stamped.outcome,
                 len(stamped.participants))
        self._maybe_persist()
        return stamped

    def query(
        self, txn_ids: Sequence[str] = (), prefix: str = "", *, abort_undecided: bool = False
    ) -> list[TxnDecision]:
        """Decisions of ``txn_ids`` (with abort_undecided: each undecided one decided ABORT first) and of every
        transaction whose id starts with ``prefix`` (empty: none), sorted by id."""
        if len(txn_ids) > MAX_QUERY_IDS:
            raise InvalidArgumentError(f"{len(txn_ids)} transactions named in one query; at most {MAX_QUERY_IDS}")
        for txn_id in txn_ids:
            check_transaction_id(txn_id)
        found: dict[str, TxnDecision] = {}
        for txn_id in txn_ids:
            d = self.get(txn_id)
            if d is None and abort_undecided:
                d = self.record(make_decision(txn_id, False))
            if d is not None:
                found[txn_id] = d
        if prefix:
            for d in self._with_prefix(prefix):
                found[d.txn_id] = d
        return [found[k] for k in sorted(found)]

    def _with_prefix(self, prefix: str) -> list[TxnDecision]:
        with self._lock:
            lo = bisect.bisect_left(self._ids, prefix)
            hi = lo
            while hi < len(self._ids) and self._ids[hi].startswith(prefix):
                hi += 1
                if hi - lo > MAX_QUERY_RESULTS:
                    raise InvalidArgumentError(
                        f"more than {MAX_QUERY_RESULTS} decisions start with {prefix[:60]!r}; give a longer prefix"
                    )
            return [self._table[i].decision for i in self._ids[lo:hi]]

    def __len__(self) -> int:
        with self._lock:
            return len(self._table)

    # ------------------------------------------------------------------------------------------ table

    def _add(self, d: TxnDecision, queue_offset: int) -> None:
        """Under _lock."""
        if len(self._table) >= self.max_decisions:
            self._drop_earliest()
            self.forgotten_early += 1
            if self.forgotten_early in (1, 10) or self.forgotten_early % 1000 == 0:
                log.warning("%d transaction decisions kept, this broker's limit; forgot the earliest (%d so far "
                            "within the retention time)", self.max_decisions, self.forgotten_early)
        self._table[d.txn_id] = _LoggedDecision(d, queue_offset)
        bisect.insort(self._ids, d.txn_id)

    def _drop_earliest(self) -> None:
        txn_id = next(iter(self._table))
        del self._table[txn_id]
        i = bisect.bisect_left(self._ids, txn_id)
        if i < len(self._ids) and self._ids[i] == txn_id:
            del self._ids[i]

    def _forget(self, now_ms: int) -> int:
        """Under _lock: drop decisions past the retention time (the earliest are first). Returns how many."""
        dropped = 0
        while self._table:
            first = next(iter(self._table.values()))
            if now_ms - first.decision.decided_ms < self.retention_ms and len(self._table) <= self.max_decisions:
                break
            self._drop_earliest()
            dropped += 1
        return dropped

    # ------------------------------------------------------------------------------------------ state file

    def _maybe_persist(self) -> None:
        if time.monotonic() >= self._next_persist:
            self._save_position()

    def _save_position(self) -> None:
        """``persist``, or later when the disk cannot take the file now (full): a decision is recorded once its put
        is stored, so a position not saved fails no decision, start or stop; the next start scans from the last one
        saved, a little more."""
        try:
            self.persist()
        except OSError as e:
            self._next_persist = time.monotonic() + PERSIST_INTERVAL_S
            log.warning("the decision log's scan position could not be saved (%s); it is tried again in %.0f s",
                        e, PERSIST_INTERVAL_S)

    def persist(self) -> None:
        """Forget expired decisions and save where the next start scans from: the earliest decision kept."""
        with self._lock:
            self._forget(_now_ms())
            first = next(iter(self._table.values()), None)
            scan_from = first.queue_offset if first is not None else self.store.max_offset(TRANS_DECISION_TOPIC, 0)
            write_json_atomic(self.path, {"scanFrom": scan_from})
            self._next_persist = time.monotonic() + PERSIST_INTERVAL_S

    def _scan(self, start: int) -> Iterator[tuple[int, bytes]]:
        """(queue offset, body) of every decision message from ``start`` (corrected up to the queue's minimum), past
        the read limit too: a new master starts before its replicas confirm its log's end, and a decision it missed
        could be taken a second time, the other way."""
        offset = max(start, self.store.min_offset(TRANS_DECISION_TOPIC, 0))
        stop = self.store.queue_end(TRANS_DECISION_TOPIC, 0)
        while offset < stop:
            res = self.store.get_message(TRANS_READER_GROUP, TRANS_DECISION_TOPIC, 0, offset,
                                         min(SCAN_BATCH, stop - offset), confirmed_only=False)
            if res.status is GetStatus.FOUND:
                for qoff, msg in zip(res.queue_offsets, res.messages(), strict=True):
                    yield qoff, msg.body
                offset = res.next_begin_offset
            elif res.next_begin_offset > offset:
                offset = res.next_begin_offset  # an expired range: its decisions are past any retention
            else:
                return


def _now_ms() -> int:
    return int(time.time() * 1000)


__all__ = ["DecisionLog"]
