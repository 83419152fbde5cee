"""The transaction service's table: one record per transaction, its states, limits and errors, and the queries.

Apart because every part of the service (puts, decisions, check-back, recovery) reads and changes these
records under one lock; the parts live in their own modules and build on this class."""

from __future__ import annotations

import enum
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from broker.errors import BrokerError, InvalidArgumentError, ResponseCode, ServiceNotAvailableError
from broker.format.message import I32, POS_SYS_FLAG, Prop, StoredMessage, SysFlag
from broker.format.transaction_codec import raw_property
from broker.semantics.transaction_state_file import STATE_FILE, cut_back_state
from broker.store import MessageStore
from broker.store.store_results import CANNOT_WRITE_NOW, PutResult
from broker.store.txn_visibility import OpenSlice

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
DELAY_NAME = f"{Prop.DELAY}\x01".encode()


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


def refused_record(res: PutResult, message: str) -> BrokerError:
    """The error for a transaction's record (a decision, a slice) the store refused: SERVICE_NOT_AVAILABLE when it
    cannot write now (a full disk: the caller tries again once space is back), else TRANSACTION_FAILED."""
    return ServiceNotAvailableError(message) if res.status in CANNOT_WRITE_NOW else TransactionError(message)


class HalvesGoneError(TransactionError):
    """Half messages a decision needs were deleted (expired files): the commit can never be completed."""


class DecisionGoneError(TransactionError):
    """A commit's decision op message was deleted (expired files) before its re-store finished: what the commit
    covers is no longer known, so it can never be completed."""


_NO_OFFSETS: frozenset[int] = frozenset()


@dataclass(slots=True)  # one per transaction, and RocketMQ-style producers make one per message
class TxnRecord:
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
class TransactionSummary:
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


def now_ms() -> int:
    return int(time.time() * 1000)


def offset_runs(sorted_offsets: list[int]) -> list[tuple[int, int]]:
    """Inclusive runs of consecutive values: [1, 2, 3, 7] -> [(1, 3), (7, 7)]."""
    if not sorted_offsets:
        return []
    arr = np.asarray(sorted_offsets, np.int64)
    breaks = np.flatnonzero(np.diff(arr) != 1)
    firsts = np.concatenate(([arr[0]], arr[breaks + 1]))
    lasts = np.concatenate((arr[breaks], [arr[-1]]))
    return list(zip(firsts.tolist(), lasts.tolist(), strict=True))


def committed_by(entry: bytes, txn_id: str) -> bool:
    """Whether a real-queue entry was stored by this transaction's commit. PREPARED TRANSACTION OFFSET alone does
    not say: plain, retried and delayed messages carry 0 there (the commit-log offset of a fresh broker's first
    half), and a retry or delay copy of a committed message keeps its COMMIT type."""
    if SysFlag.transaction_type(I32.unpack_from(entry, POS_SYS_FLAG)[0]) != SysFlag.TRANSACTION_COMMIT_TYPE:
        return False
    return (raw_property(entry, Prop.TRANSACTION_ID) or raw_property(entry, Prop.UNIQ_KEY)) == txn_id


class TransactionTable:
    """The service's state, shared by its parts: the transactions by id, their locks, limits and hooks."""

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
        self._txns: dict[str, TxnRecord] = {}
        # half commit-log offset -> txn id, for RocketMQ's end-by-offset of single halves; a batch half is looked
        # up in the store instead (end_transaction_by_offset), so a big transaction costs no entry per message here
        self._by_half_cl_offset: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        cut_back_state(self.path, store)

    def _serving(self) -> None:
        """Refuse a half put or a decision until ``start()`` has rebuilt the table. A new master starts this service
        after it became master, so requests can come while its recovery scans the queues: a half put then could be
        missed by the table the recovery swaps in (no check-back would ever find it), and a decision taken on the
        old table would be taken again on the new one (a committed transaction stored twice)."""
        if not self._started:
            raise ServiceNotAvailableError(
                "transactions are being recovered (this broker has just started or become master); send again in a "
                "moment"
            )

    def _now(self) -> int:
        """Wall-clock milliseconds: outcomes, check-back idleness and retention are measured on it."""
        return now_ms()

    def _drop_tables(self, txn: TxnRecord) -> None:
        """Under _lock: free an ended, finished transaction's tables, and its end-by-offset entries (a later
        end-by-offset of its half reads the half's id from the store, then reports the outcome)."""
        if txn.single_puts:  # each of its single-message puts added one; a batch-only transaction has none to find
            for cl in txn.halves.values():
                self._by_half_cl_offset.pop(cl, None)
            txn.single_puts = 0
        txn.drop_tables()

    def _info(self, t: TxnRecord, open_slices: Mapping[int, OpenSlice] | None = None) -> TransactionSummary:
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
        return TransactionSummary(
            t.txn_id,
            t.producer_group,
            t.status,
            count,
            t.first_ms,
            t.last_ms,
            t.check_times,
            t.ended_ms,
            t.finished,
            tuple(f"{k[0]}/{k[1]}@{at}" for k, at in sorted(held.items())),
        )

    def _open_slices(self) -> dict[int, OpenSlice]:
        return {s.handle: s for s in self.store.txn_visibility.open_slices()}

    def transaction(self, txn_id: str) -> TransactionSummary | None:
        with self._lock:
            t = self._txns.get(txn_id)
            return None if t is None else self._info(t)

    def list_transactions(self, prefix: str = "", status: TxStatus | None = None) -> list[TransactionSummary]:
        open_slices = self._open_slices()
        with self._lock:
            return [
                self._info(t, open_slices)
                for tid, t in sorted(self._txns.items())
                if tid.startswith(prefix) and (status is None or t.status is status)
            ]
