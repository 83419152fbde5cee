"""Runs of commit-log entries: vectorised framing and CRC checks, and validation of client-encoded batches.

The commit log is walked in three passes so that the per-message Python work stays at a few hundred ns:

1. a tight loop follows TOTALSIZE from entry to entry (the only inherently sequential part);
2. numpy gathers every fixed field at once (``positions + field offset``) and checks the framing arithmetic;
3. one list comprehension computes the body CRCs.

The same scan serves batch validation (before anything is written), the dispatcher (CRC off) and recovery
(CRC on): one definition of "a valid entry". The numpy gathers it is built on are byte_rows.py's (importable from
here too).
"""

from __future__ import annotations

import mmap
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from broker.errors import CorruptionError, MessageIllegalError, shown
from broker.format import scan_kernel
from broker.format.byte_rows import HEADER_DTYPE as HEADER_DTYPE
from broker.format.byte_rows import gather as gather
from broker.format.byte_rows import headers as headers
from broker.format.byte_rows import put_rows as put_rows
from broker.format.byte_rows import row_view
from broker.format.byte_rows import rows_at as rows_at
from broker.format.byte_rows import splice as splice
from broker.format.message import (
    BLANK_MAGIC,
    BODY_START,
    ENTRY_HEADER,
    H_BODY_CRC,
    H_BODY_LENGTH,
    H_PREPARED_TX_OFFSET,
    H_QUEUE_ID,
    H_SYS_FLAG,
    MAX_TOPIC_BYTES,
    MESSAGE_MAGIC,
    MIN_ENTRY_SIZE,
    POS_PREPARED_TX_OFFSET,
    PREFIX,
    TOPIC_PATTERN,
    SysFlag,
    check_crc,
    is_topic_name,
    parse_layout,
    properties_complete,
    quick_layout,
    takes_queue_offset,
)

Buffer = bytes | bytearray | memoryview | mmap.mmap  # anything entries can be read from
MAX_QUEUE_ID = 1 << 16  # one directory per queue: more than 65536 queues per topic is a mistake, not a design
_CRC_MASK = 0x7FFFFFFF
_ARANGE = {w: np.arange(w, dtype=np.int64) for w in (1, 2, 4, 8, 16)}


def transaction_handles(arr: np.ndarray, run: EntryRun) -> np.ndarray | None:
    """PREPARED TRANSACTION OFFSET of each PREPARED entry of ``run`` (0 for the others), None when there is none:
    message.in_place_transactional for a whole run. ``arr``: the run's buffer as uint8."""
    prepared = (run.sys_flags & SysFlag.TRANSACTION_MASK) == SysFlag.TRANSACTION_PREPARED_TYPE
    if not prepared.any():
        return None
    handles = np.zeros(len(run), np.int64)
    handles[prepared] = gather(arr, run.positions[prepared] + POS_PREPARED_TX_OFFSET, 8, ">i8")
    return handles


def counted_entries(arr: np.ndarray, run: EntryRun) -> np.ndarray:
    """message.takes_queue_offset for every entry of ``run``."""
    tx = run.sys_flags & SysFlag.TRANSACTION_MASK
    counted = tx != SysFlag.TRANSACTION_ROLLBACK_TYPE
    handles = transaction_handles(arr, run)
    if handles is not None:
        counted &= (tx != SysFlag.TRANSACTION_PREPARED_TYPE) | (handles > 0)
    return counted


def split_entries(buffer: bytes, limit_bytes: int) -> list[tuple[bytes, int]]:
    """``buffer`` cut at entry boundaries into (chunk, entry count) of at most ``limit_bytes`` each (an entry
    bigger than the limit is a chunk of its own: whoever stores it decides what to do with it)."""
    chunks: list[tuple[bytes, int]] = []
    start = pos = count = 0
    unpack_prefix, end = PREFIX.unpack_from, len(buffer)
    while pos < end:
        total = unpack_prefix(buffer, pos)[0]
        if total <= 0:
            raise MessageIllegalError(f"batch entry at byte {pos} has size {total}")
        if count and pos + total - start > limit_bytes:
            chunks.append((buffer[start:pos], count))
            start, count = pos, 0
        pos += total
        count += 1
    if count:
        chunks.append((buffer[start:pos], count))
    return chunks


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
]


# walk(): the first entries are walked in Python to learn the typical size; the magic search pays off only when
# entries are small (it touches every byte, the Python walk costs ~0.3 us per entry).
WALK_PROBE_ENTRIES = 16
SMALL_BATCH_ENTRIES = 32  # batches up to this many entries are validated entry by entry (see SmallBatch)
MAGIC_SEARCH_MAX_AVG_BYTES = 512
# Bodies up to 5 KiB on average take the compiled CRC: it never holds the GIL, and zlib.crc32 holds it for inputs
# up to 5 KiB (CPython releases it above), so a replica's fetch or another send waits behind zlib but not behind
# the kernel. Single-threaded, 4 MiB of bodies (2026-11-26): compiled 4.0 ms at any size; zlib 6.5 ms at 512 B,
# 5.1 ms at 1 KiB, 3.6 ms at 2 KiB, 2.6 ms at 4 KiB.
COMPILED_CRC_MAX_AVG_BYTES = 5 * 1024
_MAGIC_BYTES = tuple(MESSAGE_MAGIC.to_bytes(4, "big", signed=True))
_EMPTY = np.zeros(0, np.int64)


def _chain_prefix(arr: np.ndarray, start: int, limit: int) -> tuple[np.ndarray, int]:
    """Entry positions found without a Python loop: (verified positions, where the next entry starts).

    Every entry carries MAGIC at +4, so candidate positions are where those 4 bytes occur (numpy compares every
    byte at once). Following TOTALSIZE from ``start`` must land exactly on the next candidate; the prefix where it
    does is proven (each member is the previous one's successor). A candidate inside a body breaks the chain
    early and the caller finishes with the Python walk, which is the definition.
    """
    seg = arr[start:limit]
    n = seg.size
    if n < MIN_ENTRY_SIZE:
        return _EMPTY, start
    b0, b1, b2, b3 = _MAGIC_BYTES
    hits = np.flatnonzero(seg[4 : n - 3] == b0)  # i: seg[i + 4] is the magic's first byte
    if hits.size == 0 or hits[0] != 0:
        return _EMPTY, start
    p = hits[(seg[hits + 5] == b1) & (seg[hits + 6] == b2) & (seg[hits + 7] == b3)]
    tot = gather(seg, p, 4, ">i4")
    nxt = p + tot
    ok = (tot >= MIN_ENTRY_SIZE) & (nxt <= n)
    ok[:-1] &= nxt[:-1] == p[1:]
    bad = np.flatnonzero(~ok)
    k = int(bad[0]) if bad.size else int(p.size)
    if k == 0:
        return _EMPTY, start
    return p[:k] + start, int(nxt[k - 1]) + start


def _same_size_guess(arr: np.ndarray, start: int, limit: int) -> np.ndarray | None:
    """Where the entries would start if every one had the first one's size (typical of a batch of same-sized
    bodies); _proven decides whether they do."""
    n = limit - start
    if n < MIN_ENTRY_SIZE:
        return None
    first = int(arr[start : start + 4].view(">i4")[0])
    if first < MIN_ENTRY_SIZE or n % first:
        return None
    return np.arange(start, limit, first, dtype=np.int64)


def _bad_head(total: int, magic: int) -> str:
    return f"bad entry head (TOTALSIZE {total}, MAGIC {magic & 0xFFFFFFFF:#x})"


def _py_walk(buf: Buffer, pos: int, limit: int, max_entries: int) -> tuple[list[int], int, str | None]:
    """The definition of framing: follow TOTALSIZE. Returns (positions, stop, reason); reason None means
    ``max_entries`` were taken without stopping, "" that the limit was reached exactly."""
    positions: list[int] = []
    append = positions.append
    unpack = PREFIX.unpack_from
    while pos + 8 <= limit:
        if len(positions) >= max_entries:
            return positions, pos, None
        total, magic = unpack(buf, pos)
        if magic != MESSAGE_MAGIC or total < MIN_ENTRY_SIZE or pos + total > limit:
            if magic == MESSAGE_MAGIC and total >= MIN_ENTRY_SIZE:
                return positions, pos, "partial"
            if magic == BLANK_MAGIC:
                return positions, pos, "blank"
            if total == 0 and magic == 0:
                return positions, pos, "zeros"
            return positions, pos, _bad_head(total, magic)
        append(pos)
        pos += total
    return positions, pos, "entry head cut short" if pos < limit else ""


def _proven(arr: np.ndarray, p: np.ndarray, start: int, limit: int) -> bool:
    """Whether candidate positions (known to the caller, or guessed) are exactly what following TOTALSIZE from
    ``start`` to ``limit`` finds: checked at O(entries), not O(bytes)."""
    gaps = np.diff(p)
    if p.size == 0 or p[0] != start or p[-1] + MIN_ENTRY_SIZE > limit or (gaps < MIN_ENTRY_SIZE).any():
        return False
    heads = row_view(arr, 8)[p].view(">i4")  # (TOTALSIZE, MAGIC) of each entry
    totals = heads[:, 0].astype(np.int64)
    return bool((heads[:, 1] == MESSAGE_MAGIC).all() and (totals[:-1] == gaps).all() and p[-1] + totals[-1] == limit)


def _proven_positions(arr: np.ndarray, known: np.ndarray | None, start: int, limit: int) -> np.ndarray | None:
    """``known`` if it is proven, else the same-size guess if that is, else None."""
    if known is not None:
        p = known.astype(np.int64, copy=False)
        if _proven(arr, p, start, limit):
            return p
    guess = _same_size_guess(arr, start, limit)
    return guess if guess is not None and _proven(arr, guess, start, limit) else None


_KERNEL_REASONS = {
    scan_kernel.STOP_AT_LIMIT: "",
    scan_kernel.STOP_HEAD_CUT: "entry head cut short",
    scan_kernel.STOP_PARTIAL: "partial",
    scan_kernel.STOP_BLANK: "blank",
    scan_kernel.STOP_ZEROS: "zeros",
}


def _stop_reason(buf: Buffer, pos: int, code: int) -> str:
    """_py_walk's reason for a scan_kernel stop code (the kernel returns numbers, not text)."""
    return _bad_head(*PREFIX.unpack_from(buf, pos)) if code == scan_kernel.STOP_BAD_HEAD else _KERNEL_REASONS[code]


def walk(buf: Buffer, start: int, limit: int, known: np.ndarray | None = None) -> tuple[np.ndarray, int, str]:
    """Follow TOTALSIZE from ``start``: entry positions, where the walk stopped and why ("" = at the limit).

    Strategy: positions the caller already knows (``known``), or those of same-sized entries, are proven at once
    (_proven, O(entries)) and used when they chain exactly from ``start`` to ``limit``; otherwise small entries
    are found by the magic search (O(bytes) in numpy, cheaper than a Python step per entry) and big ones are
    walked in Python, where a step per entry costs less than touching every byte. Ranges of at least
    scan_kernel.COMPILED_MIN_BYTES are walked by the compiled twin of _py_walk instead (about 50 ns per entry).
    """
    arr = np.frombuffer(buf, np.uint8)
    proven = _proven_positions(arr, known, start, limit)
    if proven is not None:
        del arr
        return proven, limit, ""
    if limit - start >= scan_kernel.COMPILED_MIN_BYTES:
        positions, pos, code = scan_kernel.walk(arr, start, limit, 1 << 62)
        del arr
        return positions, pos, _stop_reason(buf, pos, code)
    head, pos, reason = _py_walk(buf, start, limit, WALK_PROBE_ENTRIES)
    parts = [np.array(head, np.int64)]
    if reason is None:
        if (pos - start) < WALK_PROBE_ENTRIES * MAGIC_SEARCH_MAX_AVG_BYTES:
            fast, pos = _chain_prefix(arr, pos, limit)
            parts.append(fast)
        rest, pos, reason = _py_walk(buf, pos, limit, 1 << 62)
        parts.append(np.array(rest, np.int64))
    del arr
    return (parts[0] if len(parts) == 1 else np.concatenate(parts)), pos, reason or ""


def scan(buf: Buffer, start: int, limit: int, *, verify_crc: bool, known: np.ndarray | None = None) -> EntryRun:
    """Valid entries from ``start`` up to the first bad one (or ``limit``); see EntryRun.stop_reason.
    ``known``: entry positions the caller has (see walk)."""
    p, end, reason = walk(buf, start, limit, known)
    arr = np.frombuffer(buf, np.uint8)
    nxt = np.empty_like(p)
    nxt[:-1] = p[1:]
    if p.size:
        nxt[-1] = end
    sizes = nxt - p
    h = headers(arr, p) if p.size else np.zeros(0, HEADER_DTYPE)
    body_len = h["body_length"].astype(np.int64)
    topic_len_at = p + BODY_START + body_len
    frame_ok = (body_len >= 0) & (topic_len_at + 1 + 1 + 2 <= nxt)
    safe_tl_at = np.where(frame_ok, topic_len_at, p)
    topic_len = gather(arr, safe_tl_at, 1, "i1")
    props_len_at = safe_tl_at + 1 + topic_len
    frame_ok &= (topic_len > 0) & (props_len_at + 2 <= nxt)
    safe_pl_at = np.where(frame_ok, props_len_at, p)
    props_len = gather(arr, safe_pl_at, 2, ">i2")
    frame_ok &= (props_len >= 0) & (safe_pl_at + 2 + props_len == nxt)
    sys_flags = h["sys_flag"].astype(np.int64)
    frame_ok &= (sys_flags & (SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6)) == 0
    crcs = h["body_crc"].astype(np.int64)
    good = int(np.argmin(frame_ok)) if p.size and not frame_ok.all() else p.size
    if good < p.size:
        reason = _describe_frame_error(
            int(body_len[good]), int(topic_len[good]), int(props_len[good]), int(sizes[good])
        )
    if verify_crc and good:
        actual = body_crcs(buf, p[:good] + BODY_START, body_len[:good])
        bad = np.flatnonzero(actual != crcs[:good])
        if bad.size:
            good = int(bad[0])
            reason = f"body CRC {int(actual[good]):#x} != stored {int(crcs[good]):#x}"
    run = EntryRun(
        positions=p,
        sizes=sizes,
        queue_ids=h["queue_id"].astype(np.int64),
        queue_offsets=h["queue_offset"].astype(np.int64),
        sys_flags=sys_flags,
        store_timestamps=h["store_timestamp"].astype(np.int64),
        body_crcs=crcs,
        body_lengths=body_len,
        topic_starts=safe_tl_at + 1,
        topic_lengths=topic_len,
        props_starts=safe_pl_at + 2,
        props_lengths=props_len,
        end=end,
        stop_reason=reason,
    )
    del h
    del arr
    return run.take(good) if good < p.size else run


def body_crcs(buf: Buffer, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """RocketMQ body CRCs (31-bit) of many bodies.

    Many bodies go to the compiled loop (scan_kernel.crc32s, about 1 ns per byte, no per-call cost, GIL
    released); bodies of over COMPILED_CRC_MAX_AVG_BYTES on average go to zlib, which releases the GIL for them and
    whose wide loop is faster per byte once the call's fixed cost (about 250 ns) is spread. In the zlib loop,
    slicing copies, but a copy of a body is cheaper than a memoryview object per body (measured)."""
    total = int(lengths.sum())
    if total >= scan_kernel.COMPILED_MIN_BYTES and total <= COMPILED_CRC_MAX_AVG_BYTES * lengths.size:
        arr = np.frombuffer(buf, np.uint8)
        crcs_u32 = scan_kernel.crc32s(arr, starts, lengths)
        del arr  # an mmap cannot be closed while an array still points into it
        return crcs_u32.astype(np.int64) & _CRC_MASK
    crc32 = zlib.crc32
    ends = (starts + lengths).tolist()
    crcs = [crc32(buf[a:b]) for a, b in zip(starts.tolist(), ends, strict=True)]
    return np.array(crcs, np.int64) & _CRC_MASK


def queue_keys(buf: Buffer, run: EntryRun) -> tuple[np.ndarray, list[tuple[bytes, int]]]:
    """Group entries by (topic, queue id) without a per-entry Python loop: (key id per entry, distinct keys)."""
    n = len(run)
    if n == 0:
        return _EMPTY, []
    arr = np.frombuffer(buf, np.uint8)
    ts, tl = run.topic_starts, run.topic_lengths
    width = int(tl.max())
    cols = np.arange(width, dtype=np.int64)
    same_length = bool((tl == tl[0]).all())
    if same_length:
        rows = arr[ts[:, None] + cols]
    else:
        inside = cols < tl[:, None]
        rows = np.where(inside, arr[np.where(inside, ts[:, None] + cols, 0)], 0).astype(np.uint8)
        # Zero padding makes b"A" and b"A\0" one row (a torn or hostile TOPIC may hold zeros, and must reach the
        # caller's name check as it is): the length rides along as a last column and cuts the name.
        rows = np.hstack([rows, tl[:, None].astype(np.uint8)])
    del arr
    if (rows == rows[0]).all():
        topic_ids, uniq_rows = np.zeros(n, np.int64), [rows[0].tobytes()]
    else:
        uniq, inv = np.unique(np.ascontiguousarray(rows).view(f"V{rows.shape[1]}").ravel(), return_inverse=True)
        topic_ids, uniq_rows = inv.astype(np.int64).ravel(), [u.tobytes() for u in uniq]
    names = uniq_rows if same_length else [u[: u[-1]] for u in uniq_rows]
    combined = topic_ids * MAX_QUEUE_ID + run.queue_ids
    if (combined == combined[0]).all():
        return np.zeros(n, np.int64), [(names[int(topic_ids[0])], int(run.queue_ids[0]))]
    uk, kinv = np.unique(combined, return_inverse=True)
    return kinv.astype(np.int64).ravel(), [(names[k // MAX_QUEUE_ID], k % MAX_QUEUE_ID) for k in uk.tolist()]


# A name is one character class repeated (TOPIC_PATTERN), so stored TOPIC bytes are a valid name exactly when each
# byte is one the pattern admits: this table, derived from the pattern, checks a whole run's topics in one gather.
assert TOPIC_PATTERN.pattern.startswith("[") and TOPIC_PATTERN.pattern.endswith("]+"), "_TOPIC_BYTE_OK needs it"
_TOPIC_BYTE_OK = np.array([b < 128 and TOPIC_PATTERN.fullmatch(chr(b)) is not None for b in range(256)])


def first_bad_topic(buf: Buffer, run: EntryRun) -> int:
    """Index of the first entry whose TOPIC is not a valid name (message.is_topic_name), -1 if none."""
    if len(run) == 0:
        return -1
    lengths = run.topic_lengths.astype(np.int64)
    ends = np.cumsum(lengths)
    idx = np.repeat(run.topic_starts.astype(np.int64) - (ends - lengths), lengths) + np.arange(int(ends[-1]))
    arr = np.frombuffer(buf, np.uint8)
    bad = np.flatnonzero(~_TOPIC_BYTE_OK[arr[idx]])
    del arr  # an mmap cannot be closed while an array still points into it
    return int(np.searchsorted(ends, bad[0], side="right")) if bad.size else -1


def first_incomplete_properties(buf: Buffer, run: EntryRun) -> int:
    """Index of the first entry whose PROPERTIES are not empty and end with a zero byte
    (message.properties_complete), -1 if none."""
    with_props = np.flatnonzero(run.props_lengths > 0)
    if with_props.size == 0:
        return -1
    arr = np.frombuffer(buf, np.uint8)
    last = arr[(run.props_starts + run.props_lengths - 1)[with_props]]
    del arr
    bad = np.flatnonzero(last == 0)
    return int(with_props[bad[0]]) if bad.size else -1


def first_unstorable(buf: Buffer, run: EntryRun) -> tuple[int, str]:
    """(index, why) of the first entry of a scanned run that frames (and CRCs) correctly but that the store never
    writes: a TOPIC that is not a valid name, or PROPERTIES ending with a zero byte. Both are what a torn write
    leaves (zeros where the tail of the entry should be) when the body, and so its CRC, was already complete.
    (len(run), "") when every entry is one the store could have written. Recovery cuts the log there."""
    topic_at, props_at = first_bad_topic(buf, run), first_incomplete_properties(buf, run)
    if topic_at < 0 and props_at < 0:
        return len(run), ""
    if topic_at >= 0 and (props_at < 0 or topic_at <= props_at):
        start, n = int(run.topic_starts[topic_at]), int(run.topic_lengths[topic_at])
        return topic_at, f"TOPIC {bytes(buf[start : start + n])!r} is not a valid topic name (a torn write?)"
    return props_at, _INCOMPLETE_PROPERTIES + " (a torn write?)"


_INCOMPLETE_PROPERTIES = "PROPERTIES end with a zero byte, where a name\\x01value pair ends with \\x02 or a character"


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
    key_ids: np.ndarray  # index into ``keys`` per entry
    keys: list[tuple[str, int]]  # distinct (topic, queue id) of the batch
    counted: np.ndarray  # bool: advances its queue's offset (prepared / rolled-back transactions do not)


_BATCH_REASONS = {
    "partial": "its TOTALSIZE runs past the end of the buffer",
    "entry head cut short": "fewer than 8 bytes left for an entry head",
    "zeros": "TOTALSIZE and MAGIC are zero",
    "blank": "it is an end-of-file blank entry, which clients must not send",
}


def _check_batch_size(n_bytes: int, limit_bytes: int) -> None:
    if n_bytes == 0:
        raise MessageIllegalError("batch buffer is empty; send at least one encoded entry")
    if n_bytes > limit_bytes:
        raise MessageIllegalError(
            f"MESSAGE_SIZE_EXCEEDED: batch is {n_bytes} bytes, over the {limit_bytes}-byte batch limit; "
            "split it into smaller batches"
        )


@dataclass
class SmallBatch:
    """A validated batch of at most SMALL_BATCH_ENTRIES entries in plain lists: below that size numpy's fixed
    cost per call (some fifty calls per batch) is larger than checking the entries one by one."""

    data: bytearray
    positions: list[int]
    keys: list[tuple[str, int]]  # (topic, queue id) per entry
    counted: list[bool]  # advances its queue's offset (message.takes_queue_offset)


def batch_properties(buffer: bytes | bytearray, validated: SmallBatch | ValidatedBatch) -> bytes | bytearray:
    """The PROPERTIES sections of a validated batch joined into one string, for the searches that decide whether
    any entry may carry a property (DELAY, a timer): a search of the whole buffer passed over every body, about
    0.5 ms a megabyte for each name. A small batch is searched as it is."""
    if isinstance(validated, SmallBatch):
        return buffer
    run = validated.run
    with_props = np.flatnonzero(run.props_lengths > 0)
    if not with_props.size:
        return b""
    return splice(buffer, run.props_starts[with_props], run.props_lengths[with_props])


def validate_small_batch(buffer: bytes | bytearray | memoryview, limit_bytes: int, max_body: int) -> SmallBatch | None:
    """Like validate_batch, entry by entry; None when the batch has more than SMALL_BATCH_ENTRIES entries.

    Each entry gets quick_layout, the CRC and the limits; an entry that fails any of them is handed to
    ``_small_entry`` (the definition), which raises the precise error.
    """
    n_bytes = len(buffer)
    _check_batch_size(n_bytes, limit_bytes)
    buf = buffer if isinstance(buffer, bytes) else bytes(buffer)
    positions, end, reason = _py_walk(buf, 0, n_bytes, SMALL_BATCH_ENTRIES)
    if reason is None:
        return None
    if reason or end != n_bytes:
        why = _BATCH_REASONS.get(reason, reason) or "trailing bytes after the last entry"
        raise MessageIllegalError(
            f"batch entry {len(positions)} (at byte {end}) is malformed: {why}; re-encode the batch with "
            "broker.format.message.encode_entry"
        )
    keys: list[tuple[str, int]] = []
    counted: list[bool] = []
    names: dict[bytes, str] = {}
    ends = [*positions[1:], n_bytes]
    for i, (pos, nxt) in enumerate(zip(positions, ends, strict=True)):
        quick = quick_layout(buf, pos, nxt)
        if quick is None:
            raw = _small_entry(buf, pos, nxt, i, max_body)  # raises unless parse_layout accepts what quick did not
            h = ENTRY_HEADER.unpack_from(buf, pos)
        else:
            h, topic_at, topic_len, props_len = quick
            body_at = pos + BODY_START
            body_len, qid = h[H_BODY_LENGTH], h[H_QUEUE_ID]
            if (
                body_len > max_body
                or not 0 <= qid < MAX_QUEUE_ID
                or (props_len and buf[nxt - 1] == 0)
                or zlib.crc32(buf[body_at : body_at + body_len]) & _CRC_MASK != h[H_BODY_CRC]
            ):
                _small_entry(buf, pos, nxt, i, max_body)  # raises the precise error
            raw = buf[topic_at : topic_at + topic_len]
        name = names.get(raw)
        if name is None:
            names[raw] = name = _small_topic(raw, i)
        keys.append((name, h[H_QUEUE_ID]))
        counted.append(takes_queue_offset(h[H_SYS_FLAG], h[H_PREPARED_TX_OFFSET]))
    return SmallBatch(bytearray(buf), positions, keys, counted)


def _small_entry(buf: bytes, pos: int, nxt: int, i: int, max_body: int) -> bytes:
    """The definition of a valid batch entry (framing, CRC, limits): raises MessageIllegalError saying what is
    wrong, else returns the entry's raw topic."""
    try:
        lay = parse_layout(buf, pos, nxt)
        check_crc(buf, lay, pos=pos)
    except CorruptionError as e:
        raise MessageIllegalError(f"batch entry {i} (at byte {pos}) is malformed: {e.message}") from None
    h = lay.header
    if h.body_length > max_body:
        raise MessageIllegalError(
            f"MESSAGE_SIZE_EXCEEDED: batch entry {i} body is {h.body_length} bytes, over maxMessageSize {max_body}"
        )
    if not 0 <= h.queue_id < MAX_QUEUE_ID:
        raise MessageIllegalError(f"batch entry {i} has queue id {h.queue_id}; queue ids are 0..{MAX_QUEUE_ID - 1}")
    if not properties_complete(buf, lay.props_start, lay.props_len):
        raise MessageIllegalError(_incomplete_batch_entry(i, pos))
    return buf[lay.topic_start : lay.topic_start + lay.topic_len]


def _incomplete_batch_entry(i: int, pos: int) -> str:
    return (
        f"batch entry {i} (at byte {pos}): its {_INCOMPLETE_PROPERTIES}; encode them with "
        "broker.format.message.encode_properties"
    )


def _small_topic(raw: bytes, i: int) -> str:
    if not is_topic_name(raw):
        raise MessageIllegalError(_bad_topic(raw, i))
    return raw.decode("ascii")


def _bad_topic(raw: bytes, i: int) -> str:
    return (
        f"batch entry {i}: TOPIC {shown(bytes(raw))} is not a topic name (1..{MAX_TOPIC_BYTES} bytes of ASCII "
        "letters, digits, '%', '|', '_' or '-')"
    )


def validate_batch(
    buffer: bytes | bytearray | memoryview, limit_bytes: int, max_body: int, known: np.ndarray | None = None
) -> ValidatedBatch:
    """Check a client-encoded batch completely before anything is written; MessageIllegalError on the first fault.
    ``known``: entry positions the caller has (see walk); every other check runs all the same."""
    n_bytes = len(buffer)
    _check_batch_size(n_bytes, limit_bytes)
    run = scan(buffer, 0, n_bytes, verify_crc=True, known=known)
    if run.end != n_bytes or run.stop_reason:
        reason = _BATCH_REASONS.get(run.stop_reason, run.stop_reason) or "trailing bytes after the last entry"
        raise MessageIllegalError(
            f"batch entry {len(run)} (at byte {run.end}) is malformed: {reason}; re-encode the batch with "
            "broker.format.message.encode_entry"
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
    incomplete = first_incomplete_properties(buffer, run)
    if incomplete >= 0:
        raise MessageIllegalError(_incomplete_batch_entry(incomplete, int(run.positions[incomplete])))
    key_ids, raw_keys = queue_keys(buffer, run)
    keys: list[tuple[str, int]] = []
    for raw, qid in raw_keys:
        if not is_topic_name(raw):
            raise MessageIllegalError(_bad_topic(raw, int(np.flatnonzero(key_ids == len(keys))[0])))
        keys.append((raw.decode("ascii"), qid))
    counted = counted_entries(np.frombuffer(buffer, np.uint8), run)
    return ValidatedBatch(bytearray(buffer), run, key_ids, keys, counted)


def queue_id_ranges(keys: Iterable[tuple[str, int]]) -> dict[str, tuple[int, int]]:
    """Topic -> (lowest, highest) queue id over (topic, queue id) pairs."""
    ranges: dict[str, tuple[int, int]] = {}
    for topic, qid in keys:
        lo, hi = ranges.get(topic, (qid, qid))
        ranges[topic] = (min(lo, qid), max(hi, qid))
    return ranges


def queue_ranges(batch: SmallBatch | ValidatedBatch) -> tuple[int, dict[str, tuple[int, int]]]:
    """(entry count, topic -> (lowest, highest) queue id) of a validated batch."""
    count = len(batch.positions) if isinstance(batch, SmallBatch) else len(batch.run)
    return count, queue_id_ranges(batch.keys)  # keys per entry (small) or distinct (validated): same ranges


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
