"""Transactional messages, single (RocketMQ) and batch (Sluice), crash-safe.

A transaction is named by an id (``__transactionId__``; RocketMQ's producer uses the message's UNIQ_KEY). Its
half messages wait, invisible, in ``RMQ_SYS_TRANS_HALF_TOPIC``; they may come one by one (``prepare_half``) or in
batches (``put_half_batch``) from any number of processes. ``end_transaction(id, commit)`` decides for all of them:

1. new halves for the id are refused from now on, and in-flight half puts are waited for;
2. one op message (tag ``d``) is stored with the decision and the half offsets it covers, waiting for the store
   (SYNC_FLUSH: on disk) -- this is the commit point: before it nothing is visible, after it everything will be;
3. on commit, the halves are re-stored in their real topics (``put_batch``, in chunks), each recording its half's
   commit-log offset in PREPARED TRANSACTION OFFSET; the committed entries are built in bulk (``half_run``) and
   checked before step 2 (kept for the re-store up to ``commit_memory_bytes``, built again past that), and a
   visibility hold on every real queue keeps readers from seeing any of them until all are dispatched, then shows
   them at one instant;
4. an op message with tag ``f`` marks the re-store finished.

A transaction holds at most ``max_halves`` messages (its table is kept in memory); its commit holds at most
``commit_memory_bytes`` of committed entries and one store read of halves. Check-back counts are persisted with
the scan positions, before each pass asks.

After a crash anywhere, ``start()`` scans the op and half queues, and for every commit decision without its ``f``
marker it scans the real queues from the offsets recorded in the decision, skips halves already re-stored (their
commit-log offsets appear as PREPARED TRANSACTION OFFSET in entries of COMMIT type carrying this transaction's id;
other messages there carry 0 or another transaction's halves) and re-stores the rest: each message once, all or
nothing. A commit whose halves or decision expired before that is given up (logged), never retried. Ending an
ended transaction returns the first outcome. Open transactions idle for ``transaction_timeout_ms`` are checked
back with the producer group through ``checker`` every ``check_interval_ms``; after ``check_max`` unanswered checks
they are rolled back (RocketMQ: transactionTimeOut 6 s, transactionCheckMax 15). A failure with one transaction in
a pass (its commit, its check) is logged and leaves the others to be checked. A transaction whose halves name a
coordinator broker (one over several brokers) goes to ``resolver`` instead, at each check and at check_max: its
coordinator decides it (decision_log.py).

Halves may not carry DELAY > 0 (``refuse_delay``): a commit stores them in their real topics at once, and RocketMQ's
producer drops DELAY from transactional sends.

Server wiring::

    tx = TransactionService(store, store_config.config_dir, checker=fn)  # fn(group, txn_id, half) -> TxState|None
    tx.start()                                            # recovery; before serving any request
    res, txn_id = tx.prepare_half(topic, qid, body, props, producer_group)            # SEND with TRAN_MSG=true
    res = tx.put_half_batch(buffer, producer_group, txn_id)                           # SendBatch in a transaction
    out = tx.end_transaction(txn_id, commit=True)         # or end_transaction_by_offset(half_commitlog_offset, ..)
    tx.list_transactions(prefix="query-1:"); tx.end_transactions(prefix="query-1:", commit=False)
    tx.shutdown()                                         # before store.shutdown()

The checker is called from the check thread; it may answer at once (return TxState) or later through
``end_transaction(..., from_check=True)`` (RocketMQ's CHECK_TRANSACTION_STATE is one-way); None means "asked".
"""

from __future__ import annotations

import enum
import heapq
import itertools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from broker.errors import (
    BrokerError,
    CorruptionError,
    InvalidArgumentError,
    MessageIllegalError,
    QueryNotFoundError,
    ResponseCode,
)
from broker.format.batch import SmallBatch, ValidatedBatch, batch_properties, split_entries
from broker.format.message import (
    I32,
    I64,
    POS_PHYSICAL_OFFSET,
    POS_PREPARED_TX_OFFSET,
    POS_STORE_TIMESTAMP,
    POS_SYS_FLAG,
    PREFIX,
    Prop,
    StoredMessage,
    SysFlag,
    decode_entry,
    iter_entries,
)
from broker.format.send_checks import check_entries, check_message, validate_producer_group
from broker.format.system_topics import (
    TRANS_HALF_TOPIC,
    TRANS_MARKER_TOPIC,
    TRANS_OP_HALF_TOPIC,
    TRANS_READER_GROUP,
)
from broker.format.transaction_codec import (
    ATTEMPT,
    BATCH,
    COMMIT,
    COMMIT_START,
    COMMITTED_ATTEMPTS,
    COORDINATOR,
    DECISION,
    FINISHED_TAG,
    MAX_ATTEMPTS_PROPERTY_CHARS,
    REMOVE_TAG,
    ROLLBACK,
    RawHalf,
    check_transaction_id,
    decode_commit_start,
    decode_offsets,
    encode_commit_start,
    encode_offsets,
    half_properties,
    half_property_conflict,
    half_sys_flag,
    is_half_batch,
    raw_property,
    refuse_delay,
    rewrite_batch_as_half,
)
from broker.ha.metadata_sync import LOG_END_KEY
from broker.json_file import load_json, write_json_atomic
from broker.semantics.half_run import CommittedRun, HalfRun, check_halves, commit_halves
from broker.semantics.txn_in_place import (
    IN_PLACE,
    MESSAGES,
    SLICE,
    check_attempt,
    slice_record_properties,
    split_slices,
)
from broker.store import GetStatus, MessageStore, PutResult, PutStatus
from broker.store.txn_visibility import MARKER_QUEUE_ID, OpenSlice, encode_marker, mark_in_place

log = logging.getLogger(__name__)

STATE_FILE = "transactionState.json"
DEFAULT_TRANSACTION_TIMEOUT_MS = 6_000
DEFAULT_CHECK_INTERVAL_MS = 60_000
DEFAULT_CHECK_MAX = 15
DEFAULT_OUTCOME_RETENTION_MS = 24 * 3_600_000  # ended transactions are remembered (and re-read at start) this long
# ... and of single-message ones at most this many (the earliest ended forgotten first): about 600 B each, 300 MB in
# all. RocketMQ producers make one per message; batch transactions (one per Spark micro-batch) are not counted.
DEFAULT_MAX_OUTCOMES = 500_000
DEFAULT_PUT_CHUNK_BYTES = 1 << 20  # re-store batches: well under the store's batch limit
# A transaction's table (half offsets) is held in memory: about 100 B per half at the worst, so the default bounds
# one transaction's table near 400 MB.
DEFAULT_MAX_HALVES = 4_000_000
# A transaction takes no more messages once this long after its first (Kafka's transaction.max.timeout.ms, there
# 15 min): while it is open, readers of its queues see nothing past its first in-place row, and a writer that
# keeps sending but never decides would otherwise hold them for ever (the idle check-back never fires for it).
# Refused writes leave it idle, so the check-back and its rollback follow. An hour, as Flink's Kafka sink uses:
# a Spark micro-batch that writes for longer fails with the setting named.
DEFAULT_MAX_OPEN_MS = 3_600_000
# A commit makes every half into its committed entry before it decides (so one bad half refuses the whole commit),
# and keeps the entries it made, up to this many bytes, for storing after the decision; past it, halves are made
# into committed entries a second time as they are stored (about 2.6 us more per message here). So a commit's
# memory is bounded whatever its size, and one within the bound makes each entry once: the Spark sink's rows of
# 100 B commit to 361 B each (its properties), so a micro-batch of 1M such rows (361 MB) fits.
DEFAULT_COMMIT_MEMORY_BYTES = 512 << 20
SCAN_BATCH = 1024  # messages per get while scanning a queue
DISPATCH_WAIT_S = 30.0  # how long start-up recovery waits for the store's dispatcher to reach the log end
_DELAY_NAME = f"{Prop.DELAY}\x01".encode()


class TxState(enum.Enum):
    """A producer's answer (RocketMQ's LocalTransactionState)."""

    COMMIT = "COMMIT_MESSAGE"
    ROLLBACK = "ROLLBACK_MESSAGE"
    UNKNOWN = "UNKNOW"


class TxStatus(enum.Enum):
    OPEN = "OPEN"
    ENDING = "ENDING"  # a decision is being written; new halves refused
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"


Checker = Callable[[str, str, StoredMessage], "TxState | None"]
# (transaction id, its first half, final) -> True when another broker decides it (participant_resolver.py)
Resolver = Callable[[str, StoredMessage, bool], bool]


class TransactionError(BrokerError):
    code = ResponseCode.TRANSACTION_FAILED


class HalvesGoneError(TransactionError):
    """Half messages a decision needs were deleted (expired files): the commit can never be completed."""


class DecisionGoneError(TransactionError):
    """A commit's decision op message was deleted (expired files) before its re-store finished: what the commit
    covers is no longer known, so it can never be completed."""


_NO_OFFSETS: frozenset[int] = frozenset()


@dataclass(slots=True)  # one per transaction, and RocketMQ-style producers make one per message
class _Txn:
    txn_id: str
    producer_group: str
    first_ms: int
    last_ms: int
    halves: dict[int, int] = field(default_factory=dict)  # half queue offset -> half commit-log offset
    status: TxStatus = TxStatus.OPEN
    inflight: int = 0  # half puts under way
    inflight_halves: int = 0  # messages in those puts (counted against max_halves before they are stored)
    # Lowest half-queue offset an in-flight put can get, and the op-queue end when a decision began: persist()
    # must not move the start-up scan past halves or a decision that are being written right now.
    half_floor: int = 0
    op_floor: int = 0
    check_times: int = 0
    # When the last check was counted: the next one waits transaction_timeout_ms from there too, so a producer
    # slower than the check passes is not sent a copy of each check per pass (not persisted: a restart asks anew).
    checked_ms: int = 0
    ended_ms: int = 0
    decision_op_offset: int = -1
    finished: bool = True  # False while a commit's re-store is incomplete
    decided: frozenset[int] = _NO_OFFSETS  # half queue offsets the decision covers
    restoring: bool = False  # a thread is re-storing this commit's halves: no one else may
    # Once an ended transaction is finished, its per-message tables above are dropped (drop_tables): these keep
    # what is still asked of it. -1: the tables are still there.
    decided_total: int = -1
    top_half: int = -1
    # A batch transaction (halves sent with SendBatch, or ended naming writer attempts): its outcome is kept for
    # the whole retention time whatever its size; a 0- or 1-row micro-batch is no single-message transaction.
    batch: bool = False
    # Halves put one at a time, each with an entry in the end-by-offset table (TransactionService._drop_tables
    # removes them all; walking a batch transaction's million halves for entries it never had would be waste).
    single_puts: int = 0
    # A transaction writing in place (txn_in_place.py): slice handle -> writer attempt. Its halves are its slice
    # records, and no half message of the half/op kind may join it (nor a slice one that has them).
    slices: dict[int, str] = field(default_factory=dict)
    in_place: bool | None = None  # how its puts store messages, once the first one said (None: none yet)

    def decided_count(self) -> int:
        return self.decided_total if self.decided_total >= 0 else len(self.decided)

    def highest_half(self) -> int:
        """The highest half-queue offset this transaction has (-1: none)."""
        return max(self.halves) if self.halves else self.top_half

    def drop_tables(self) -> None:
        """Free the per-message tables of an ended, finished transaction, keeping its count and highest half.
        Why: outcomes are remembered for outcome_retention_ms (a day by default), and a sink that commits 100k
        rows/s would otherwise keep two table entries per row (about 150 bytes) for that day. The caller also
        drops the transaction's entry in the end-by-offset table (TransactionService._drop_tables)."""
        assert self.status in (TxStatus.COMMITTED, TxStatus.ROLLED_BACK) and self.finished, (self.txn_id, self.status)
        self.decided_total = self.decided_count()
        self.top_half = max(self.top_half, max(self.halves, default=-1), max(self.decided, default=-1))
        self.halves = {}
        self.decided = _NO_OFFSETS  # not frozenset(): each call makes a new 216-byte object, kept for a day


@dataclass(frozen=True)
class TransactionInfo:
    txn_id: str
    producer_group: str
    status: TxStatus
    half_count: int
    first_store_ms: int
    last_activity_ms: int
    check_times: int
    ended_ms: int
    complete: bool  # for a commit: every half is in its real topic
    # open and written in place: "topic/queue@offset" of each queue whose readers it holds back (txn_visibility)
    held_queues: tuple[str, ...] = ()


@dataclass(frozen=True)
class EndResult:
    txn_id: str
    status: TxStatus  # the transaction's outcome (the first one, if it had ended before)
    already_ended: bool  # this call changed nothing
    half_count: int  # halves the decision covers
    restored: int  # messages this call re-stored in real topics
    complete: bool  # False: committed, but the re-store will be finished in the background / at restart


def _now_ms() -> int:
    return int(time.time() * 1000)


def _runs(sorted_offsets: list[int]) -> list[tuple[int, int]]:
    """Inclusive runs of consecutive values: [1, 2, 3, 7] -> [(1, 3), (7, 7)]."""
    if not sorted_offsets:
        return []
    arr = np.asarray(sorted_offsets, np.int64)
    breaks = np.flatnonzero(np.diff(arr) != 1)
    firsts = np.concatenate(([arr[0]], arr[breaks + 1]))
    lasts = np.concatenate((arr[breaks], [arr[-1]]))
    return list(zip(firsts.tolist(), lasts.tolist(), strict=True))


def _committed_by(entry: bytes, txn_id: str) -> bool:
    """Whether a real-queue entry was stored by this transaction's commit. PREPARED TRANSACTION OFFSET alone does
    not say: plain, retried and delayed messages carry 0 there (the commit-log offset of a fresh broker's first
    half), and a retry or delay copy of a committed message keeps its COMMIT type."""
    if SysFlag.transaction_type(I32.unpack_from(entry, POS_SYS_FLAG)[0]) != SysFlag.TRANSACTION_COMMIT_TYPE:
        return False
    return (raw_property(entry, Prop.TRANSACTION_ID) or raw_property(entry, Prop.UNIQ_KEY)) == txn_id


def _parse_checker_state(state: dict[str, Any]) -> tuple[int, int, dict[str, int]]:
    """``{"halfScanFrom": n, "opScanFrom": n, "checkTimes": {transaction id: n}}``; ValueError etc. if not."""
    checks = {str(tid): int(times) for tid, times in dict(state.get("checkTimes") or {}).items()}
    return int(state.get("halfScanFrom", 0)), int(state.get("opScanFrom", 0)), checks


class TransactionService:
    def __init__(
        self,
        store: MessageStore,
        config_dir: str,
        *,
        checker: Checker | None = None,
        transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS,
        check_interval_ms: int = DEFAULT_CHECK_INTERVAL_MS,
        check_max: int = DEFAULT_CHECK_MAX,
        outcome_retention_ms: int = DEFAULT_OUTCOME_RETENTION_MS,
        put_chunk_bytes: int = DEFAULT_PUT_CHUNK_BYTES,
        max_halves: int = DEFAULT_MAX_HALVES,
        commit_memory_bytes: int = DEFAULT_COMMIT_MEMORY_BYTES,
        max_outcomes: int = DEFAULT_MAX_OUTCOMES,
        max_open_ms: int = DEFAULT_MAX_OPEN_MS,
    ) -> None:
        if transaction_timeout_ms <= 0 or check_interval_ms <= 0 or check_max < 1 or put_chunk_bytes < 4096:
            raise InvalidArgumentError("transaction timeout, check interval, check max and chunk size must be positive")
        if max_open_ms <= 0:
            raise InvalidArgumentError(f"max_open_ms={max_open_ms}: a transaction must be able to take messages")
        if max_halves < 1:
            raise InvalidArgumentError(f"max_halves={max_halves}: a transaction must be able to hold a message")
        if commit_memory_bytes < 0:
            raise InvalidArgumentError(f"commit_memory_bytes={commit_memory_bytes} must be 0 or more")
        if max_outcomes < 1:
            raise InvalidArgumentError(f"max_outcomes={max_outcomes}: at least the last outcome must be kept")
        self.commit_memory_bytes = commit_memory_bytes
        self.max_outcomes = max_outcomes
        self.max_halves = max_halves
        self.max_open_ms = max_open_ms
        self.store = store
        self.path = os.path.join(config_dir, STATE_FILE)
        self.checker = checker
        # Transactions whose halves name a coordinator broker are ended by its decision: they are handed to this
        # instead of being checked back, and instead of being rolled back alone after check_max checks (final).
        self.resolver: Resolver | None = None
        # Raises when a new transaction names a coordinator broker this one could never ask (coordinator_names.py)
        self.require_coordinator: Callable[[str], None] | None = None
        # Asked, under the lock and before anything changes, whether the running request may act on a transaction:
        # (use, producer group) with use "end", "join" (a half naming an open transaction) or "open" (a half
        # opening one), and the group recorded when the transaction was opened (for a new record: the group it
        # takes). Raises to refuse. The broker sets its authorization (broker/auth/operations.py) here, so every
        # front that ends or joins a transaction is decided on the transaction's own group, not on a name in its
        # request.
        self.check_group: Callable[[str, str], None] | None = None
        self.transaction_timeout_ms = transaction_timeout_ms
        self.check_interval_ms = check_interval_ms
        self.check_max = check_max
        self.outcome_retention_ms = outcome_retention_ms
        self.put_chunk_bytes = min(put_chunk_bytes, store.config.batch_limit_bytes)  # a chunk is one put_batch
        self._lock = threading.Lock()
        self._restore_lock = threading.Lock()
        self._slice_lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._txns: dict[str, _Txn] = {}
        # half commit-log offset -> txn id, for RocketMQ's end-by-offset of single halves; a batch half is looked
        # up in the store instead (end_transaction_by_offset), so a big transaction costs no entry per message here
        self._by_half_cl_offset: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._cut_back_state()

    # ------------------------------------------------------------------------------------------ lifecycle

    def _cut_back_state(self) -> None:
        """The state file names the log end it was saved at; a log that ends before it now was cut back (a
        replica truncated to where it agrees with its new master, or an ASYNC_FLUSH log that lost its unflushed
        tail in a crash). Scan starts past a queue's end would pass over the halves and decisions that take those
        offsets next: each comes down to its queue's end here, at start-up, before anything is appended (once the
        queues have grown again, recover() would skip them). An unreadable file is left to recover(), which
        reports it."""
        try:
            data = load_json(self.path, dict)
        except CorruptionError:
            return
        log_now = self.store.max_phys_offset()
        log_end = None if data is None else data.get(LOG_END_KEY)
        if data is None or not isinstance(log_end, int) or log_end <= log_now:
            return
        for key, topic in (("halfScanFrom", TRANS_HALF_TOPIC), ("opScanFrom", TRANS_OP_HALF_TOPIC)):
            start, end = data.get(key, 0), self.store.queue_end(topic, 0)
            if isinstance(start, int) and start > end:
                log.warning("%s: %s %d is past the queue end %d (saved at commit-log offset %d, the log ends at "
                            "%d): moving back", self.path, key, start, end, log_end, log_now)  # fmt: skip
                data[key] = end
        data[LOG_END_KEY] = log_now
        write_json_atomic(self.path, data)

    def start(self) -> None:
        """Recover (finish interrupted commits), then start the check-back thread. Call before serving."""
        assert not self._started, "already started"
        self.recover()
        self._started = True
        self._stop.clear()
        self._thread = threading.Thread(target=self._run_checks, name="transaction-check", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        recovered, self._started = self._started, False
        if recovered:  # a start refused by recovery (say an unreadable state file) must leave the file as it was
            self.persist()

    def _drop_tables(self, txn: _Txn) -> None:
        """Under _lock: free an ended, finished transaction's tables, and its end-by-offset entries (a later
        end-by-offset of its half reads the half's id from the store, then reports the outcome)."""
        if txn.single_puts:  # each of its single-message puts added one; a batch-only transaction has none to find
            for cl in txn.halves.values():
                self._by_half_cl_offset.pop(cl, None)
            txn.single_puts = 0
        txn.drop_tables()

    # ------------------------------------------------------------------------------------------ half messages

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
    ) -> _Txn:
        check_transaction_id(txn_id)
        now = _now_ms()
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
                txn = self._txns[txn_id] = _Txn(txn_id, producer_group, now, now)
            txn.in_place = in_place
            txn.inflight_halves += count
            txn.batch = txn.batch or batch
            floor = self.store.max_offset(TRANS_HALF_TOPIC, 0)  # the put's halves get offsets at or above this
            txn.half_floor = min(txn.half_floor, floor) if txn.inflight else floor
            txn.inflight += 1
            txn.last_ms = now
            return txn

    def _end_put(self, txn: _Txn, res: PutResult | None, count: int = 1, *, halves: bool = True) -> None:
        """``halves``: the put stored half messages (False: in-place entries, which are no halves)."""
        with self._lock:
            txn.inflight_halves -= count
            if halves and res is not None and res.status in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
                txn.halves.update(zip(res.queue_offsets, res.commitlog_offsets, strict=True))
                if len(res.commitlog_offsets) == 1:
                    self._by_half_cl_offset[res.commitlog_offsets[0]] = txn.txn_id
                    txn.single_puts += 1
            txn.inflight -= 1
            txn.last_ms = _now_ms()
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
                                   run=validated.run if isinstance(validated, ValidatedBatch) else None)  # fmt: skip
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
        if _DELAY_NAME in batch_properties(validated.data, validated):  # a cheap search; hits checked one by one
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

    def _slice(self, txn: _Txn, attempt: str, coordinator: str) -> int:
        """The handle of ``txn``'s slice for ``attempt``, storing its slice record the first time."""
        with self._slice_lock:  # one record per attempt, whatever the number of concurrent first batches
            with self._lock:
                for handle, known in txn.slices.items():
                    if known == attempt:
                        return handle
            props = slice_record_properties(txn.txn_id, txn.producer_group, attempt, coordinator)
            res = self.store.put_message(TRANS_HALF_TOPIC, 0, b"", props, wait_store_ok=False)
            if res.status not in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
                raise TransactionError(
                    f"transaction {txn.txn_id!r}: the slice record of attempt {attempt!r} could not be stored "
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

    # ------------------------------------------------------------------------------------------ ending

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
                now = _now_ms()
                txn = self._txns[txn_id] = _Txn(txn_id, producer_group, now, now)
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
        when it holds none (authorization: broker/auth/requirements.py)."""
        with self._lock:
            if half_commitlog_offset is not None:
                txn_id = self._by_half_cl_offset.get(half_commitlog_offset, "")
            txn = self._txns.get(txn_id) if txn_id else None
            return txn.producer_group if txn is not None else None

    def end_transaction_by_offset(self, half_commitlog_offset: int, commit: bool, **kwargs: Any) -> EndResult:
        """RocketMQ's END_TRANSACTION, which names the half message by its commit-log offset."""
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
        self, txn: _Txn, halves: dict[int, int], commit: bool, attempts: list[str] | None, expected: int | None = None
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
            txn.ended_ms = _now_ms()
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
        self, txn: _Txn, halves: dict[int, int], commit: bool, attempts: list[str] | None, props: dict[str, str]
    ) -> PutResult:
        """Store and flush the decision op message (the commit point): the halves it covers and ``props`` beside
        the properties every decision carries. TransactionError, nothing decided, if the store refuses it."""
        props = {Prop.TAGS: REMOVE_TAG, Prop.TRANSACTION_ID: txn.txn_id, DECISION: COMMIT if commit else ROLLBACK,
                 **props}  # fmt: skip
        if txn.producer_group:
            props[Prop.PGROUP] = txn.producer_group
        if attempts is not None:
            props[COMMITTED_ATTEMPTS] = ",".join(attempts)
        res = self.store.put_message(TRANS_OP_HALF_TOPIC, 0, encode_offsets(halves), props, wait_store_ok=True)
        if res.status not in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
            raise TransactionError(
                f"transaction {txn.txn_id!r}: the decision could not be stored ({res.status.name}: {res.error}); "
                "nothing changed, end it again later"
            )
        return res

    def _store_finished(self, txn: _Txn) -> None:
        """The op message saying the decision is complete (its copies stored, or its marker applied), then the
        transaction's tables go."""
        res = self.store.put_message(
            TRANS_OP_HALF_TOPIC, 0, txn.txn_id.encode(), {Prop.TAGS: FINISHED_TAG, Prop.TRANSACTION_ID: txn.txn_id},
            wait_store_ok=False,
        )  # fmt: skip
        if res.status not in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
            raise TransactionError(f"finished marker of {txn.txn_id!r} not stored: {res.status.name} {res.error}")
        with self._lock:
            txn.finished = True
            self._drop_tables(txn)

    def _decide_in_place(
        self, txn: _Txn, halves: dict[int, int], commit: bool, attempts: list[str] | None, expected: int | None
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
                                   {BATCH: "true", IN_PLACE: "true", MESSAGES: str(total)})  # fmt: skip
        with self._lock:
            txn.status = TxStatus.COMMITTED if commit else TxStatus.ROLLED_BACK
            txn.ended_ms = _now_ms()
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
                      txn.txn_id, e)  # fmt: skip
        finally:
            with self._lock:
                txn.restoring = False
        return EndResult(txn.txn_id, txn.status, False, total, total, complete)

    def _mark(self, txn: _Txn, keep: list[int], drop: list[int], total: int) -> None:
        """Write the marker deciding the slices (unless the store has applied one), wait until readers see it, then
        the finished op message."""
        if keep + drop and any(self.store.txn_visibility.decision(h) is None for h in keep + drop):
            res = self.store.put_message(TRANS_MARKER_TOPIC, MARKER_QUEUE_ID, encode_marker(keep, drop),
                                         {Prop.TRANSACTION_ID: txn.txn_id}, wait_store_ok=True)  # fmt: skip
            if res.status not in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
                raise TransactionError(f"marker of {txn.txn_id!r} not stored: {res.status.name} {res.error}")
            if not self.store.wait_dispatched(DISPATCH_WAIT_S, up_to=res.commitlog_offsets[0] + res.wrote_bytes):
                raise TransactionError(f"marker of {txn.txn_id!r} stored but not dispatched in {DISPATCH_WAIT_S} s")
        self._store_finished(txn)
        with self._lock:
            txn.decided_total = total

    def _finish_in_place(self, t: _Txn, op: StoredMessage) -> None:
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
                    "commit" if commit else "rollback", len(slices))  # fmt: skip

    def _commit_runs(
        self, offsets: list[int], attempts: list[str] | None
    ) -> tuple[list[CommittedRun], list[int], set[tuple[str, int]], int]:
        """Make every half at these half-queue offsets into its committed entries, reading one run at a time:
        MessageIllegalError for a bad half, HalvesGoneError for a missing one, before anything is decided.
        Returns the committed runs kept (a prefix, within commit_memory_bytes), the half offsets past it (to be
        made again as they are stored), every real queue the commit writes to and how many messages it commits."""
        kept: list[CommittedRun] = []
        later: list[int] = []
        queues: set[tuple[str, int]] = set()
        size = total = 0
        for run in self._iter_half_runs(offsets):
            committed = commit_halves(run, attempts=attempts)
            queues |= committed.queues
            total += committed.messages
            if later or size + len(committed.buffer) > self.commit_memory_bytes:
                later.extend(run.queue_offsets)
            else:
                kept.append(committed)
                size += len(committed.buffer)
        return kept, later, queues, total

    def _restore(self, txn: _Txn, committed: Iterable[CommittedRun], queues: Iterable[tuple[str, int]]) -> int:
        """Re-store committed entries in their real topics (``queues``: all they go to), all shown to readers at
        the same instant, then write the finished marker."""
        with self._restore_lock:  # one commit's visibility hold at a time: each shows exactly its own messages
            hold = self.store.hold_visibility(queues)
            try:
                restored = self._put_runs(txn, committed)
                if not self.store.wait_dispatched(DISPATCH_WAIT_S, up_to=self.store.max_phys_offset()):
                    log.error("transaction %s: dispatch lags %.0f s behind; showing the commit as far as it got",
                              txn.txn_id, DISPATCH_WAIT_S)  # fmt: skip
            finally:
                # Also on failure: a queue must not stay frozen; the check thread finishes the rest of the commit.
                self.store.release_visibility(hold)
        self._store_finished(txn)
        return restored

    def _put_runs(self, txn: _Txn, committed: Iterable[CommittedRun]) -> int:
        """put_batch calls of at most put_chunk_bytes; returns how many messages were stored."""
        chunk: list[tuple[bytes, np.ndarray | None]] = []
        size = restored = 0
        for run in committed:
            if not run.buffer:  # every half of the run was already re-stored (a commit finished after a crash)
                continue
            pieces = [(run.buffer, run.positions)] if len(run.buffer) <= self.put_chunk_bytes else [
                (piece, None) for piece, _ in split_entries(run.buffer, self.put_chunk_bytes)]  # fmt: skip
            for piece, positions in pieces:
                if chunk and size + len(piece) > self.put_chunk_bytes:
                    restored += self._put_chunk(txn.txn_id, chunk)
                    chunk, size = [], 0
                if len(piece) > self.put_chunk_bytes:  # one message too big for any batch goes alone
                    restored += self._put_one(txn.txn_id, piece)
                    continue
                chunk.append((piece, positions))
                size += len(piece)
        if chunk:
            restored += self._put_chunk(txn.txn_id, chunk)
        return restored

    def _put_one(self, txn_id: str, entry: bytes) -> int:
        m = decode_entry(entry)
        ip, _, port = m.born_host.rpartition(":")
        res = self.store.put_message(
            m.topic, m.queue_id, m.body, m.properties, flag=m.flag, sys_flag=m.sys_flag,
            born_timestamp=m.born_timestamp, born_host=(ip, int(port) if port.isdigit() else 0),
            reconsume_times=m.reconsume_times, prepared_transaction_offset=m.prepared_transaction_offset,
            wait_store_ok=False,
        )  # fmt: skip
        assert res.status is not PutStatus.PUT_OK or res.wrote_bytes == len(entry), (res.wrote_bytes, len(entry))
        if res.status not in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
            raise TransactionError(f"re-store of {txn_id!r} refused: {res.status.name} {res.error}")
        return 1

    def _put_chunk(self, txn_id: str, pieces: list[tuple[bytes, np.ndarray | None]]) -> int:
        """One put_batch of committed runs; their entry positions (when the bulk path knows them) spare the
        store's validation the walk: it checks them instead (batch.walk)."""
        buffer = pieces[0][0] if len(pieces) == 1 else b"".join(p for p, _ in pieces)
        known: np.ndarray | None = None
        if all(positions is not None for _, positions in pieces):
            starts = np.cumsum([0] + [len(p) for p, _ in pieces[:-1]])
            known = np.concatenate([pos + at for (_, pos), at in zip(pieces, starts.tolist(), strict=True)])
        try:
            validated = self.store.validate_batch(buffer, known)
        except MessageIllegalError as e:
            raise TransactionError(f"re-store of {txn_id!r} refused: {e.message}") from None
        res = self.store.put_batch(buffer, wait_store_ok=False, validated=validated)
        if res.status not in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
            raise TransactionError(f"re-store of {txn_id!r} refused: {res.status.name} {res.error}")
        return len(res.queue_offsets)

    # ------------------------------------------------------------------------------------------ reading

    def _scan_raw(self, topic: str, queue_id: int, start: int, end: int | None = None) -> Iterator[RawHalf]:
        """Entries of a queue from ``start`` (corrected up to the minimum) to ``end`` (default: the current max),
        undecoded."""
        offset = max(start, self.store.min_offset(topic, queue_id))
        stop = self.store.max_offset(topic, queue_id) if end is None else end
        while offset < stop:
            res = self.store.get_message(TRANS_READER_GROUP, topic, queue_id, offset, min(SCAN_BATCH, stop - offset))
            if res.status is GetStatus.FOUND:
                buf = res.buffer
                ends = [*res.entry_positions[1:], len(buf)]
                for qoff, a, b in zip(res.queue_offsets, res.entry_positions, ends, strict=True):
                    if qoff >= stop:
                        return
                    entry = buf[a:b]
                    yield RawHalf(qoff, I64.unpack_from(entry, POS_PHYSICAL_OFFSET)[0], entry)
                offset = res.next_begin_offset
            elif res.next_begin_offset > offset:
                offset = res.next_begin_offset  # expired or removed range: skip it
            else:
                return

    def _scan(self, topic: str, queue_id: int, start: int, end: int | None = None) -> Iterator[StoredMessage]:
        for raw in self._scan_raw(topic, queue_id, start, end):
            msg = decode_entry(raw.entry)
            msg.queue_offset = raw.queue_offset
            yield msg

    def _read_half_runs(self, queue_offsets: list[int]) -> list[HalfRun]:
        """The half messages at these half-queue offsets (sorted), as the store's gets return them: one buffer of
        raw entries per get, over contiguous runs of offsets. HalvesGoneError if any is missing."""
        return list(self._iter_half_runs(queue_offsets))

    def _iter_half_runs(self, queue_offsets: list[int]) -> Iterator[HalfRun]:
        """``_read_half_runs`` one get at a time, HalvesGoneError after the last: a caller that is done with each
        run before the next keeps one run in memory, not the transaction (hundreds of MB for a million halves,
        all of it fresh pages to fault in)."""
        if queue_offsets and self.store.max_offset(TRANS_HALF_TOPIC, 0) <= queue_offsets[-1]:
            self._wait_for_dispatch()  # halves just put may not have their consume-queue units yet
        found: list[list[int]] = []
        for first, last in _runs(queue_offsets):
            offset = max(first, self.store.min_offset(TRANS_HALF_TOPIC, 0))
            while offset <= last:
                res = self.store.get_message(TRANS_READER_GROUP, TRANS_HALF_TOPIC, 0, offset,
                                             min(SCAN_BATCH, last + 1 - offset))  # fmt: skip
                if res.status is not GetStatus.FOUND:
                    break
                found.append(res.queue_offsets)
                yield HalfRun(res.buffer, res.queue_offsets, res.entry_positions)
                offset = res.next_begin_offset
        if sum(len(f) for f in found) != len(queue_offsets):
            have = {q for f in found for q in f}
            missing = [q for q in queue_offsets if q not in have]
            raise HalvesGoneError(
                f"{len(missing)} half messages are gone from {TRANS_HALF_TOPIC} (expired?), first at queue offset "
                f"{missing[0]}; the transaction cannot be committed"
            )

    # ------------------------------------------------------------------------------------------ queries

    def _info(self, t: _Txn, open_slices: Mapping[int, OpenSlice] | None = None) -> TransactionInfo:
        """``open_slices`` (txn_visibility, by handle): for a transaction writing in place, whose count is its
        messages, not its slice records, and which holds back the queues it writes to."""
        count = t.decided_count() if t.status in (TxStatus.COMMITTED, TxStatus.ROLLED_BACK) else len(t.halves)
        held: dict[tuple[str, int], int] = {}
        if t.slices and t.status in (TxStatus.OPEN, TxStatus.ENDING):
            open_slices = open_slices if open_slices is not None else self._open_slices()
            mine = [open_slices[h] for h in t.slices if h in open_slices]
            count = sum(s.entries for s in mine)
            for s in mine:
                for key, first in s.first_offsets.items():
                    held[key] = min(held.get(key, first), first)
        return TransactionInfo(t.txn_id, t.producer_group, t.status, count, t.first_ms, t.last_ms, t.check_times,
                               t.ended_ms, t.finished, tuple(f"{k[0]}/{k[1]}@{at}" for k, at in sorted(held.items())))

    def _open_slices(self) -> dict[int, OpenSlice]:
        return {s.handle: s for s in self.store.txn_visibility.open_slices()}

    def transaction(self, txn_id: str) -> TransactionInfo | None:
        with self._lock:
            t = self._txns.get(txn_id)
            return None if t is None else self._info(t)

    def list_transactions(self, prefix: str = "", status: TxStatus | None = None) -> list[TransactionInfo]:
        open_slices = self._open_slices()
        with self._lock:
            return [
                self._info(t, open_slices)
                for tid, t in sorted(self._txns.items())
                if tid.startswith(prefix) and (status is None or t.status is status)
            ]

    # ------------------------------------------------------------------------------------------ check-back

    def _run_checks(self) -> None:
        next_persist = time.monotonic()
        while not self._stop.wait(self.check_interval_ms / 1000):
            try:
                self.check_once()
                if time.monotonic() >= next_persist:
                    self.persist()
                    next_persist = time.monotonic() + 5
            except Exception:
                log.exception("transaction check pass failed; next pass in %d ms", self.check_interval_ms)

    def check_once(self) -> int:
        """One check pass: finish stalled commits, check back idle open transactions, roll back those checked
        ``check_max`` times. Returns the number of transactions checked back."""
        self._roll_back_orphans()
        now = _now_ms()
        with self._lock:
            unfinished = [
                t for t in self._txns.values()
                if t.status in (TxStatus.COMMITTED, TxStatus.ROLLED_BACK) and not t.finished and not t.restoring
            ]  # fmt: skip
            for t in unfinished:
                t.restoring = True
            idle = [
                t for t in self._txns.values()
                if t.status is TxStatus.OPEN and not t.inflight and t.halves
                and now - max(t.last_ms, t.checked_ms) >= self.transaction_timeout_ms
            ]  # fmt: skip
        for t in unfinished:
            self._retry_finish(t)
        expired = [t for t in idle if t.check_times >= self.check_max]
        for t in expired:
            try:
                if self._decided_elsewhere(t, final=True):
                    continue
                log.warning("transaction %s: no answer after %d checks; rolling back", t.txn_id, t.check_times)
                self.end_transaction(t.txn_id, False)
            except Exception:  # broad, as in _check_back: one transaction's failure must not end the pass
                log.exception("transaction %s: rollback after %d checks failed; retried next pass", t.txn_id,
                              t.check_times)  # fmt: skip
        to_check = [t for t in idle if t.check_times < self.check_max]
        if not to_check:
            return 0
        with self._lock:
            for t in to_check:
                t.check_times += 1
                t.checked_ms = now
        self.persist()  # counted before asking, and on disk: a restart cannot grant check_max more checks
        for t in to_check:
            self._check_back(t)
        return len(to_check)

    def _roll_back_orphans(self) -> None:
        """Roll back, with a marker, the slices the store still holds open whose writer's record expired with the
        log's first files and which no transaction here names: nothing can decide them any more (a transaction is
        found by those records), and they would hold their queues from readers for ever. A marker, not a local
        rule, so that replicas do the same from the log."""
        log_min = self.store.min_phys_offset()
        with self._lock:
            known = {h for t in self._txns.values() for h in t.slices}
        orphans = [s.handle for s in self.store.txn_visibility.open_slices() if s.handle <= log_min
                   and s.handle not in known]  # fmt: skip
        if not orphans:
            return
        log.warning("transaction slices %s: their records expired undecided; rolling them back", orphans)
        res = self.store.put_message(TRANS_MARKER_TOPIC, MARKER_QUEUE_ID, encode_marker([], orphans), {},
                                     wait_store_ok=True)  # fmt: skip
        if res.status not in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
            log.error("rollback marker of expired slices not stored (%s: %s); the next pass retries",
                      res.status.name, res.error)  # fmt: skip

    def _retry_finish(self, t: _Txn) -> None:
        """check_once's retry of one stalled commit (``t.restoring`` set by the caller, cleared here)."""
        try:
            self._finish_commit(t)
        except (HalvesGoneError, DecisionGoneError) as e:
            self._give_up_commit(t, e)
        except Exception:
            # Broad on purpose: whatever stops this commit (store refusal, I/O error, a half that cannot be
            # committed) is this transaction's problem; the pass must still check back every open transaction.
            log.exception("transaction %s: finishing the commit failed; the next check pass retries", t.txn_id)
        finally:
            with self._lock:
                t.restoring = False

    def _check_back(self, t: _Txn) -> None:
        """Ask one transaction's producer group and apply a definite answer."""
        try:
            if self._decided_elsewhere(t, final=False):
                return
            answer = self._ask(t)
            if answer in (TxState.COMMIT, TxState.ROLLBACK):
                self.end_transaction(t.txn_id, answer is TxState.COMMIT, from_check=True)
        except Exception:
            # Broad on purpose: every check of the pass is already counted, so one that fails (its half unreadable,
            # its commit refused) must not leave the others counted but never asked. It is asked again next pass,
            # and rolled back once check_max passes have counted it.
            log.exception("transaction %s: check-back failed; it is checked again next pass", t.txn_id)

    def _ask(self, t: _Txn) -> TxState | None:
        if self.checker is None:
            return None
        half = self._first_half(t)
        if half is None:
            return None
        try:
            return self.checker(t.producer_group, t.txn_id, half)
        except Exception:
            log.exception("transaction %s: checker of group %s failed", t.txn_id, t.producer_group)
            return None

    def _first_half(self, t: _Txn) -> StoredMessage | None:
        with self._lock:
            first = min(t.halves) if t.halves else None
        return None if first is None else decode_entry(self._read_half_runs([first])[0].buffer)

    def _decided_elsewhere(self, t: _Txn, *, final: bool) -> bool:
        """True when ``resolver`` takes the transaction: its halves name the coordinator broker that decides it."""
        if self.resolver is None:
            return False
        half = self._first_half(t)
        return half is not None and self.resolver(t.txn_id, half, final)

    # ------------------------------------------------------------------------------------------ recovery

    def _wait_for_dispatch(self) -> None:
        """Scans read consume queues: let the dispatcher reach the end of the commit log first."""
        if not self.store.wait_dispatched(DISPATCH_WAIT_S):
            raise TransactionError(f"the store's dispatcher did not reach the commit-log end in {DISPATCH_WAIT_S} s")

    def recover(self) -> None:
        """Rebuild the transaction table from the op and half queues; finish interrupted commits."""
        self._wait_for_dispatch()
        half_from, op_from, check_times = load_json(self.path, _parse_checker_state) or (0, 0, {})
        decisions: dict[str, StoredMessage] = {}
        finished: set[str] = set()
        for op in self._scan(TRANS_OP_HALF_TOPIC, 0, op_from):
            tid = op.properties.get(Prop.TRANSACTION_ID)
            if tid is None:
                continue  # a RocketMQ-written op message without an id: not ours to resolve
            if op.tags == REMOVE_TAG:
                decisions.setdefault(tid, op)  # the first decision is the outcome
            elif op.tags == FINISHED_TAG:
                finished.add(tid)
        txns: dict[str, _Txn] = {}
        for raw in self._scan_raw(TRANS_HALF_TOPIC, 0, half_from):  # undecoded: there may be millions
            tid = raw_property(raw.entry, Prop.TRANSACTION_ID) or raw_property(raw.entry, Prop.UNIQ_KEY)
            if tid is None:
                tid = decode_entry(raw.entry).msg_id
            stored_ms = I64.unpack_from(raw.entry, POS_STORE_TIMESTAMP)[0]
            t = txns.get(tid)
            if t is None:
                t = txns[tid] = _Txn(tid, raw_property(raw.entry, Prop.PGROUP) or "", stored_ms, stored_ms)
            t.halves[raw.queue_offset] = raw.commitlog_offset
            t.last_ms = max(t.last_ms, stored_ms)
            if raw_property(raw.entry, SLICE) == "1":
                t.slices[raw.commitlog_offset + len(raw.entry)] = raw_property(raw.entry, ATTEMPT) or ""
            t.in_place = bool(t.slices)
        for tid, times in check_times.items():
            if tid in txns:
                txns[tid].check_times = times
        for tid, op in decisions.items():
            t = txns.get(tid) or _Txn(tid, op.properties.get(Prop.PGROUP, ""), op.store_timestamp, op.store_timestamp)
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
                                       for cl in t.halves.values()}  # fmt: skip
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
                 sum(t.status is TxStatus.OPEN for t in txns.values()))  # fmt: skip

    def _give_up_commit(self, t: _Txn, why: TransactionError) -> None:
        """A commit whose halves or decision are gone: nothing can bring them back, so it is marked finished
        (never retried) and said so in the log."""
        with self._lock:
            t.finished = True
            self._drop_tables(t)
        log.error("transaction %s: committed, but its interrupted re-store cannot finish: %s", t.txn_id, why)

    def _decision_op(self, t: _Txn) -> StoredMessage:
        for op in self._scan(TRANS_OP_HALF_TOPIC, 0, t.decision_op_offset, t.decision_op_offset + 1):
            return op
        raise DecisionGoneError(
            f"decision of transaction {t.txn_id!r} (op offset {t.decision_op_offset}) is gone (expired?); the "
            "commit cannot be completed"
        )

    def _finish_commit(self, t: _Txn, op: StoredMessage | None = None) -> None:
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
            for e in self._scan_raw(topic, qid, start):
                if _committed_by(e.entry, t.txn_id):
                    done.add(I64.unpack_from(e.entry, POS_PREPARED_TX_OFFSET)[0])
        skip = np.array(sorted(done), np.int64)
        todo = (commit_halves(r, attempts=allowed, skip=skip) for r in self._iter_half_runs(sorted(t.decided)))
        restored = self._restore(t, todo, queues)
        log.warning("transaction %s: finished an interrupted commit of %d halves: stored the %d not yet visible",
                    t.txn_id, len(t.decided), restored)  # fmt: skip

    # ------------------------------------------------------------------------------------------ state file

    def _forget_ended(self, now: int, half_from: int) -> None:
        """Under _lock: forget ended transactions past outcome_retention_ms, and the earliest ended single-message
        ones beyond max_outcomes (RocketMQ-style producers end one transaction per message: a day of them could
        take gigabytes). Batch transactions are few (one per Spark micro-batch) and keep their outcome for the
        whole retention time: the exactly-once sink asks for it when it re-runs a batch after a crash.
        Only transactions whose halves the next start-up scan no longer reaches (below half_from) are forgotten;
        it would find the others again, undecided."""
        done = [t for t in self._txns.values() if t.finished and t.status in (TxStatus.COMMITTED, TxStatus.ROLLED_BACK)
                and t.highest_half() < half_from]  # fmt: skip
        old = [t for t in done if now - t.ended_ms >= self.outcome_retention_ms]
        singles = [t for t in done if now - t.ended_ms < self.outcome_retention_ms and not t.batch
                   and t.decided_count() <= 1]  # fmt: skip
        if len(singles) > self.max_outcomes:
            excess = len(singles) - self.max_outcomes
            old += heapq.nsmallest(excess, singles, key=lambda t: t.ended_ms)
            log.warning("transactions: %d single-message outcomes kept, over max_outcomes=%d; forgetting the %d "
                        "earliest", len(singles), self.max_outcomes, excess)  # fmt: skip
        for t in old:  # finished and ended: _drop_tables already took its end-by-offset entry
            del self._txns[t.txn_id]

    def persist(self) -> None:
        """Write where the next start-up scans from: the oldest half still needed, and the oldest op message that
        still matters (a decision about such halves, an unfinished commit, or one within the retention time)."""
        now = _now_ms()
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
            )  # fmt: skip
            op_from = min([op_from] + [t.op_floor for t in self._txns.values() if t.status is TxStatus.ENDING])
            checks = {tid: t.check_times for tid, t in sorted(self._txns.items())
                      if t.status is TxStatus.OPEN and t.check_times}  # fmt: skip
            # with the log's end, which every decision and re-store the positions pass over lies below (metadata_sync)
            write_json_atomic(self.path, {"halfScanFrom": half_from, "opScanFrom": op_from, "checkTimes": checks,
                                          LOG_END_KEY: self.store.max_phys_offset()})  # fmt: skip


__all__ = [
    "DecisionGoneError",
    "EndResult",
    "MessageIllegalError",
    "TransactionError",
    "TransactionInfo",
    "TransactionService",
    "TxState",
    "TxStatus",
]
