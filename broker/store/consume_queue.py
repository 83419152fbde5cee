"""ConsumeQueue: one per (topic, queueId), a dense index of that queue's messages in the commit log.

Unit ``i`` (the message with queue offset ``i``) lies at global byte ``i * 20`` of the queue's files::

    0                8        12               20
    +----------------+--------+----------------+
    | COMMITLOG OFF  |  SIZE  | TAGS HASH CODE |
    +----------------+--------+----------------+

Files live in ``consumequeue/{topic}/{queueId}/`` and are named by their first byte's global offset. A unit
whose SIZE is 0 was never written (files are created full size and read as zeros where not yet written), which is
how recovery finds the end. Their disk blocks are reserved as units are written, not when the file is created
(mapped_file: ``reserve_as_written``): every queue has a file, and most queues hold far fewer units than a file.

Readers see units up to ``max_offset``; the dispatcher writes up to ``written_offset``. The two differ only while a
``VisibilityHold`` covers the queue, placed at some queue offset: readers see nothing from the lowest offset an
active hold was placed at. A batch-transaction commit holds every queue it re-stores into from where it starts, so
that its units, dispatched over many passes and queues, are all shown at the same instant when the hold is
released; a transaction writing in place holds each queue from its first entry there until its marker
(txn_visibility.py). Units in ``aborted`` ranges (entries of rolled-back transactions) are never shown: readers
skip them.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
import struct
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from broker.store.directory import fsync_directory
from broker.store.mapped_file import MappedFile, MappedFileQueue
from broker.store.store_config import CQ_UNIT_SIZE

log = logging.getLogger(__name__)

REPAIR_LOG_LINES = 5  # units named one by one per repair call; the rest are counted in one line

CQ_UNIT = struct.Struct(
    ">"
    "q"  # COMMITLOG OFFSET: where the message's entry starts in the commit log
    "i"  # SIZE: the entry's TOTALSIZE (0 = no unit here)
    "q"  # TAGS HASH CODE: Java String.hashCode of the TAGS property, 0 when the message has no tag
)
assert CQ_UNIT.size == CQ_UNIT_SIZE == 20, CQ_UNIT.size


class CqUnit(NamedTuple):
    commitlog_offset: int
    size: int
    tag_hash: int


# The same layout for numpy, derived from CQ_UNIT's format: a run of units decodes in one np.frombuffer.
_NUMPY_CODES = {"q": ">i8", "i": ">i4"}
CQ_DTYPE = np.dtype(
    [(name, _NUMPY_CODES[code]) for name, code in zip(("offset", "size", "tag"), CQ_UNIT.format[1:], strict=True)]
)
assert CQ_DTYPE.itemsize == CQ_UNIT.size and len(CQ_DTYPE.names or ()) == len(CqUnit._fields)


def data_ranges(fd: int, size: int) -> list[tuple[int, int]]:
    """[start, end) byte ranges of a file that may hold data, from SEEK_DATA / SEEK_HOLE (every range the file
    system cannot rule out: reserved blocks count as data); the whole file where it cannot say."""
    ranges: list[tuple[int, int]] = []
    pos = 0
    try:
        while pos < size:
            start = os.lseek(fd, pos, os.SEEK_DATA)
            pos = min(os.lseek(fd, start, os.SEEK_HOLE), size)
            if start < pos:
                ranges.append((start, pos))
    except OSError as e:
        if e.errno != errno.ENXIO:  # ENXIO: no data from pos on; anything else: the file system does not say
            return [(0, size)]
    return ranges


class VisibilityHold:
    """While active, the queues it was placed on show readers no unit from the offset it was placed at. Releasing
    it is one write to a cell the hold may share with others (``release_together``), so every queue they cover
    shows its new units at the same instant."""

    __slots__ = ("_cell", "queues")

    def __init__(self) -> None:
        self._cell = [True]
        self.queues: list[ConsumeQueue] = []

    @property
    def active(self) -> bool:
        return self._cell[0]

    @active.setter
    def active(self, value: bool) -> None:
        self._cell[0] = value

    @staticmethod
    def release_together(holds: list[VisibilityHold]) -> None:
        """Release ``holds`` at one instant: they first share one cell (each still active), then it flips."""
        cell = [True]
        for hold in holds:
            if hold.active:
                hold._cell = cell
        cell[0] = False


class ConsumeQueue:
    def __init__(
        self,
        root: str,
        topic: str,
        queue_id: int,
        file_size: int,
        sync: Callable[[int], None],
        sync_dir: Callable[[str], None] = fsync_directory,
        allocate: Callable[[int, int, int], None] = os.posix_fallocate,
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        directory = os.path.join(root, topic, str(queue_id))
        self.files = MappedFileQueue(directory, file_size, sync, allocate, sync_dir=sync_dir, reserve_as_written=True)
        self.min_offset = 0  # first valid queue offset (moves forward when the commit log expires)
        self._holds: tuple[tuple[VisibilityHold, int], ...] = ()  # (hold, the queue offset it hides from)
        # [start, end) queue-offset ranges of rolled-back transactions' entries, sorted, disjoint: readers skip
        # them (txn_visibility.py keeps them, here so that a read finds them without another lookup)
        self.aborted: list[tuple[int, int]] = []

    @property
    def written_offset(self) -> int:
        """One past the last unit written: the next queue offset this queue expects."""
        return self.files.max_offset // CQ_UNIT_SIZE

    @property
    def max_offset(self) -> int:
        """One past the last unit readers may see: written_offset, or the lowest offset an active hold hides
        from, whichever is lower."""
        written = self.files.max_offset // CQ_UNIT_SIZE
        for hold, at in self._holds:  # few: the commits and open transactions writing to this queue
            if hold.active and at < written:
                written = at
        return written

    def place_hold(self, hold: VisibilityHold, at: int | None = None) -> None:
        """Hide units from queue offset ``at`` (default: the next one written) until ``hold`` is released. ``at``
        must not be below what readers already see: a queue never shrinks under a reader."""
        self._holds = (*((h, a) for h, a in self._holds if h.active), (hold, self.written_offset if at is None else at))
        hold.queues.append(self)

    def held(self) -> list[tuple[VisibilityHold, int]]:
        """The active holds and the offsets they hide from (check())."""
        return [(h, a) for h, a in self._holds if h.active]

    def add_aborted(self, start: int, end: int) -> None:
        """Never show units [start, end) (a rolled-back transaction's entries); merged with touching ranges."""
        if start >= end:
            return
        ranges = self.aborted
        i = bisect.bisect_left(ranges, (start, start))
        if i > 0 and ranges[i - 1][1] >= start:
            i -= 1
            start = min(start, ranges[i][0])
        j = i
        while j < len(ranges) and ranges[j][0] <= end:
            end = max(end, ranges[j][1])
            j += 1
        self.aborted = [*ranges[:i], (start, end), *ranges[j:]]  # a new list: readers iterate the old one

    def aborted_mask(self, offset: int, count: int) -> np.ndarray | None:
        """For units [offset, offset + count): True where the unit is in an aborted range; None when none is
        (the common case, one comparison)."""
        ranges = self.aborted
        if not ranges or ranges[-1][1] <= offset:
            return None
        end = offset + count
        i = max(bisect.bisect_right(ranges, (offset, offset)) - 1, 0)
        mask: np.ndarray | None = None
        for start, stop in ranges[i:]:
            if start >= end:
                break
            if stop <= offset:
                continue
            if mask is None:
                mask = np.zeros(count, np.bool_)
            mask[max(start, offset) - offset : min(stop, end) - offset] = True
        return mask

    def aborted_end(self, queue_offset: int) -> int:
        """The end of the aborted range holding ``queue_offset``; ``queue_offset`` itself when none holds it."""
        ranges = self.aborted
        i = bisect.bisect_right(ranges, (queue_offset, 1 << 62)) - 1
        if i >= 0 and ranges[i][0] <= queue_offset < ranges[i][1]:
            return ranges[i][1]
        return queue_offset

    def is_aborted(self, queue_offset: int) -> bool:
        mask = self.aborted_mask(queue_offset, 1)
        return mask is not None and bool(mask[0])

    # ------------------------------------------------------------------------------------------------ load
    def load(self, commit_log_min: int, commit_log_end: int) -> None:
        """Open the files and find the end: the last written unit pointing inside the commit log.

        Tolerates an empty last file (apache/rocketmq issue 9728) and trailing files past the end.
        """
        self.files.load()
        end = self._find_end(commit_log_end)
        first = self.files.first()
        if first is None:
            return
        if end < first.file_from_offset:
            end = first.file_from_offset  # nothing valid at all: an empty queue starting at the first file
        old_max = self.files.last()
        if old_max is not None and end < old_max.file_from_offset + old_max.file_size:
            self._truncate_logged(end)
        self.correct_min_offset(commit_log_min)

    def _find_end(self, commit_log_end: int) -> int:
        """Global byte offset one past the last unit with SIZE > 0 whose entry ends within the commit log.

        Only the parts of a file that may hold data are read (data_ranges): a hole reads as zeros, units with
        SIZE 0, which never count; a queue's file reserved as written is mostly hole, and a broker with thousands
        of queues read gigabytes of zeros at every start."""
        for f in reversed(self.files.files):
            for start, end in reversed(data_ranges(f.fd, f.file_size)):
                first, last = start // CQ_UNIT_SIZE, -(-end // CQ_UNIT_SIZE)
                units = np.frombuffer(f.mm, CQ_DTYPE, count=last - first, offset=first * CQ_UNIT_SIZE)
                ok = np.flatnonzero((units["size"] > 0) & (units["offset"] + units["size"] <= commit_log_end))
                del units
                if ok.size:
                    return f.file_from_offset + (first + int(ok[-1]) + 1) * CQ_UNIT_SIZE
        return -1

    def _truncate_logged(self, end: int) -> None:
        last = self.files.last()
        assert last is not None
        # Only bytes that were really written are worth a warning: preallocated zeros are the normal end.
        f = self.files.find(end)
        dirty = False
        if f is not None:
            pos = end - f.file_from_offset
            # pread, not the mapping: the unit may lie in a hole, and a fault on a hole of a full tmpfs is SIGBUS
            # (its shared mappings take a page even to read one), where pread reads zeros
            dirty = os.pread(f.fd, CQ_UNIT_SIZE, pos).count(0) != CQ_UNIT_SIZE if pos < f.file_size else False
        if dirty:
            log.warning(
                "consume queue %s/%d: dropping units from %s at byte %d (past the commit log's end)",
                self.topic,
                self.queue_id,
                f.path if f else self.files.directory,
                end - (f.file_from_offset if f else 0),
            )
        self.files.truncate(end)

    def correct_min_offset(self, commit_log_min: int) -> None:
        """min_offset = first unit whose message is still in the commit log (RocketMQ's correctMinOffset).

        Files are searched oldest first, past any whose units all expired: after a restart the queue may still
        hold such files (cleanup deletes them later), and stopping at the first file's end gave a minimum whose
        messages were gone."""
        first = self.files.first()
        self.min_offset = (
            0 if first is None else self.first_readable(commit_log_min, first.file_from_offset // CQ_UNIT_SIZE)
        )

    def first_readable(self, commit_log_min: int, from_offset: int) -> int:
        """The first queue offset at or after ``from_offset`` whose unit names an entry at or past
        ``commit_log_min``; written_offset when there is none."""
        end_unit = self.written_offset
        per_file = self.files.file_size // CQ_UNIT_SIZE
        for f in self.files.files:
            file_start = f.file_from_offset // CQ_UNIT_SIZE
            start_unit = max(file_start, from_offset)
            n = min(end_unit, file_start + per_file) - start_unit
            if file_start + per_file <= from_offset:
                continue
            if n <= 0:
                break
            rel = (start_unit - file_start) * CQ_UNIT_SIZE
            head = CqUnit._make(CQ_UNIT.unpack_from(f.mm, rel))
            if head.size > 0 and head.commitlog_offset >= commit_log_min:  # the common case: no scan of the file
                return start_unit
            units = np.frombuffer(f.mm, CQ_DTYPE, count=n, offset=rel)
            idx = np.flatnonzero((units["size"] > 0) & (units["offset"] >= commit_log_min))
            del units
            if idx.size:
                return start_unit + int(idx[0])
        return end_unit

    # ------------------------------------------------------------------------------------------------ write
    def put_units(self, queue_offset: int, units: bytes) -> None:
        """Write consecutive units starting at ``queue_offset``, splitting across file boundaries."""
        assert len(units) % CQ_UNIT_SIZE == 0
        pos = queue_offset * CQ_UNIT_SIZE
        data = memoryview(units)
        while data:
            f = self._file_for_write(pos)
            rel = pos - f.file_from_offset
            n = min(len(data), f.file_size - rel)
            f.write_at(rel, data[:n])
            data = data[n:]
            pos += n

    def repair_units(self, queue_offsets: np.ndarray, units: np.ndarray) -> int:
        """Compare units this queue already has with the same units computed again from the commit log (a
        re-dispatch after an abnormal restart) and rewrite those that differ; return how many were.

        Why: a power loss can keep a later page of a consume-queue file and lose an earlier one, so a queue can
        come back with empty (or stale) units below its end. A re-dispatch that skipped every unit below the end
        would leave the hole for readers and ``check()`` to find."""
        assert queue_offsets.shape == units.shape and units.dtype == CQ_DTYPE, (queue_offsets.shape, units.dtype)
        fixed = 0
        pos = queue_offsets.astype(np.int64) * CQ_UNIT_SIZE
        for f in self.files.files:
            inside = (pos >= f.file_from_offset) & (pos < f.file_from_offset + f.wrote_position)
            if not inside.any():
                continue
            rel, want = pos[inside] - f.file_from_offset, units[inside]
            view = np.frombuffer(f.mm, CQ_DTYPE)
            stored = view[rel // CQ_UNIT_SIZE]  # a copy: the view is released before anything can close the file
            del view
            for i in np.flatnonzero(stored != want).tolist():
                if fixed < REPAIR_LOG_LINES:
                    log.warning(
                        "consume queue %s/%d: unit %d (%s byte %d) was %s, the commit log says %s; rewritten",
                        self.topic, self.queue_id, int(pos[inside][i]) // CQ_UNIT_SIZE, f.path, int(rel[i]),
                        CqUnit(*stored[i].tolist()), CqUnit(*want[i].tolist()),
                    )
                f.write_at(int(rel[i]), want[i].tobytes())
                fixed += 1
        if fixed > REPAIR_LOG_LINES:  # a whole page lost is hundreds of units: one line for the rest
            log.warning("consume queue %s/%d: %d units rewritten in all", self.topic, self.queue_id, fixed)
        return fixed

    def _file_for_write(self, pos: int) -> MappedFile:
        last = self.files.last()
        if last is None:
            # an empty queue starting past 0 (after expiry or a gap): its first file starts mid-way
            f = self.files.create(pos - pos % self.files.file_size)
            f.set_positions(pos - f.file_from_offset)
            self.min_offset = pos // CQ_UNIT_SIZE
            return f
        while pos >= last.file_from_offset + last.file_size:
            last = self.files.create(last.file_from_offset + last.file_size)
        found = self.files.find(pos)
        assert found is not None, (self.topic, self.queue_id, pos)
        return found

    def flush(self) -> None:
        self.files.flush()

    # ------------------------------------------------------------------------------------------------ read
    def read_units(self, queue_offset: int, count: int) -> bytes | None:
        """Up to ``count`` units from ``queue_offset`` within one file; None if that file is gone."""
        pos = queue_offset * CQ_UNIT_SIZE
        f = self.files.find(pos)
        if f is None:
            return None
        rel = pos - f.file_from_offset
        end = min(f.wrote_position, rel + count * CQ_UNIT_SIZE)
        try:
            return f.read(rel, max(0, end - rel))
        except ValueError:  # closed by expiry between find() and read()
            return None

    def unit(self, queue_offset: int) -> CqUnit | None:
        raw = self.read_units(queue_offset, 1)
        if not raw:
            return None
        return CqUnit._make(CQ_UNIT.unpack(raw))

    def roll_next_file(self, queue_offset: int) -> int:
        """The first queue offset of the file after the one holding ``queue_offset``."""
        per_file = self.files.file_size // CQ_UNIT_SIZE
        return queue_offset + per_file - queue_offset % per_file

    # ------------------------------------------------------------------------------------------------ expiry
    def delete_expired(self, commit_log_min: int) -> int:
        """Delete files whose every unit points below ``commit_log_min`` (never the last file)."""
        doomed = 0
        files = self.files.files
        for f in files[:-1]:
            last_unit = CqUnit._make(CQ_UNIT.unpack_from(f.mm, f.file_size - CQ_UNIT_SIZE))
            if last_unit.size > 0 and last_unit.commitlog_offset + last_unit.size <= commit_log_min:
                doomed += 1
            else:
                break
        if doomed:
            self.files.delete_first(doomed)
        self.correct_min_offset(commit_log_min)
        return doomed

    def close(self) -> None:
        self.files.close()

    def destroy(self) -> None:
        self.files.destroy()
        try:
            os.rmdir(self.files.directory)
        except OSError:
            pass
