"""IndexFile: a hash index from message keys to commit-log offsets; IndexService: the directory of them.

One file (named by its creation time, ``yyyyMMddHHmmssSSS``) is a 40-byte header, ``slots`` 4-byte hash slots and
``entries`` 20-byte entries::

    header (40 B)
    0                8                16               24               32       36       40
    +----------------+----------------+----------------+----------------+--------+--------+
    | BEGIN TIMESTAMP| END TIMESTAMP  | BEGIN PHY OFF  | END PHY OFF    | SLOTS  | COUNT  |
    +----------------+----------------+----------------+----------------+--------+--------+
    slot (4 B): number of the newest entry whose key falls in this slot (0 = empty)
    entry (20 B)
    0        4                12       16       20
    +--------+----------------+--------+--------+
    |KEY HASH|  COMMITLOG OFF |TIME DIF|PREV ENT|
    +--------+----------------+--------+--------+

Entry ``i`` lies at ``40 + slots*4 + i*20``; entry numbers start at 1 (COUNT starts at 1) so that 0 means "none".
KEY HASH is ``abs(String.hashCode(topic + "#" + key))``, TIME DIF seconds since BEGIN TIMESTAMP, PREV ENT the
previous entry in the same slot (a chain walked newest first). Hash collisions are expected: lookups return
candidates and the store checks each candidate's real key.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from broker.errors import CorruptionError
from broker.store.directory import fsync_directory, make_dirs
from broker.store.message import java_string_hash
from broker.store.numbers import is_ascii_digits

log = logging.getLogger(__name__)

INDEX_HEADER = struct.Struct(
    ">"
    "q"  # BEGIN TIMESTAMP: store time of the first indexed message (ms)
    "q"  # END TIMESTAMP: store time of the last indexed message (ms)
    "q"  # BEGIN PHY OFFSET: commit-log offset of the first indexed message
    "q"  # END PHY OFFSET: commit-log offset of the last message whose keys are all indexed
    "i"  # SLOTS: hash slot count (RocketMQ writes the used-slot count here; Sluice the capacity, for checking)
    "i"  # COUNT: next entry number; starts at 1
)
assert INDEX_HEADER.size == 40, INDEX_HEADER.size

INDEX_SLOT = struct.Struct(
    ">i"  # newest entry number in this slot, 0 when empty
)
assert INDEX_SLOT.size == 4

INDEX_ENTRY = struct.Struct(
    ">"
    "i"  # KEY HASH: abs(String.hashCode("topic#key"))
    "q"  # COMMITLOG OFFSET of the message
    "i"  # TIME DIF: seconds from BEGIN TIMESTAMP to the message's store time
    "i"  # PREV ENTRY: the previous entry number in the same slot, 0 = end of chain
)
assert INDEX_ENTRY.size == 20


class IndexHeader(NamedTuple):
    begin_timestamp: int
    end_timestamp: int
    begin_phy_offset: int
    end_phy_offset: int
    slot_count: int
    index_count: int


class IndexSlot(NamedTuple):
    newest_entry: int


class IndexEntry(NamedTuple):
    key_hash: int
    commitlog_offset: int
    time_diff_s: int
    prev_index: int


def key_hash(key: str) -> int:
    """abs(Java hashCode), with Integer.MIN_VALUE mapped to 0 as RocketMQ does."""
    h = java_string_hash(key)
    return abs(h) if h != -(1 << 31) else 0


def index_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"


def file_size(slots: int, entries: int) -> int:
    return INDEX_HEADER.size + slots * INDEX_SLOT.size + entries * INDEX_ENTRY.size


def _never_written(path: str) -> bool:
    """Whether an index file holds no header yet (all zero: the process died before its first header write)."""
    with open(path, "rb") as f:
        return not any(f.read(INDEX_HEADER.size))


class IndexFile:
    def __init__(self, path: str, slots: int, entries: int, sync: Callable[[int], None], *, create: bool) -> None:
        self.path = path
        self.slots = slots
        self.entries = entries
        self.size = file_size(slots, entries)
        self._sync = sync
        self.fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o644)
        if create:
            try:
                os.posix_fallocate(self.fd, 0, self.size)
            except OSError:  # ENOSPC: leave no empty file behind (the next start would refuse it) and no open fd
                os.close(self.fd)
                os.unlink(path)
                raise
        actual = os.fstat(self.fd).st_size
        if actual != self.size:
            os.close(self.fd)
            raise CorruptionError(
                f"index file is {actual} bytes, expected {self.size} for {slots} slots and {entries} entries: "
                "start with the max_hash_slot_num / max_index_num it was written with, or move the index folder "
                "away (key queries then find only messages stored after)",
                path,
                0,
            )
        self.mm = mmap.mmap(self.fd, self.size)
        self.header = IndexHeader._make(INDEX_HEADER.unpack_from(self.mm, 0))
        if create or self.header.index_count < 1:
            self.header = IndexHeader(0, 0, 0, 0, slots, 1)
            INDEX_HEADER.pack_into(self.mm, 0, *self.header)
        self._entries_at = INDEX_HEADER.size + slots * INDEX_SLOT.size
        self.closed = False

    @property
    def is_full(self) -> bool:
        return self.header.index_count >= self.entries

    def entry(self, number: int) -> IndexEntry:
        return IndexEntry._make(INDEX_ENTRY.unpack_from(self.mm, self._entries_at + number * INDEX_ENTRY.size))

    def slot(self, slot: int) -> int:
        return IndexSlot._make(INDEX_SLOT.unpack_from(self.mm, INDEX_HEADER.size + slot * INDEX_SLOT.size)).newest_entry

    def put_message(self, hashes: list[int], phys: int, store_ts: int) -> None:
        """Index one message under every hash; the caller made sure there is room for all of them."""
        h = self.header
        begin_ts = h.begin_timestamp or store_ts
        begin_phy = h.begin_phy_offset if h.index_count > 1 else phys
        count = h.index_count
        diff = max(0, (store_ts - begin_ts) // 1000)
        mm = self.mm
        for kh in hashes:
            slot_at = INDEX_HEADER.size + (kh % self.slots) * INDEX_SLOT.size
            prev = INDEX_SLOT.unpack_from(mm, slot_at)[0]
            if prev <= 0 or prev >= count:
                prev = 0  # empty, or stale from a torn write: start a new chain
            INDEX_ENTRY.pack_into(mm, self._entries_at + count * INDEX_ENTRY.size, kh, phys, diff, prev)
            INDEX_SLOT.pack_into(mm, slot_at, count)
            count += 1
            # the count goes to disk after each entry so a crash never leaves a slot pointing past it
            struct.pack_into(">i", mm, 36, count)
        self.header = IndexHeader(begin_ts, store_ts, begin_phy, phys, self.slots, count)
        INDEX_HEADER.pack_into(mm, 0, *self.header)

    def lookup(self, kh: int, begin_ms: int, end_ms: int, limit: int) -> list[int]:
        """Commit-log offsets of entries with this hash that may be stored within [begin_ms, end_ms], newest
        first. TIME DIF is truncated to whole seconds, so an entry's store time is in [ts, ts + 999]: it may match
        when that interval meets the range (the caller checks the exact time on the message). The chain runs
        newest first, so the walk stops at the first entry older than the range."""
        found: list[int] = []
        count = self.header.index_count
        number = self.slot(kh % self.slots)
        steps = 0
        while 0 < number < count and len(found) < limit and steps < count:
            e = self.entry(number)
            ts = self.header.begin_timestamp + e.time_diff_s * 1000
            if ts + 999 < begin_ms:
                break
            if e.key_hash == kh and ts <= end_ms:
                found.append(e.commitlog_offset)
            if e.prev_index >= number:  # chains go strictly backwards; anything else is damage
                break
            number = e.prev_index
            steps += 1
        return found

    def flush(self) -> None:
        self._sync(self.fd)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.mm.close()
            except BufferError:
                log.debug("index mmap of %s still exported", self.path)
            os.close(self.fd)

    def destroy(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _timestamp_name(ms: int) -> str:
    t = time.localtime(ms / 1000)
    return time.strftime("%Y%m%d%H%M%S", t) + f"{ms % 1000:03d}"


class IndexService:
    """All index files, oldest first; the dispatcher appends, queries read newest first."""

    def __init__(
        self,
        directory: str,
        slots: int,
        entries: int,
        sync: Callable[[int], None],
        sync_dir: Callable[[str], None] = fsync_directory,
    ) -> None:
        self.directory = directory
        self.slots = slots
        self.entries = entries
        self._sync = sync
        self._sync_dir = sync_dir
        self.files: list[IndexFile] = []
        self.lock = threading.RLock()
        # directories with new entries, fsynced by the next flush (directory.py says why); guarded by ``lock``
        self._unsynced_dirs = make_dirs(directory)

    def load(self) -> None:
        names = sorted(n for n in os.listdir(self.directory) if is_ascii_digits(n))
        if names:
            last = os.path.join(self.directory, names[-1])
            want = file_size(self.slots, self.entries)
            if os.path.getsize(last) < want and _never_written(last):
                # Created but not yet preallocated when the process died. One with a header was written with
                # other sizes (max_hash_slot_num / max_index_num changed): IndexFile refuses it, naming them;
                # extended, it would be read with the wrong layout.
                log.warning("index %s is %d bytes, expected %d: extending it", last, os.path.getsize(last), want)
                fd = os.open(last, os.O_RDWR)
                try:
                    os.posix_fallocate(fd, 0, want)
                finally:
                    os.close(fd)
        self.files = [
            IndexFile(os.path.join(self.directory, n), self.slots, self.entries, self._sync, create=False)
            for n in names
        ]

    @property
    def indexed_until(self) -> int:
        """Messages at commit-log offsets below or at this are already indexed (-1: nothing is)."""
        for f in reversed(self.files):
            if f.header.index_count > 1:
                return f.header.end_phy_offset
        return -1

    def _writable(self, needed: int) -> IndexFile:
        last = self.files[-1] if self.files else None
        if last is not None and last.header.index_count + needed <= last.entries:
            return last
        f = IndexFile(self._next_path(), self.slots, self.entries, self._sync, create=True)
        if self.directory not in self._unsynced_dirs:
            self._unsynced_dirs.append(self.directory)
        if last is not None:
            last.flush()  # a full file is final: make it durable before moving on
        self.files = [*self.files, f]
        return f

    def _next_path(self) -> str:
        """A name for a new index file: the local time in ms, as RocketMQ names them, but always after every
        existing name. Files are ordered by name when loaded, so a clock that stepped back (NTP, a DST change of
        the local time) must not put the newest file first; then the last name plus one is used instead (still
        17 digits, though perhaps no real time)."""
        name = _timestamp_name(time.time_ns() // 1_000_000)
        if self.files:  # loaded in name order: the last one has the greatest name
            last = int(os.path.basename(self.files[-1].path))
            if int(name) <= last:
                name = str(last + 1)
        return os.path.join(self.directory, name)

    def put(self, topic: str, keys: Iterable[str], phys: int, store_ts: int) -> None:
        """Index one message under ``topic#key`` for every key (idempotent for already indexed offsets)."""
        if phys <= self.indexed_until:
            return
        # Distinct hashes, in key order: a repeated key is one entry (check() counts distinct keys), and the cut
        # below must not push a distinct key out for a repeated one.
        hashes = list(dict.fromkeys(key_hash(index_key(topic, k)) for k in keys if k))
        if not hashes:
            return
        hashes = hashes[: self.entries - 2]  # a message with absurdly many keys must still fit one file
        with self.lock:
            self._writable(len(hashes)).put_message(hashes, phys, store_ts)

    def lookup(self, topic: str, key: str, limit: int, begin_ms: int, end_ms: int) -> list[int]:
        """Commit-log offsets whose key hash matches and that may be stored in the range, newest first: at most
        ``limit`` in all, however many files the time range spans. Some may be other keys of the same hash or
        stored just after ``end_ms`` (whole seconds here): the caller checks each on the message."""
        kh = key_hash(index_key(topic, key))
        found: list[int] = []
        seen: set[int] = set()
        with self.lock:
            for f in reversed(self.files):
                h = f.header
                if h.index_count <= 1 or h.end_timestamp < begin_ms or h.begin_timestamp > end_ms + 999:
                    continue
                for off in f.lookup(kh, begin_ms, end_ms, limit - len(found)):
                    if off not in seen:
                        seen.add(off)
                        found.append(off)
                if len(found) >= limit:
                    break
        return found

    def flush(self) -> None:
        with self.lock:
            while self._unsynced_dirs:  # each taken off only once synced: a failed one is tried again next time
                self._sync_dir(self._unsynced_dirs[0])
                del self._unsynced_dirs[0]
            for f in self.files:
                f.flush()

    def delete_before(self, commit_log_min: int) -> int:
        """Delete index files all of whose messages are below the commit log's first offset (never the last)."""
        with self.lock:
            doomed = [f for f in self.files[:-1] if f.header.end_phy_offset < commit_log_min]
            for f in doomed:
                f.destroy()
            self.files = [f for f in self.files if f not in doomed]
            return len(doomed)

    def drop_from(self, phys: int) -> int:
        """Delete index files holding entries at or past ``phys``; return where re-indexing must start (-1: none)."""
        start = -1
        with self.lock:
            while self.files and (
                self.files[-1].header.index_count <= 1 or self.files[-1].header.end_phy_offset >= phys
            ):
                f = self.files.pop()
                if f.header.index_count > 1:
                    start = f.header.begin_phy_offset
                    log.warning("index %s has entries at or past commit-log offset %d; rebuilding it", f.path, phys)
                # else an empty file (a crash right after creating it): dropped too, or the files before it,
                # which may hold entries past ``phys``, would never be looked at
                f.destroy()
        return start

    def close(self) -> None:
        with self.lock:
            for f in self.files:
                f.close()
