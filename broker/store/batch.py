"""Runs of commit-log entries: vectorised framing and CRC checks, and validation of client-encoded batches.

The commit log is walked in three passes so that the per-message Python work stays at a few hundred ns:

1. a tight loop follows TOTALSIZE from entry to entry (the only inherently sequential part);
2. numpy gathers every fixed field at once (``positions + field offset``) and checks the framing arithmetic;
3. one list comprehension computes the body CRCs.

The same scan serves batch validation (before anything is written), the dispatcher (CRC off) and recovery
(CRC on): one definition of "a valid entry".
"""

from __future__ import annotations

import mmap
import zlib
from dataclasses import dataclass

import numpy as np

from broker.errors import MessageIllegalError
from broker.store.message import (
    BLANK_MAGIC,
    BODY_START,
    MAX_TOPIC_BYTES,
    MESSAGE_MAGIC,
    POS_BODY_CRC,
    POS_BODY_LENGTH,
    POS_QUEUE_ID,
    POS_QUEUE_OFFSET,
    POS_STORE_TIMESTAMP,
    POS_SYS_FLAG,
    PREFIX,
    SysFlag,
    validate_topic,
)

Buffer = bytes | bytearray | memoryview | mmap.mmap  # anything entries can be read from
MIN_ENTRY_SIZE = BODY_START + 1 + 1 + 2  # empty body, one-byte topic, no properties
MAX_QUEUE_ID = 1 << 16  # one directory per queue: more than 65536 queues per topic is a mistake, not a design
_CRC_MASK = 0x7FFFFFFF
_ARANGE = {w: np.arange(w, dtype=np.int64) for w in (1, 2, 4, 8, 16)}


def gather(arr: np.ndarray, idx: np.ndarray, width: int, dtype: str) -> np.ndarray:
    """Big-endian fields of ``width`` bytes at byte positions ``idx`` of the uint8 array ``arr``, as int64."""
    if idx.size == 0:
        return np.zeros(0, np.int64)
    return arr[idx[:, None] + _ARANGE[width]].view(dtype).ravel().astype(np.int64)


@dataclass
class EntryRun:
    """Consecutive valid message entries of one buffer; every array has one element per entry."""

    positions: np.ndarray  # int64 start of each entry in the buffer
    sizes: np.ndarray  # TOTALSIZE
    queue_ids: np.ndarray
    queue_offsets: np.ndarray
    sys_flags: np.ndarray
    store_timestamps: np.ndarray
    body_crcs: np.ndarray
    body_lengths: np.ndarray
    topic_starts: np.ndarray
    topic_lengths: np.ndarray
    props_starts: np.ndarray
    props_lengths: np.ndarray
    end: int  # buffer position after the last valid entry
    stop_reason: str  # "" = reached the limit; "blank" = end-of-file blank at ``end``; else why ``end`` is bad

    def __len__(self) -> int:
        return int(self.positions.size)

    def topics(self, buf: Buffer) -> list[bytes]:
        starts, lengths = self.topic_starts.tolist(), self.topic_lengths.tolist()
        return [bytes(buf[s : s + n]) for s, n in zip(starts, lengths, strict=True)]

    def properties(self, buf: Buffer) -> list[bytes]:
        starts, lengths = self.props_starts.tolist(), self.props_lengths.tolist()
        return [bytes(buf[s : s + n]) for s, n in zip(starts, lengths, strict=True)]

    def take(self, count: int) -> EntryRun:
        """The first ``count`` entries (when a later one failed a check)."""
        cut = {name: getattr(self, name)[:count] for name in _ARRAY_FIELDS}
        end = int(self.positions[count]) if count < len(self) else self.end
        return EntryRun(**cut, end=end, stop_reason=self.stop_reason)


_ARRAY_FIELDS = [
    "positions", "sizes", "queue_ids", "queue_offsets", "sys_flags", "store_timestamps", "body_crcs",
    "body_lengths", "topic_starts", "topic_lengths", "props_starts", "props_lengths",
]  # fmt: skip


def walk(buf: Buffer, start: int, limit: int) -> tuple[list[int], int, str]:
    """Follow TOTALSIZE from ``start``: entry positions, where the walk stopped and why ("" = at the limit)."""
    positions: list[int] = []
    append = positions.append
    unpack = PREFIX.unpack_from
    pos = start
    while pos + 8 <= limit:
        total, magic = unpack(buf, pos)
        if magic != MESSAGE_MAGIC or total < MIN_ENTRY_SIZE or pos + total > limit:
            if magic == MESSAGE_MAGIC and total >= MIN_ENTRY_SIZE:
                return positions, pos, "partial"
            if magic == BLANK_MAGIC:
                return positions, pos, "blank"
            if total == 0 and magic == 0:
                return positions, pos, "zeros"
            return positions, pos, f"bad entry head (TOTALSIZE {total}, MAGIC {magic & 0xFFFFFFFF:#x})"
        append(pos)
        pos += total
    if pos < limit:
        return positions, pos, "entry head cut short"
    return positions, pos, ""


def scan(buf: Buffer, start: int, limit: int, *, verify_crc: bool) -> EntryRun:
    """Valid entries from ``start`` up to the first bad one (or ``limit``); see EntryRun.stop_reason."""
    positions, end, reason = walk(buf, start, limit)
    arr = np.frombuffer(buf, np.uint8)
    p = np.array(positions, dtype=np.int64)
    nxt = np.empty_like(p)
    nxt[:-1] = p[1:]
    if p.size:
        nxt[-1] = end
    sizes = nxt - p
    body_len = gather(arr, p + POS_BODY_LENGTH, 4, ">i4")
    topic_len_at = p + BODY_START + body_len
    frame_ok = (body_len >= 0) & (topic_len_at + 1 + 1 + 2 <= nxt)
    safe_tl_at = np.where(frame_ok, topic_len_at, p)
    topic_len = gather(arr, safe_tl_at, 1, "i1")
    props_len_at = safe_tl_at + 1 + topic_len
    frame_ok &= (topic_len > 0) & (props_len_at + 2 <= nxt)
    safe_pl_at = np.where(frame_ok, props_len_at, p)
    props_len = gather(arr, safe_pl_at, 2, ">i2")
    frame_ok &= (props_len >= 0) & (safe_pl_at + 2 + props_len == nxt)
    sys_flags = gather(arr, p + POS_SYS_FLAG, 4, ">i4")
    frame_ok &= (sys_flags & (SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6)) == 0
    crcs = gather(arr, p + POS_BODY_CRC, 4, ">i4")
    good = int(np.argmin(frame_ok)) if p.size and not frame_ok.all() else p.size
    if good < p.size:
        reason = _describe_frame_error(
            int(body_len[good]), int(topic_len[good]), int(props_len[good]), int(sizes[good])
        )
    if verify_crc and good:
        starts = (p[:good] + BODY_START).tolist()
        ends = (p[:good] + BODY_START + body_len[:good]).tolist()
        mv = memoryview(buf)
        crc32 = zlib.crc32
        actual = np.array([crc32(mv[s:e]) for s, e in zip(starts, ends, strict=True)], dtype=np.int64) & _CRC_MASK
        bad = np.flatnonzero(actual != crcs[:good])
        if bad.size:
            good = int(bad[0])
            reason = f"body CRC {int(actual[good]):#x} != stored {int(crcs[good]):#x}"
    run = EntryRun(
        positions=p,
        sizes=sizes,
        queue_ids=gather(arr, p + POS_QUEUE_ID, 4, ">i4"),
        queue_offsets=gather(arr, p + POS_QUEUE_OFFSET, 8, ">i8"),
        sys_flags=sys_flags,
        store_timestamps=gather(arr, p + POS_STORE_TIMESTAMP, 8, ">i8"),
        body_crcs=crcs,
        body_lengths=body_len,
        topic_starts=safe_tl_at + 1,
        topic_lengths=topic_len,
        props_starts=safe_pl_at + 2,
        props_lengths=props_len,
        end=end,
        stop_reason=reason,
    )
    del arr
    return run.take(good) if good < p.size else run


def _describe_frame_error(body_len: int, topic_len: int, props_len: int, total: int) -> str:
    if body_len < 0:
        return f"negative BODY length {body_len}"
    if topic_len <= 0:
        return f"TOPIC length {topic_len} (must be 1..{MAX_TOPIC_BYTES}) or BODY length {body_len} overruns the entry"
    return (
        f"lengths (body {body_len}, topic {topic_len}, properties {props_len}) do not add up to TOTALSIZE {total}"
        " (or an IPv6 SYSFLAG bit is set)"
    )


# --------------------------------------------------------------------------------------------------- batches


@dataclass
class ValidatedBatch:
    """A client batch that passed every check, with what the append needs (computed outside the lock)."""

    data: bytearray  # the caller's bytes, copied once so that store fields can be patched in
    run: EntryRun
    topics: list[str]  # one per entry
    key_ids: np.ndarray  # index into ``keys`` per entry
    keys: list[tuple[str, int]]  # distinct (topic, queue id) of the batch
    counted: np.ndarray  # bool: advances its queue's offset (prepared / rolled-back transactions do not)


def validate_batch(buffer: bytes | bytearray | memoryview, limit_bytes: int, max_body: int) -> ValidatedBatch:
    """Check a client-encoded batch completely before anything is written; MessageIllegalError on the first fault."""
    n_bytes = len(buffer)
    if n_bytes == 0:
        raise MessageIllegalError("batch buffer is empty; send at least one encoded entry")
    if n_bytes > limit_bytes:
        raise MessageIllegalError(
            f"MESSAGE_SIZE_EXCEEDED: batch is {n_bytes} bytes, over the {limit_bytes}-byte batch limit; "
            "split it into smaller batches"
        )
    run = scan(buffer, 0, n_bytes, verify_crc=True)
    if run.end != n_bytes or run.stop_reason:
        reason = run.stop_reason or "trailing bytes"
        raise MessageIllegalError(
            f"batch entry {len(run)} (at byte {run.end}) is malformed: {reason}; re-encode the batch with "
            "broker.store.message.encode_entry"
        )
    too_big = np.flatnonzero(run.body_lengths > max_body)
    if too_big.size:
        i = int(too_big[0])
        raise MessageIllegalError(
            f"MESSAGE_SIZE_EXCEEDED: batch entry {i} body is {int(run.body_lengths[i])} bytes, over maxMessageSize "
            f"{max_body}"
        )
    bad_q = np.flatnonzero((run.queue_ids < 0) | (run.queue_ids >= MAX_QUEUE_ID))
    if bad_q.size:
        i = int(bad_q[0])
        raise MessageIllegalError(
            f"batch entry {i} has queue id {int(run.queue_ids[i])}; queue ids are 0..{MAX_QUEUE_ID - 1}"
        )
    raw_topics = run.topics(buffer)
    names: dict[bytes, str] = {}
    for i, raw in enumerate(raw_topics):
        if raw not in names:
            try:
                names[raw] = raw.decode("ascii")
                validate_topic(names[raw])
            except (UnicodeDecodeError, MessageIllegalError) as e:
                raise MessageIllegalError(f"batch entry {i}: {e}") from None
    topics = [names[raw] for raw in raw_topics]
    key_index: dict[tuple[str, int], int] = {}
    pairs = zip(topics, run.queue_ids.tolist(), strict=True)
    key_ids = np.array([key_index.setdefault(k, len(key_index)) for k in pairs], dtype=np.int64)
    tx = run.sys_flags & SysFlag.TRANSACTION_MASK
    counted = (tx != SysFlag.TRANSACTION_PREPARED_TYPE) & (tx != SysFlag.TRANSACTION_ROLLBACK_TYPE)
    return ValidatedBatch(bytearray(buffer), run, topics, key_ids, list(key_index), counted)


def assign_queue_offsets(key_ids: np.ndarray, counted: np.ndarray, starts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Queue offsets for a batch: each counted entry takes its queue's next offset, in batch order.

    Returns (offset per entry, count per key). Uncounted entries (prepared / rolled back) get 0, as RocketMQ.
    """
    n_keys = len(starts)
    offsets = np.zeros(key_ids.size, np.int64)
    if n_keys == 1:
        idx = np.flatnonzero(counted) if not counted.all() else None
        count = key_ids.size if idx is None else idx.size
        seq = starts[0] + np.arange(count, dtype=np.int64)
        if idx is None:
            offsets = seq
        else:
            offsets[idx] = seq
        return offsets, np.array([count], np.int64)
    ids = np.where(counted, key_ids, n_keys)  # uncounted go to a dummy key
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    counts = np.bincount(ids, minlength=n_keys + 1)
    group_start = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rank = np.arange(ids.size, dtype=np.int64) - group_start[sorted_ids]
    base = np.array([*starts, 0], np.int64)
    offsets[order] = base[sorted_ids] + rank
    offsets[~counted] = 0
    return offsets, counts[:n_keys]
