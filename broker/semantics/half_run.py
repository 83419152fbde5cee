"""Runs of half messages in bulk: a client's half batch checked, a run of stored halves committed.

``transaction_codec.commit_raw`` is the definition: one half in, one committed entry out, about 10 us of Python
each. A batch transaction commits tens of thousands of halves at once, so ``commit_halves`` builds the same bytes
for a whole run (one ``get_message`` result) with numpy, and falls back to ``commit_raw`` entry by entry whenever
the run has a shape it cannot prove it handles exactly. A test checks that both give the same bytes.

The fast path relies on the layout every half-making path writes (``half_properties`` appends the five half
properties in this order, and the client's ``to_half_batch`` copies that order byte for byte)::

    properties of a half:
        application properties          kept as they are
        REAL_TOPIC\\x01 t \\x02          R: dropped (t and q address the committed entry)
        REAL_QID\\x01 q \\x02
        TRAN_MSG ... __transactionId__  T: kept; the same bytes in every half of the run

    properties of the committed entry = application properties + T + TRAN_PREPARED_QUEUE_OFFSET \\x01 n \\x02

The other header fields are the half's, except TOTALSIZE, QUEUEID (q), SYSFLAG (COMMIT type), PREPARED
TRANSACTION OFFSET (the half's commit-log offset) and the store fields, left 0 for ``put_batch``. BODYCRC is kept:
the body is the same bytes.

``check_halves`` is the broker's check of a client's half batch on SendBatch (``check_half_batch``, entry by
entry, is its definition) done the same way: T is known from the transaction id and producer group, and each
distinct R is matched in bulk.

Distinct values are few in a run, so each is parsed once in Python: the R of every entry is cut at a fixed
width (one width per distinct length of R, usually one) and grouped with ``np.unique``; each writer attempt's
``TRAN_ATTEMPT`` is matched against every entry in one numpy comparison. Past ``MAX_DISTINCT_PER_RUN`` distinct
values the run takes the per-entry path instead (same result, slower), which bounds the work at
O(entries x MAX_DISTINCT_PER_RUN).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import NamedTuple

import numpy as np

from broker.errors import MessageIllegalError, shown
from broker.format.batch import MAX_QUEUE_ID, EntryRun, gather, headers, put_rows, queue_id_ranges, rows_at, scan
from broker.format.message import (
    BODY_START,
    MAX_PROPERTIES_BYTES,
    MESSAGE_MAGIC,
    POS_PHYSICAL_OFFSET,
    TOPIC_LEN,
    Prop,
    SysFlag,
    validate_topic,
)
from broker.format.transaction_codec import (
    ATTEMPT,
    HALF_PROPERTY_NAMES,
    HALF_TOPIC_BYTES,
    RawHalf,
    check_half_batch,
    commit_raw,
    property_of,
    real_queue_id,
)

MAX_DISTINCT_PER_RUN = 64  # distinct real queues (or writer attempts) matched in bulk per run
_REAL_TOPIC = f"{Prop.REAL_TOPIC}\x01".encode()
_REAL_QID = f"{Prop.REAL_QID}\x01".encode()
_ATTEMPT = f"{ATTEMPT}\x01".encode()
_HALF_NAMES = tuple(f"{name}\x01".encode() for name in HALF_PROPERTY_NAMES)
_DELAY = f"{Prop.DELAY}\x01".encode()
_PREPARED_FORMAT = f"{Prop.TRAN_PREPARED_QUEUE_OFFSET}\x01%d\x02".encode()  # bytes % queue offset
# One R exactly: the real topic (no separators in it) and a decimal queue id.
_R_PATTERN = re.compile(rb"REAL_TOPIC\x01([^\x01\x02]+)\x02REAL_QID\x01([0-9]{1,10})\x02")
_SEP = 2  # \x02 ends every name\x01value pair


class CommittedRun(NamedTuple):
    buffer: bytes  # committed entries, in half order, ready for put_batch
    messages: int
    queues: frozenset[tuple[str, int]]  # the real queues they go to
    positions: np.ndarray | None = None  # where each entry starts in ``buffer``, when the bulk path built it


class HalfRun(NamedTuple):
    """A run of raw half entries as one ``get_message`` returned it."""

    buffer: bytes
    queue_offsets: Sequence[int]  # half-queue offset of each entry, in order
    positions: Sequence[int] | None = None  # where each entry starts in ``buffer`` (get_message's entry_positions)


def commit_halves(
    halves: HalfRun, *, attempts: Collection[str] | None = None, skip: np.ndarray | None = None
) -> CommittedRun:
    """The committed entries of a run of halves (``commit_raw`` of each, concatenated), leaving out halves whose
    ``TRAN_ATTEMPT`` is not in ``attempts`` (when given) and those whose commit-log offset is in ``skip`` (sorted:
    halves already re-stored). MessageIllegalError for a half that cannot be committed, as commit_raw."""
    buf = bytes(halves.buffer)
    known = None if halves.positions is None else np.asarray(halves.positions, np.int64)
    run = scan(buf, 0, len(buf), verify_crc=False, known=known)
    # The store read these entries; bad framing here means the read, not the client, went wrong.
    assert run.end == len(buf) and not run.stop_reason and len(run) == len(halves.queue_offsets), run.stop_reason
    arr = np.frombuffer(buf, np.uint8)
    half_cl = gather(arr, run.positions + POS_PHYSICAL_OFFSET, 8, ">i8")
    keep = np.ones(len(run), bool)
    if skip is not None and skip.size:
        keep &= ~np.isin(half_cl, skip)
    if attempts is not None:
        keep &= _attempt_mask(buf, arr, run, frozenset(attempts))
    idx = np.flatnonzero(keep)
    qoffs = np.asarray(halves.queue_offsets, np.int64)
    if idx.size == 0:
        return CommittedRun(b"", 0, frozenset())
    fast = _fast(buf, arr, run, idx, half_cl, qoffs)
    if fast is not None:
        return fast
    out = []
    for i in idx.tolist():
        a = int(run.positions[i])
        out.append(commit_raw(RawHalf(int(qoffs[i]), int(half_cl[i]), buf[a : a + int(run.sizes[i])])))
    return CommittedRun(b"".join(c.entry for c in out), len(out), frozenset(c.real_queue for c in out))


def _matches(arr: np.ndarray, at: np.ndarray, lo: np.ndarray, hi: np.ndarray, value: bytes) -> np.ndarray:
    """Per entry: do the bytes at ``at`` equal ``value``, lying within [lo, hi)? (One comparison per row: the
    rows are viewed as opaque ``len(value)``-byte items.)"""
    width = len(value)
    inside = (at >= lo) & (at + width <= hi)
    if width == 0:  # e.g. no T: the half properties were already in the message, R came last
        return inside
    rows = rows_at(arr, np.where(inside, at, 0), width)
    return inside & (rows.view(np.dtype((np.void, width))).ravel() == np.void(value))


def _attempt_mask(buf: bytes, arr: np.ndarray, run: EntryRun, attempts: frozenset[str]) -> np.ndarray:
    """Per half: is its TRAN_ATTEMPT one of ``attempts``? Writers put it first; each distinct value is matched in
    bulk when every entry has exactly one (none hiding in a body), else every entry is read on its own."""
    n = len(run)
    ps, pe = run.props_starts, run.props_starts + run.props_lengths
    if buf.count(_ATTEMPT) == n:
        decided = np.zeros(n, bool)
        keep = np.zeros(n, bool)
        for _ in range(MAX_DISTINCT_PER_RUN):
            pending = np.flatnonzero(~decided)
            if pending.size == 0:
                return keep
            i = int(pending[0])
            props = buf[int(ps[i]) : int(pe[i])]
            end = props.find(b"\x02")
            mark = props[: end + 1] if props.startswith(_ATTEMPT) and end > 0 else b""
            if not mark:
                break  # not first in this entry: read every entry on its own
            same = ~decided & _matches(arr, ps, ps, pe, mark)
            decided |= same
            keep[same] = mark[len(_ATTEMPT) : -1].decode("utf-8", "replace") in attempts
    ends = pe.tolist()
    return np.array([property_of(buf[a:b], ATTEMPT) in attempts for a, b in zip(ps.tolist(), ends, strict=True)], bool)


class _Located(NamedTuple):
    key: np.ndarray  # per entry of idx: which of ``queues`` its R names
    queues: list[tuple[bytes, int, int]]  # (real topic, real queue id, length of R)
    r_end: np.ndarray  # per entry: where its R ends and T begins
    tail: bytes  # T


def _locate(
    buf: bytes, arr: np.ndarray, run: EntryRun, idx: np.ndarray, tail: bytes | None, *, unique: bool = True
) -> _Located | None:
    """Find R and T (module docstring) in every entry of ``idx``, T given or taken from the first entry; None when
    the run is not of that shape. ``unique``: also prove each half has no other REAL_TOPIC / REAL_QID (committing
    drops "the first" one, so it must be this one; a check only needs R present)."""
    n = len(run)
    if unique and (buf.count(_REAL_TOPIC) != n or buf.count(_REAL_QID) != n):
        return None  # one R per half and nowhere else (not in a body, not twice): then "the first" is "the one"
    ps = run.props_starts[idx]
    pe = ps + run.props_lengths[idx]
    if tail is None:
        first = buf[int(ps[0]) : int(pe[0])]
        r = first.rfind(_REAL_TOPIC)
        m = _R_PATTERN.match(first, r) if r == 0 or (r > 0 and first[r - 1] == _SEP) else None
        if m is None:
            return None
        tail = first[m.end() :]
    if not _matches(arr, pe - len(tail), ps, pe, tail).all():
        return None
    r_end = pe - len(tail)
    key = np.full(idx.size, -1, np.int64)
    queues: list[tuple[bytes, int, int]] = []
    for _ in range(MAX_DISTINCT_PER_RUN):  # one pass per distinct length of R (usually one)
        pending = np.flatnonzero(key < 0)
        if pending.size == 0:
            return _Located(key, queues, r_end, tail)
        j = int(pending[0])
        props = buf[int(ps[j]) : int(r_end[j])]
        r = props.rfind(_REAL_TOPIC)
        if not (r == 0 or (r > 0 and props[r - 1] == _SEP)) or _R_PATTERN.fullmatch(props, r) is None:
            return None
        width = len(props) - r
        at = r_end[pending] - width
        fits = (at >= ps[pending]) & ((at == ps[pending]) | (arr[np.maximum(at - 1, 0)] == _SEP))
        rows = rows_at(arr, np.where(fits, at, 0), width).view(np.dtype((np.void, width))).ravel()
        values, which = np.unique(rows[fits], return_inverse=True)
        candidates = pending[fits]
        for v, value in enumerate(values.tolist()):
            m = _R_PATTERN.fullmatch(value)  # a slice of a longer R starts mid-name and never matches
            if m is not None and int(m.group(2)) >= MAX_QUEUE_ID:
                return None  # no such queue: the per-entry definition names the half
            if m is not None:
                key[candidates[which.ravel() == v]] = len(queues)
                queues.append((m.group(1), int(m.group(2)), width))
        assert key[j] >= 0, "the entry whose R set the width matches itself"
        if len(queues) > MAX_DISTINCT_PER_RUN:
            return None  # too many distinct real queues in one run
    return None  # too many distinct lengths of R in one run


def _fast(
    buf: bytes, arr: np.ndarray, run: EntryRun, idx: np.ndarray, half_cl: np.ndarray, qoffs: np.ndarray
) -> CommittedRun | None:
    """The committed run built in bulk; None when the run is not of the shape described in the module docstring."""
    found = _locate(buf, arr, run, idx, None)
    if found is None:
        return None
    return _assemble(buf, arr, run, idx, half_cl, qoffs, found.key, found.queues, found.r_end, found.tail)


class HalfCheck(NamedTuple):
    messages: int
    real_queues: dict[str, tuple[int, int]]  # real topic -> (lowest, highest) queue id the halves will go to


def check_halves(
    buffer: bytes | memoryview, producer_group: str, txn_id: str, *, run: EntryRun | None = None
) -> HalfCheck:
    """``transaction_codec.check_half_batch`` (the definition: what a half batch must be), answered in bulk for
    batches of the shape ``to_half_batch`` writes; any other batch is checked entry by entry by the definition.
    ``run``: the buffer's scan, when the caller has one. Returns the entry count and the real queues, so that the
    server can check them as it checks any send; MessageIllegalError naming the first bad entry.

    The bulk answer needs every half property named exactly once per entry and no DELAY anywhere (else the entry
    by entry definition decides, and refuses duplicates): the real queue checked here must be the one commit_raw
    takes and recovery reads, not another pair the entry also names."""
    buf = bytes(buffer)
    if run is None:
        run = scan(buf, 0, len(buf), verify_crc=False)
    n = len(run)
    plain = all(buf.count(name) == n for name in _HALF_NAMES) and _DELAY not in buf
    if n and run.end == len(buf) and not run.stop_reason and plain:
        arr = np.frombuffer(buf, np.uint8)
        everything = np.arange(n)
        fields_ok = (
            (run.queue_ids == 0).all()
            and not (run.sys_flags & SysFlag.TRANSACTION_MASK).any()
            and _matches(arr, run.topic_starts, run.topic_starts, run.topic_starts + run.topic_lengths,
                         HALF_TOPIC_BYTES).all()
            and (run.topic_lengths == len(HALF_TOPIC_BYTES)).all()
        )
        tail = f"{Prop.TRAN_MSG}\x01true\x02{Prop.PGROUP}\x01{producer_group}\x02{Prop.TRANSACTION_ID}\x01{txn_id}\x02"
        found = _locate(buf, arr, run, everything, tail.encode(), unique=False) if fields_ok else None
        if found is not None:
            return HalfCheck(n, queue_id_ranges((t.decode("utf-8", "replace"), q) for t, q, _ in found.queues))
    count = check_half_batch(buffer, producer_group, txn_id)
    real: list[tuple[str, int]] = []
    for i, props in enumerate(run.properties(buf)):
        topic, qid_text = property_of(props, Prop.REAL_TOPIC), property_of(props, Prop.REAL_QID)
        qid = real_queue_id(qid_text)
        if not topic or qid is None:
            raise MessageIllegalError(
                f"half entry {i}: REAL_TOPIC={shown(topic)} / REAL_QID={shown(qid_text)} name no queue (REAL_QID is "
                f"ASCII digits, below {MAX_QUEUE_ID})"
            )
        real.append((topic, qid))
    return HalfCheck(count, queue_id_ranges(real))


def _assemble(
    buf: bytes,
    arr: np.ndarray,
    run: EntryRun,
    idx: np.ndarray,
    half_cl: np.ndarray,
    qoffs: np.ndarray,
    key: np.ndarray,
    queues: list[tuple[bytes, int, int]],
    r_end: np.ndarray,
    tail: bytes,
) -> CommittedRun | None:
    """Each committed entry is five pieces: [header + body] and [props length + application properties] sliced
    from a copy of the run whose header and props-length fields were rewritten in place (numpy, all entries at
    once), then the real topic field, T and TRAN_PREPARED_QUEUE_OFFSET."""
    k = idx.size
    topics = [validate_topic(t.decode("ascii", "replace")) for t, _, _ in queues]  # as commit_raw: refuse bad ones
    topic_fields = [TOPIC_LEN.pack(len(t)) + t for t in topics]
    ps = run.props_starts[idx]
    r_start = r_end - np.array([n for _, _, n in queues], np.int64)[key]
    prepared = list(map(_PREPARED_FORMAT.__mod__, qoffs[idx].tolist()))
    props_len = (r_start - ps) + len(tail) + np.fromiter(map(len, prepared), np.int64, k)
    if (props_len > MAX_PROPERTIES_BYTES).any():
        return None  # commit_raw names the half
    body_len = run.body_lengths[idx]
    topic_len = np.array([len(t) for t in topics], np.int64)[key]
    pos = run.positions[idx]
    h = headers(arr, pos)  # a copy: the half's header fields, edited below
    h["total_size"] = BODY_START + body_len + 1 + topic_len + 2 + props_len
    h["magic"] = MESSAGE_MAGIC
    h["queue_id"] = np.array([q for _, q, _ in queues], np.int64)[key]
    h["queue_offset"] = 0
    h["physical_offset"] = 0
    h["sys_flag"] = (h["sys_flag"] & ~SysFlag.TRANSACTION_MASK) | SysFlag.TRANSACTION_COMMIT_TYPE
    h["store_timestamp"] = 0
    h["store_ip"] = b"\x00\x00\x00\x00"
    h["store_port"] = 0
    h["prepared_transaction_offset"] = half_cl[idx]
    edited = bytearray(buf)
    work = np.frombuffer(edited, np.uint8)
    put_rows(work, pos, h.view(np.uint8).reshape(k, BODY_START))
    put_rows(work, ps - 2, props_len.astype(">i2").view(np.uint8).reshape(k, 2))
    del work  # the bytearray is sliced below
    body_end = (pos + BODY_START + body_len).tolist()
    pieces: list[bytes | bytearray] = [tail] * (5 * k)  # per entry: [header + body][topic field][props][T][prepared]
    pieces[0::5] = [edited[a:b] for a, b in zip(pos.tolist(), body_end, strict=True)]
    pieces[1::5] = [topic_fields[i] for i in key.tolist()]
    pieces[2::5] = [edited[c:d] for c, d in zip((ps - 2).tolist(), r_start.tolist(), strict=True)]
    pieces[4::5] = prepared
    names = {(t.decode("ascii"), q) for t, (_, q, _) in zip(topics, queues, strict=True)}
    totals = h["total_size"].astype(np.int64)
    return CommittedRun(b"".join(pieces), k, frozenset(names), np.cumsum(totals) - totals)


__all__ = ["MAX_DISTINCT_PER_RUN", "CommittedRun", "HalfCheck", "HalfRun", "check_halves", "commit_halves"]
