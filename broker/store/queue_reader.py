"""QueueReader: the body of get_message: a run of a consume queue's units turned into raw commit-log bytes.

Three ways through, same answers (tested against each other): a struct-unpack fast path for a few units whose
entries are one contiguous run (the common pull), a scalar loop for a few units with filters or gaps, and numpy
for many units, or for any read that meets a rolled-back transaction's units (ConsumeQueue.aborted), which it
skips as it skips units another tag filters out. Entries contiguous in one commit-log file are returned as one
slice of it.
"""

from __future__ import annotations

import functools
import itertools
import struct
from collections.abc import Callable

import numpy as np

from broker.format.message import StoredMessage, decode_entry
from broker.store.commit_log import CommitLog
from broker.store.consume_queue import CQ_DTYPE, CQ_UNIT, ConsumeQueue
from broker.store.store_results import GetResult, GetStatus

# Gets of at most this many units decode them with struct instead of numpy: below it numpy's fixed cost per call
# is larger than the per-unit work (measured on the 2-core test machine).
SCALAR_GET_UNITS = 64


@functools.lru_cache(maxsize=SCALAR_GET_UNITS + 1)
def _unit_offsets(n: int) -> struct.Struct:
    """COMMITLOG OFFSET of ``n`` consecutive consume-queue units in one unpack (derived from CQ_UNIT's layout)."""
    assert CQ_UNIT.format.lstrip(">") == "qiq"
    return struct.Struct(">" + "q12x" * n)


@functools.lru_cache(maxsize=SCALAR_GET_UNITS + 1)
def _unit_sizes(n: int) -> struct.Struct:
    """SIZE of ``n`` consecutive consume-queue units in one unpack."""
    return struct.Struct(">" + "8xi8x" * n)


class QueueReader:
    def __init__(self, commit_log: CommitLog, file_size: int, counters: dict[str, int]) -> None:
        self.commit_log = commit_log
        self.file_size = file_size
        self._counters = counters

    def read(
        self,
        cq: ConsumeQueue,
        offset: int,
        max_msgs: int,
        limit_bytes: int,
        tag_codes: set[int] | None,
        message_filter: Callable[[StoredMessage], bool] | None,
        lo: int,
        hi: int,
    ) -> GetResult:
        args = (cq, offset, max_msgs, limit_bytes, tag_codes, message_filter, lo, hi)
        result = self._read(*args)
        if result.status is GetStatus.MESSAGE_WAS_REMOVING:
            # A commit-log file expired between the units' check and the entries' read: once more, where the
            # expired-prefix check sees what is gone (OFFSET_TOO_SMALL) instead of a silent skip.
            result = self._read(*args)
        return result

    def _read(
        self,
        cq: ConsumeQueue,
        offset: int,
        max_msgs: int,
        limit_bytes: int,
        tag_codes: set[int] | None,
        message_filter: Callable[[StoredMessage], bool] | None,
        lo: int,
        hi: int,
    ) -> GetResult:
        raw = cq.read_units(offset, min(max_msgs, hi - offset))
        if not raw:
            return GetResult(GetStatus.OFFSET_FOUND_NULL, cq.roll_next_file(offset), lo, hi)
        expired = self._expired_prefix(raw)
        if expired == len(raw) // CQ_UNIT.size:  # all of them: the answer names the first readable offset
            try:
                expired = min(cq.first_readable(self.commit_log.min_offset, offset), hi) - offset
            except ValueError:  # a file closed under this read (expiry, topic deletion): what was read stands
                pass
        if expired:
            # Units whose entries expired with their commit-log file, read before cleanup moved the queue's
            # minimum past them: answered as that move will be (OFFSET_TOO_SMALL, the first unit still readable),
            # never skipped inside a FOUND answer, so a reader that must not lose data (a Spark source with
            # failOnDataLoss) sees the loss. Expiry removes the oldest files, so expired units are a prefix.
            return GetResult(GetStatus.OFFSET_TOO_SMALL, offset + expired, offset + expired, hi)
        aborted = cq.aborted_mask(offset, len(raw) // CQ_UNIT.size)  # rolled-back transactions' entries: skipped
        if message_filter is None and aborted is None and len(raw) <= SCALAR_GET_UNITS * CQ_UNIT.size:
            return self._read_scalar(raw, offset, limit_bytes, tag_codes, lo, hi)
        units = np.frombuffer(raw, CQ_DTYPE)
        phys = units["offset"].astype(np.int64)
        sizes = units["size"].astype(np.int64)
        usable = (sizes > 0) & (phys >= self.commit_log.min_offset)
        removing = not usable.all()
        if aborted is not None:
            usable &= ~aborted
        if tag_codes:
            usable &= np.isin(units["tag"], np.fromiter(tag_codes, np.int64, len(tag_codes)))
        cand = np.flatnonzero(usable)
        if message_filter is not None:
            return self._read_filtered(cq, offset, units.size, cand, phys, sizes, limit_bytes, message_filter, lo, hi)
        if cand.size == 0:
            status = GetStatus.MESSAGE_WAS_REMOVING if removing else GetStatus.NO_MATCHED_MESSAGE
            after = offset + units.size
            if aborted is not None and aborted[-1]:  # past the whole rolled-back range in one answer
                after = max(after, min(cq.aborted_end(after - 1), hi))
            return GetResult(status, after, lo, hi)
        csum = np.cumsum(sizes[cand])
        take = max(1, int(np.searchsorted(csum, limit_bytes, side="right")))
        consumed = units.size if take == cand.size else int(cand[take])  # stop before the first unit not taken
        cand = cand[:take]
        p, s = phys[cand], sizes[cand]
        buf = self._read_entries(p, s)
        if buf is None:
            return GetResult(GetStatus.MESSAGE_WAS_REMOVING, offset + consumed, lo, hi)
        positions = np.concatenate(([0], np.cumsum(s)[:-1]))
        self._counters["get_msgs"] += int(cand.size)
        self._counters["get_bytes"] += len(buf)
        return GetResult(GetStatus.FOUND, offset + consumed, lo, hi, buf, positions.tolist(), (cand + offset).tolist())

    def _expired_prefix(self, raw: bytes) -> int:
        """How many units at the start of ``raw`` come before the first live one, when at least one of them names
        an entry below the commit log's first offset (expired); else 0. Empty units (SIZE 0: never written, or
        torn) name no entry: they neither count as expired nor end the prefix, so a hole cannot hide an expired
        range behind it."""
        cl_min = self.commit_log.min_offset
        phys, size, _ = CQ_UNIT.unpack_from(raw, 0)
        if phys >= cl_min and size > 0:  # the common case: the first unit is live, one unpack
            return 0
        units = np.frombuffer(raw, CQ_DTYPE)
        empty = units["size"] <= 0
        expired = ~empty & (units["offset"] < cl_min)
        live = ~empty & ~expired
        prefix = int(np.argmax(live)) if bool(live.any()) else int(units.size)
        return prefix if bool(expired[:prefix].any()) else 0

    def _read_scalar(
        self, raw: bytes, offset: int, limit_bytes: int, tag_codes: set[int] | None, lo: int, hi: int
    ) -> GetResult:
        """The same as the numpy path for a few units, where numpy's per-call cost would dominate."""
        cl_min = self.commit_log.min_offset
        file_size = self.file_size
        n = len(raw) // CQ_UNIT.size
        if not tag_codes:
            # The common case, with no Python loop: every unit valid and their entries one contiguous run.
            offs, sizes = _unit_offsets(n).unpack(raw), _unit_sizes(n).unpack(raw)
            first, end = offs[0], offs[-1] + sizes[-1]
            total = end - first
            if (
                first >= cl_min
                and min(sizes) > 0
                and sum(sizes) == total
                and total <= limit_bytes
                and first // file_size == (end - 1) // file_size
            ):
                buf = self.commit_log.read(first, total)
                if buf is not None:
                    self._counters["get_msgs"] += n
                    self._counters["get_bytes"] += total
                    starts = list(itertools.accumulate(sizes[:-1], initial=0))
                    return GetResult(GetStatus.FOUND, offset + n, lo, hi, buf, starts, list(range(offset, offset + n)))
        positions: list[int] = []
        qoffs: list[int] = []
        runs: list[tuple[int, int]] = []  # [start, end) ranges contiguous in one commit-log file
        total = 0
        removing = False
        consumed = len(raw) // CQ_UNIT.size
        run_start = run_end = -1
        for i, (phys, size, tag) in enumerate(CQ_UNIT.iter_unpack(raw)):
            if size <= 0 or phys < cl_min:
                removing = True
                continue
            if tag_codes and tag not in tag_codes:
                continue
            if positions and total + size > limit_bytes:
                consumed = i
                break
            positions.append(total)
            qoffs.append(offset + i)
            total += size
            if phys == run_end and phys // file_size == run_start // file_size:
                run_end += size
            else:
                if run_end >= 0:
                    runs.append((run_start, run_end))
                run_start, run_end = phys, phys + size
        if not positions:
            status = GetStatus.MESSAGE_WAS_REMOVING if removing else GetStatus.NO_MATCHED_MESSAGE
            return GetResult(status, offset + consumed, lo, hi)
        runs.append((run_start, run_end))
        parts = [self.commit_log.read(a, b - a) for a, b in runs]
        if any(p is None for p in parts):
            return GetResult(GetStatus.MESSAGE_WAS_REMOVING, offset + consumed, lo, hi)
        buf = parts[0] if len(parts) == 1 else b"".join(parts)  # type: ignore[arg-type]
        assert buf is not None and len(buf) == total
        self._counters["get_msgs"] += len(positions)
        self._counters["get_bytes"] += total
        return GetResult(GetStatus.FOUND, offset + consumed, lo, hi, buf, positions, qoffs)

    def _read_entries(self, phys: np.ndarray, sizes: np.ndarray) -> bytes | None:
        """The entries' bytes: one slice when they are contiguous in one file, else one slice per run."""
        file_size = self.file_size
        first, last_end = int(phys[0]), int(phys[-1] + sizes[-1])
        contiguous = phys.size == 1 or bool(np.all(phys[1:] == phys[:-1] + sizes[:-1]))
        if contiguous and first // file_size == (last_end - 1) // file_size:
            return self.commit_log.read(first, last_end - first)
        breaks = np.flatnonzero(
            (phys[1:] != phys[:-1] + sizes[:-1]) | (phys[1:] // file_size != phys[:-1] // file_size)
        )
        starts = np.concatenate(([0], breaks + 1)).tolist()
        ends = np.concatenate((breaks + 1, [phys.size])).tolist()
        parts = []
        for a, b in zip(starts, ends, strict=True):
            chunk = self.commit_log.read(int(phys[a]), int(phys[b - 1] + sizes[b - 1] - phys[a]))
            if chunk is None:
                return None
            parts.append(chunk)
        return b"".join(parts)

    def _read_filtered(
        self,
        cq: ConsumeQueue,
        offset: int,
        n_units: int,
        cand: np.ndarray,
        phys: np.ndarray,
        sizes: np.ndarray,
        limit_bytes: int,
        message_filter: Callable[[StoredMessage], bool],
        lo: int,
        hi: int,
    ) -> GetResult:
        parts: list[bytes] = []
        positions: list[int] = []
        qoffs: list[int] = []
        total = 0
        consumed = n_units
        removing = False
        for i in cand.tolist():
            if parts and total + int(sizes[i]) > limit_bytes:
                consumed = i
                break
            raw = self.commit_log.read(int(phys[i]), int(sizes[i]))
            if raw is None:
                removing = True
                continue
            if not message_filter(decode_entry(raw)):
                continue
            positions.append(total)
            parts.append(raw)
            qoffs.append(offset + i)
            total += len(raw)
        if not parts:
            status = GetStatus.MESSAGE_WAS_REMOVING if removing else GetStatus.NO_MATCHED_MESSAGE
            return GetResult(status, offset + consumed, lo, hi)
        self._counters["get_msgs"] += len(parts)
        self._counters["get_bytes"] += total
        return GetResult(GetStatus.FOUND, offset + consumed, lo, hi, b"".join(parts), positions, qoffs)
