"""Transaction visibility: entries a transaction writes once, in their real queues, shown only by its marker.

A batch transaction may write its messages where they belong instead of as half messages to be copied at commit
(Kafka's design, against RocketMQ's half/op one: each message written once). Readers must then be kept from
them until the decision, and from the rolled-back ones for good. This module keeps, per queue, what they may
see, as a function of the commit log read in order: the dispatcher feeds it every entry it passes, on a master,
on a slave and in recovery alike, so a replica that takes office shows exactly what its master showed.

Formats (declared here, once):

* An **in-place entry** is an ordinary message entry in its real queue whose SYSFLAG transaction type is PREPARED
  and whose PREPARED TRANSACTION OFFSET holds the handle (> 0) of the transaction *slice* it belongs to
  (message.in_place_transactional). It takes a queue offset and gets its unit like any message. A slice is what
  one writer wrote for one transaction (the sink: one task attempt); its handle is a commit-log offset chosen by
  the transaction's writer (where its own record of the slice ends), so a handle at or below the log's first
  offset names nothing any more.
* A **marker** is an entry of ``MARKER_TOPIC`` queue 0 whose body decides slices, all at one instant::

      0       4     5            9          13
      +-------+-----+------------+----------+--------------------------------------------------+
      | MAGIC | VER | COMMITTED  | ABORTED  | HANDLE x COMMITTED, then HANDLE x ABORTED (8 each) |
      +-------+-----+------------+----------+--------------------------------------------------+

Rules (Kafka's last stable offset and aborted-transaction index, kept per queue):

* From the first entry of an open slice in a queue, readers see nothing of that queue (a VisibilityHold placed at
  that queue offset before its unit is written): the readable limit is the first offset of the oldest open slice.
* A marker releases the holds of every slice it names at the same instant; before that, the entries of the
  aborted ones become aborted ranges of their queues, which every reader skips (ConsumeQueue.aborted).
* An entry of a slice already decided takes that decision at once. A transaction's writer refuses such entries;
  this is the store's own guard, so that a straggler can never hold a queue forever nor show a rolled-back row.

Persistence: ``txnVisibility.json`` (the store's config directory) holds the state as of commit-log offset
``appliedTo``. Recovery loads it and re-dispatches from no later than ``appliedTo``; entries below it are not
applied again. A file naming an offset past the recovered end of the log (a lost tail, a replica's truncation) is
not used: the state is rebuilt from the first commit-log file, as it is for a store whose log is not empty but
has no file (deleted by hand). The file is saved between dispatch passes only (under the dispatcher's lock), so it
never holds an entry or marker at or past ``appliedTo``; the consume-queue flush rewrites it when the state
changed, and at least every SAVE_EVERY_BYTES of log, which bounds the extra re-dispatch at a restart. Aborted
ranges below a queue's first offset and decisions about handles at or below the log's first offset are dropped as
the log expires. A slice left open after its writer's record expired is rolled back by a marker of the
transaction service (TransactionService.check_once), so that replicas follow the log.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from broker import json_file  # the module, not its names: json_file imports broker.store.directory (a cycle)
from broker.errors import CorruptionError, MessageIllegalError
from broker.format.batch import SmallBatch, ValidatedBatch, put_rows
from broker.format.message import I32, I64, POS_PREPARED_TX_OFFSET, POS_SYS_FLAG, SysFlag
from broker.format.system_topics import TRANS_MARKER_TOPIC
from broker.store.consume_queue import ConsumeQueue, VisibilityHold

if TYPE_CHECKING:
    from broker.store.consume_queue_table import ConsumeQueueTable
    from broker.store.dispatcher import ArrivalListener

log = logging.getLogger(__name__)

MARKER_TOPIC = TRANS_MARKER_TOPIC  # named with the other system topics (broker/format/system_topics.py)
MARKER_QUEUE_ID = 0
MARKER_HEADER = struct.Struct(
    ">"
    "4s"  # MAGIC: MARKER_MAGIC
    "B"  # VERSION: MARKER_VERSION
    "I"  # COMMITTED: how many handles are committed
    "I"  # ABORTED: how many handles are rolled back
)
MARKER_MAGIC = b"STXM"
MARKER_VERSION = 1
HANDLE = struct.Struct(">q")
# One marker decides one transaction: its slices on this broker, one per task attempt. A Spark stage has at most
# a few thousand tasks, each retried a few times; the bound keeps a marker within one small message (512 KiB).
MAX_MARKER_HANDLES = 65536
STATE_FILE = "txnVisibility.json"
# Rewrite the state file at least this often in log bytes: a restart re-dispatches at most this much more than
# the checkpoint asks (some 0.1 s of dispatch on the test machine), for one small file write per 64 MiB.
SAVE_EVERY_BYTES = 64 * 1024 * 1024

QueueKey = tuple[str, int]


@dataclass(frozen=True)
class Marker:
    committed: tuple[int, ...]
    aborted: tuple[int, ...]


def encode_marker(committed: Sequence[int], aborted: Sequence[int]) -> bytes:
    """A marker body deciding these slices; MessageIllegalError for a handle <= 0, one named twice, or too many."""
    handles = [*committed, *aborted]
    if not handles or len(handles) > MAX_MARKER_HANDLES:
        raise MessageIllegalError(f"a marker decides 1..{MAX_MARKER_HANDLES} slices, not {len(handles)}")
    if min(handles) <= 0 or len(set(handles)) != len(handles):
        raise MessageIllegalError("marker handles must be positive commit-log offsets, each named once")
    head = MARKER_HEADER.pack(MARKER_MAGIC, MARKER_VERSION, len(committed), len(aborted))
    return head + np.asarray(handles, ">i8").tobytes()


def decode_marker(body: bytes, where: str = "", offset: int = -1) -> Marker:
    """The slices a marker body decides; CorruptionError naming ``where`` and ``offset`` if it is not one."""
    if len(body) < MARKER_HEADER.size:
        raise CorruptionError(f"transaction marker of {len(body)} bytes is shorter than its header", where, offset)
    magic, version, n_commit, n_abort = MARKER_HEADER.unpack_from(body)
    if magic != MARKER_MAGIC or version != MARKER_VERSION:
        raise CorruptionError(f"transaction marker has magic {magic!r} version {version}", where, offset)
    if len(body) != MARKER_HEADER.size + HANDLE.size * (n_commit + n_abort):
        raise CorruptionError(
            f"transaction marker names {n_commit} + {n_abort} handles in {len(body)} bytes", where, offset
        )
    handles = np.frombuffer(body, ">i8", offset=MARKER_HEADER.size).tolist()
    return Marker(tuple(handles[:n_commit]), tuple(handles[n_commit:]))


@dataclass
class _Slice:
    """An open slice: the hold it placed and its [start, end) queue-offset ranges per queue."""

    hold: VisibilityHold = field(default_factory=VisibilityHold)
    ranges: dict[QueueKey, list[list[int]]] = field(default_factory=dict)


@dataclass(frozen=True)
class OpenSlice:
    handle: int
    first_offsets: dict[QueueKey, int]  # queue -> the offset readers are held at by this slice
    entries: int


def _runs(qoffs: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) runs of consecutive offsets in a sorted array."""
    breaks = np.flatnonzero(np.diff(qoffs) != 1)
    starts = qoffs[np.concatenate(([0], breaks + 1))].tolist()
    ends = (qoffs[np.concatenate((breaks, [qoffs.size - 1]))] + 1).tolist()
    return list(zip(starts, ends, strict=True))


class TxnVisibility:
    def __init__(
        self,
        path: str,
        queues: ConsumeQueueTable,
        listeners: list[ArrivalListener],
        release_lock: threading.Lock,
        pass_lock: threading.Lock,
    ) -> None:
        self.path = path
        self.queues = queues
        self.listeners = listeners  # the dispatcher's: pulls waiting on a queue wake when a marker shows entries
        # Held while a marker's holds go: a reader of several queues at one instant (MessageStore.queue_ranges)
        # takes it too, so it sees a transaction in all of its queues or in none
        self.release_lock = release_lock
        # The dispatcher's, held for a whole pass: the state is saved between passes only, so that it is the state
        # of the log below ``applied_to`` exactly (a later cut of the log at ``applied_to`` or past it leaves it true)
        self.pass_lock = pass_lock
        self.lock = threading.Lock()  # the dispatcher (apply) against readers of the state
        self._save_lock = threading.Lock()  # one writer of the file at a time (flush thread, store.flush callers)
        self.applied_to = 0  # commit-log offset below which every entry has been applied
        self._open: dict[int, _Slice] = {}
        self._decided: dict[int, bool] = {}  # handle -> committed (True) or rolled back (False)
        self._changed = False
        self._saved_at = 0

    # ------------------------------------------------------------------------------------------------ applying
    def register(self, key: QueueKey, cq: ConsumeQueue, handles: np.ndarray, qoffs: np.ndarray) -> None:
        """In-place entries of one queue in one dispatch pass (handles > 0, queue offsets ascending), before their
        units are written. The caller passes only entries at or past ``applied_to``."""
        with self.lock:
            for handle in np.unique(handles).tolist():
                mine = qoffs if handles.size == 1 else qoffs[handles == handle]
                self._add(int(handle), key, cq, _runs(mine))

    def _add(self, handle: int, key: QueueKey, cq: ConsumeQueue, runs: list[tuple[int, int]]) -> None:
        decided = self._decided.get(handle)
        if decided is not None:
            if not decided:
                for start, end in runs:
                    cq.add_aborted(start, end)
                self._changed = True
            return
        piece = self._open.get(handle)
        if piece is None:
            piece = self._open[handle] = _Slice()
        spans = piece.ranges.get(key)
        if spans is None:
            cq.place_hold(piece.hold, runs[0][0])
            spans = piece.ranges[key] = []
        for start, end in runs:
            # A queue's offsets only grow, so a range below the last one's end was registered already: the state
            # was saved in the middle of a pass, and recovery dispatches that pass again
            start = max(start, spans[-1][1]) if spans else start
            if start >= end:
                continue
            if spans and spans[-1][1] == start:
                spans[-1][1] = end
            else:
                spans.append([start, end])
        self._changed = True

    def decide(self, marker: Marker) -> None:
        """Apply one marker: aborted slices' entries become aborted ranges, then every named slice's hold goes at
        one instant, and pulls waiting on those queues are woken."""
        with self.lock:
            released = self._decide(marker)
        self._wake(released)

    def _decide(self, marker: Marker) -> list[_Slice]:
        """decide() under the lock; returns the slices released, whose queues' readers are to be woken."""
        released: list[_Slice] = []
        for handle in marker.committed:
            self._decided[handle] = True
            piece = self._open.pop(handle, None)
            if piece is not None:
                released.append(piece)
        for handle in marker.aborted:
            self._decided[handle] = False
            piece = self._open.pop(handle, None)
            if piece is None:
                continue
            for (topic, qid), spans in piece.ranges.items():
                cq = self.queues.find(topic, qid)
                if cq is not None:
                    for start, end in spans:
                        cq.add_aborted(start, end)
            released.append(piece)
        with self.release_lock:
            VisibilityHold.release_together([p.hold for p in released])
        self._changed = True
        return released

    def _wake(self, released: list[_Slice]) -> None:
        for piece in released:
            for cq in piece.hold.queues:
                for fn in self.listeners:
                    fn(cq.topic, cq.queue_id, cq.max_offset)

    def advance(self, offset: int) -> None:
        """The dispatcher has passed every entry below ``offset``."""
        if offset > self.applied_to:
            self.applied_to = offset

    def forget_topic(self, topic: str) -> None:
        """A deleted topic: its queues are gone, so are its ranges (its entries expire with their files)."""
        with self.lock:
            for piece in self._open.values():
                for key in [k for k in piece.ranges if k[0] == topic]:
                    del piece.ranges[key]
            self._changed = True

    # ------------------------------------------------------------------------------------------------ reading
    def open_slices(self) -> list[OpenSlice]:
        """The slices not decided yet, oldest handle first (what holds each queue back, for operators)."""
        with self.lock:
            return [
                OpenSlice(h, {k: s[0][0] for k, s in p.ranges.items() if s},
                          sum(e - b for spans in p.ranges.values() for b, e in spans))
                for h, p in sorted(self._open.items())
            ]

    def decision(self, handle: int) -> bool | None:
        """True committed, False rolled back, None open or unknown."""
        with self.lock:
            return self._decided.get(handle)

    # ------------------------------------------------------------------------------------------------ persistence
    def load(self, log_min: int, log_end: int, dispatch_from: int) -> int:
        """Before recovery's re-dispatch (consume queues loaded): take the saved state; return where re-dispatch
        must start at the latest (``dispatch_from``, or earlier if the state was saved before it)."""
        state = json_file.load_json(self.path, _parse_state)
        if state is None and log_end > log_min:
            log.warning("%s: missing; rebuilt from the log's start %d", self.path, log_min)
            self.applied_to = log_min
            return log_min
        if state is None:  # a store with an empty log: nothing to rebuild
            self.applied_to = dispatch_from
            return dispatch_from
        applied_to, open_slices, decided, aborted = state
        if applied_to > log_end:
            log.warning("%s: saved at commit-log offset %d, past the log's end %d; rebuilt from the log's start %d",
                        self.path, applied_to, log_end, log_min)
            self.applied_to = log_min
            return log_min
        with self.lock:
            self.applied_to = applied_to
            self._decided = decided
            for (topic, qid), ranges in aborted.items():
                cq = self.queues.find(topic, qid)
                if cq is not None:
                    for start, end in ranges:
                        cq.add_aborted(start, end)
            self._open = {}
            for handle, queues in open_slices.items():
                piece = self._open[handle] = _Slice()
                for (topic, qid), spans in queues.items():
                    cq = self.queues.find(topic, qid)
                    if cq is not None and spans:
                        cq.place_hold(piece.hold, spans[0][0])
                        piece.ranges[(topic, qid)] = spans
        return min(dispatch_from, applied_to)

    def save(self, log_min: int, force: bool = False) -> None:
        """Write the state file if it changed or SAVE_EVERY_BYTES of log went by (or ``force``); drop what the log
        and the queues no longer hold first."""
        with self._save_lock, self.pass_lock, self.lock:
            if not (force or self._changed or self.applied_to - self._saved_at >= SAVE_EVERY_BYTES):
                return
            self._decided = {h: d for h, d in self._decided.items() if h > log_min}
            aborted: list[list[Any]] = []
            for (topic, qid), cq in list(self.queues.queues.items()):
                if cq.aborted:
                    cq.aborted = [(s, e) for s, e in cq.aborted if e > cq.min_offset]
                    if cq.aborted:
                        aborted.append([topic, qid, [list(r) for r in cq.aborted]])
            state = {
                "appliedTo": self.applied_to,
                "open": [[h, [[t, q, r] for (t, q), r in p.ranges.items()]] for h, p in self._open.items()],
                "decided": [[h, int(d)] for h, d in self._decided.items()],
                "aborted": aborted,
            }
            self._changed = False
            json_file.write_json_atomic(self.path, state)  # under the locks: a file of one pass boundary, one writer
            self._saved_at = self.applied_to

    # ------------------------------------------------------------------------------------------------ check
    def check(self, problems: list[str]) -> None:
        """check(): every open slice holds each of its queues at or below its first entry there; aborted ranges
        are sorted, disjoint and within the queue."""
        with self.lock:
            for handle, piece in self._open.items():
                for (topic, qid), spans in piece.ranges.items():
                    cq = self.queues.find(topic, qid)
                    if cq is None or not spans:
                        continue
                    held = [at for h, at in cq.held() if h is piece.hold]
                    if not held or held[0] > spans[0][0]:
                        problems.append(f"{topic}/{qid}: open transaction slice {handle} starts at {spans[0][0]} "
                                        f"but readers are held at {held or 'nothing'}")
                    if cq.max_offset > spans[0][0]:
                        problems.append(f"{topic}/{qid}: readers see up to {cq.max_offset}, past open transaction "
                                        f"slice {handle} at {spans[0][0]}")
            for (topic, qid), cq in list(self.queues.queues.items()):
                last = -1
                for start, end in cq.aborted:
                    if start < last or end <= start or end > cq.written_offset:
                        problems.append(f"{topic}/{qid}: aborted range [{start}, {end}) out of order or past the "
                                        f"queue's end {cq.written_offset}")
                    last = end


def _parse_state(data: dict[str, Any]) -> tuple[int, dict[int, dict[QueueKey, list[list[int]]]], dict[int, bool],
                                                dict[QueueKey, list[tuple[int, int]]]]:
    applied_to = int(data["appliedTo"])
    open_slices: dict[int, dict[QueueKey, list[list[int]]]] = {}
    for handle, queues in data["open"]:
        open_slices[int(handle)] = {(str(t), int(q)): [[int(s), int(e)] for s, e in r] for t, q, r in queues}
    decided = {int(h): bool(d) for h, d in data["decided"]}
    aborted = {(str(t), int(q)): [(int(s), int(e)) for s, e in r] for t, q, r in data["aborted"]}
    if applied_to < 0:
        raise ValueError(f"appliedTo {applied_to} is negative")
    return applied_to, open_slices, decided, aborted


def mark_in_place(batch: SmallBatch | ValidatedBatch, handle: int) -> None:
    """Make a validated batch's entries in-place entries of slice ``handle``: transaction type PREPARED in SYSFLAG
    and the handle in PREPARED TRANSACTION OFFSET, in ``batch.data`` and in the scan the dispatcher is handed. The
    entries must carry no transaction type (send_checks refuses one from clients); they keep their queue offsets
    (message.takes_queue_offset), and BODYCRC covers the body only."""
    if handle <= 0:
        raise MessageIllegalError(f"slice handle {handle} must be a positive commit-log offset")
    data = batch.data
    if isinstance(batch, SmallBatch):
        for pos in batch.positions:
            flag = I32.unpack_from(data, pos + POS_SYS_FLAG)[0]
            I32.pack_into(
                data, pos + POS_SYS_FLAG, (flag & ~SysFlag.TRANSACTION_MASK) | SysFlag.TRANSACTION_PREPARED_TYPE
            )
            I64.pack_into(data, pos + POS_PREPARED_TX_OFFSET, handle)
        return
    run = batch.run
    flags = (run.sys_flags & ~SysFlag.TRANSACTION_MASK) | SysFlag.TRANSACTION_PREPARED_TYPE
    arr = np.frombuffer(data, np.uint8)
    put_rows(arr, run.positions + POS_SYS_FLAG, flags.astype(">i4").view(np.uint8).reshape(-1, 4))
    put_rows(arr, run.positions + POS_PREPARED_TX_OFFSET,
             np.full(len(run), handle, ">i8").view(np.uint8).reshape(-1, 8))
    del arr
    run.sys_flags = flags.astype(run.sys_flags.dtype)


def markers_in(entries: Iterable[tuple[int, bytes]], where: str) -> list[tuple[int, Marker]]:
    """(commit-log offset, body) of marker entries -> decoded markers; a body that is not one is logged and
    skipped (only the broker writes markers, and the entry passed its CRC: a bug, never a client's input)."""
    out = []
    for phys, body in entries:
        try:
            out.append((phys, decode_marker(body, where, phys)))
        except CorruptionError as e:
            log.error("transaction marker skipped: %s", e.message)
    return out


def state_path(config_dir: str) -> str:
    return os.path.join(config_dir, STATE_FILE)
