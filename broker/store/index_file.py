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

The dispatcher indexes a whole run of messages at once (``IndexService.put_many``): every message a producer
sends carries a UNIQ_KEY, so a run of 1,000 messages is 1,000 entries. Entry by entry in Python that cost about
10 us a message (the 31-polynomial hash over ~45 characters, four struct calls), on the broker thread that also
answers sends. ``key_hashes`` computes the polynomial of all keys of one length as one matrix product, and
``IndexFile.put_entries`` writes a run's entries, then its count, then its slots, so that a crash at any point
leaves no slot pointing at an entry past the count (the entries written and not linked are indexed again by the
re-dispatch that follows recovery, since the header's END PHY OFFSET moves last).
"""

from __future__ import annotations

import functools
import logging
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

import numpy as np

from broker.errors import CorruptionError
from broker.format.message import java_string_hash
from broker.format.numbers import is_ascii_digits
from broker.store.directory import fsync_directory, make_dirs
from broker.store.mapped_file import unlink_if_present, unmap

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


def _ints(values: np.ndarray | list[int]) -> list[int]:
    return values if isinstance(values, list) else values.tolist()


def index_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"


VECTOR_MIN_KEYS = 16  # keys of one length hashed in numpy from this many (below, the per-key loop is faster)
ENTRY_DTYPE = np.dtype([("key_hash", ">i4"), ("commitlog_offset", ">i8"), ("time_diff_s", ">i4"), ("prev", ">i4")])
assert ENTRY_DTYPE.itemsize == INDEX_ENTRY.size


def key_hashes(keys: list[str]) -> np.ndarray:
    """``key_hash`` of every key, as int64. ASCII keys of one length (the UNIQ_KEYs of one topic are) in one matrix
    product: each key's bytes times the powers of 31 (mod 2**32) at their places, summed in uint64 and cut to 32
    bits, which is Java's wrapping int arithmetic. Others one at a time."""
    if len(keys) >= VECTOR_MIN_KEYS:
        length = len(keys[0])
        joined = "".join(keys)
        if len(joined) == length * len(keys) and joined.isascii() and min(map(len, keys)) == length:
            return _same_length_hashes(joined.encode("ascii"), len(keys), length)
    out = np.empty(len(keys), np.int64)
    by_length: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        if key.isascii():
            by_length.setdefault(len(key), []).append(i)
        else:
            out[i] = key_hash(key)
    for length, where in by_length.items():
        if len(where) < VECTOR_MIN_KEYS:
            out[where] = [key_hash(keys[i]) for i in where]
        else:
            out[where] = _same_length_hashes("".join([keys[i] for i in where]).encode("ascii"), len(where), length)
    return out


def prefixed_key_hashes(prefixes: list[str], which: np.ndarray, chars: np.ndarray) -> np.ndarray:
    """``key_hash(prefixes[which[i]] + chars[i] as text)`` for every row ``i`` of ``chars`` ((n, L) uint8, printable
    ASCII: one UTF-16 unit a byte), as int64, without making the n strings: Java's hash of a concatenation is the
    first part's hash times 31**L plus the second's (mod 2**32), so each prefix ("topic#") is hashed once and the
    rows in one matrix product. How the dispatcher indexes a producer's UNIQ_KEYs (dispatcher.py)."""
    length = chars.shape[1]
    heads = np.array([java_string_hash(x) & 0xFFFFFFFF for x in prefixes], np.uint64)[which]
    tails = chars.astype(np.uint64) @ _powers_of_31(length) if length else np.zeros(len(chars), np.uint64)
    # uint64 arithmetic wraps mod 2**64, which keeps the value mod 2**32 that Java's int arithmetic keeps
    h = (heads * np.uint64(pow(31, length, 1 << 32)) + tails).astype(np.uint32).view(np.int32).astype(np.int64)
    return np.where(h == -(1 << 31), 0, np.abs(h))


def _same_length_hashes(joined: bytes, count: int, length: int) -> np.ndarray:
    """``key_hash`` of ``count`` ASCII keys of ``length`` characters, back to back in ``joined``. A character is
    below 2**7 and a power of 31 mod 2**32 below 2**32, so a product is below 2**39 and a key's sum fits uint64
    up to 2**25 characters (keys are far shorter: they live in a message's properties)."""
    if length == 0:
        return np.zeros(count, np.int64)
    chars = np.frombuffer(joined, np.uint8).reshape(count, length).astype(np.uint64)
    h = (chars @ _powers_of_31(length)).astype(np.uint32).view(np.int32).astype(np.int64)
    return np.where(h == -(1 << 31), 0, np.abs(h))


@functools.lru_cache(maxsize=64)
def _powers_of_31(length: int) -> np.ndarray:
    """31**(length-1), ..., 31, 1 mod 2**32: the weight of each place of a key of ``length`` characters."""
    powers = [1] * length
    for i in range(length - 2, -1, -1):
        powers[i] = powers[i + 1] * 31 & 0xFFFFFFFF
    return np.array(powers, np.uint64)


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

    def put_entries(self, hashes: np.ndarray | list[int], phys: np.ndarray | list[int],
                    store_ts: np.ndarray | list[int]) -> None:
        """Append one entry per (hash, commit-log offset, store time), in commit-log order; the caller made sure
        there is room. Entries first, then the count, then the slots, then the rest of the header (module
        docstring): a crash anywhere leaves every slot and PREV pointing below the count."""
        h = self.header
        first = h.index_count
        n = len(hashes)
        begin_ts = h.begin_timestamp or int(store_ts[0])
        begin_phy = h.begin_phy_offset if first > 1 else int(phys[0])
        if n < VECTOR_MIN_KEYS:
            self._put_few(_ints(hashes), _ints(phys), _ints(store_ts), begin_ts)
        else:
            self._put_many(np.asarray(hashes), np.asarray(phys), np.asarray(store_ts), begin_ts)
        self.header = IndexHeader(begin_ts, int(store_ts[-1]), begin_phy, int(phys[-1]), self.slots, first + n)
        INDEX_HEADER.pack_into(self.mm, 0, *self.header)

    def _put_few(self, hashes: list[int], phys: list[int], store_ts: list[int], begin_ts: int) -> None:
        """``put_entries``'s body for a few entries (a single send's message): struct calls, no numpy set-up."""
        first = count = self.header.index_count
        mm = self.mm
        newest: dict[int, int] = {}  # slot -> its newest entry of this run
        for kh, p, ts in zip(hashes, phys, store_ts, strict=True):
            slot = kh % self.slots
            prev = newest.get(slot)
            if prev is None:
                prev = INDEX_SLOT.unpack_from(mm, INDEX_HEADER.size + slot * INDEX_SLOT.size)[0]
                if prev <= 0 or prev >= first:
                    prev = 0  # empty, or stale from a torn write: start a new chain
            INDEX_ENTRY.pack_into(mm, self._entries_at + count * INDEX_ENTRY.size, kh, p,
                                  max(0, (ts - begin_ts) // 1000), prev)
            newest[slot] = count
            count += 1
        struct.pack_into(">i", mm, 36, count)
        for slot, number in newest.items():
            INDEX_SLOT.pack_into(mm, INDEX_HEADER.size + slot * INDEX_SLOT.size, number)

    def _put_many(self, hashes: np.ndarray, phys: np.ndarray, store_ts: np.ndarray, begin_ts: int) -> None:
        """``put_entries``'s body for a run: the same bytes as ``_put_few``, in numpy."""
        first = self.header.index_count
        n = len(hashes)
        numbers = np.arange(first, first + n, dtype=np.int64)
        slots = hashes % self.slots
        # PREV: the entry before it in the same slot, within this run or, for the first of its slot, the slot's
        # newest entry so far (0 when empty, or stale from a torn write: a new chain starts)
        order = np.argsort(slots, kind="stable")
        sorted_slots = slots[order]
        starts_group = np.ones(n, bool)
        starts_group[1:] = sorted_slots[1:] != sorted_slots[:-1]
        prev = np.empty(n, np.int64)
        prev[order[1:]] = numbers[order[:-1]]
        slot_view = np.frombuffer(self.mm, ">i4", self.slots, INDEX_HEADER.size)
        try:
            heads = order[starts_group]
            newest = slot_view[slots[heads]].astype(np.int64)
            prev[heads] = np.where((newest <= 0) | (newest >= first), 0, newest)
            entries = np.empty(n, ENTRY_DTYPE)
            entries["key_hash"] = hashes
            entries["commitlog_offset"] = phys
            entries["time_diff_s"] = np.maximum(0, (store_ts - begin_ts) // 1000)
            entries["prev"] = prev
            at = self._entries_at + first * INDEX_ENTRY.size
            self.mm[at : at + n * INDEX_ENTRY.size] = entries.tobytes()
            struct.pack_into(">i", self.mm, 36, first + n)
            ends_group = np.ones(n, bool)  # the last entry of each slot becomes its newest
            ends_group[:-1] = starts_group[1:]
            tails = order[ends_group]
            slot_view[slots[tails]] = numbers[tails]
        finally:
            del slot_view  # the view holds an export of the mmap, which close() could not unmap while it lives

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
            unmap(self.mm, self.fd, self.path)

    def destroy(self) -> None:
        self.close()
        unlink_if_present(self.path)


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
        self.put_many([(topic, list(keys), phys, store_ts)])

    def put_many(self, messages: list[tuple[str, list[str], int, int]]) -> None:
        """Index messages given as (topic, keys, commit-log offset, store time), in commit-log order: the same
        files, byte for byte, as ``put`` of each in turn. Messages at or below ``indexed_until`` are skipped."""
        indexed_until = self.indexed_until
        fresh = [m for m, message in enumerate(messages) if message[2] > indexed_until]
        owners = [m for m in fresh for key in messages[m][1] if key]  # the message of each name
        names = [index_key(messages[m][0], key) for m in fresh for key in messages[m][1] if key]
        if not names:
            return
        if len(names) == 1:  # a single send's UNIQ_KEY: no arrays (a dispatch pass of one message: 26 -> 20 us)
            _, _, offset, store_ts = messages[owners[0]]
            with self.lock:
                self._writable(1).put_entries([key_hash(names[0])], [offset], [store_ts])
            return
        hashes = key_hashes(names)
        if len(owners) == len(set(owners)):  # one key a message (a UNIQ_KEY each: the common run): entry = message
            at = np.array([messages[m][2] for m in owners], np.int64)
            times = np.array([messages[m][3] for m in owners], np.int64)
            self._put_one_each(hashes, at, times)
            return
        all_hashes = hashes.tolist()
        # Per message: distinct hashes, in key order (a repeated key is one entry: check() counts distinct keys,
        # and the cut must not push a distinct key out for a repeated one), at most entries - 2 (a message with
        # absurdly many keys must still fit one file).
        per_message: dict[int, dict[int, None]] = {}
        for m, kh in zip(owners, all_hashes, strict=True):
            per_message.setdefault(m, {})[kh] = None
        cap = self.entries - 2
        runs = [(list(hs)[:cap], messages[m][2], messages[m][3]) for m, hs in per_message.items()]
        with self.lock:
            while runs:
                f = self._writable(len(runs[0][0]))
                room = f.entries - f.header.index_count
                flat: list[int] = []
                phys: list[int] = []
                stamps: list[int] = []
                taken = 0
                for hs, p, ts in runs:
                    if len(flat) + len(hs) > room:
                        break
                    flat += hs
                    phys += [p] * len(hs)
                    stamps += [ts] * len(hs)
                    taken += 1
                f.put_entries(np.array(flat, np.int64), np.array(phys, np.int64), np.array(stamps, np.int64))
                runs = runs[taken:]

    def put_hashed(self, hashes: np.ndarray, phys: np.ndarray, store_ts: np.ndarray) -> None:
        """Index messages of one key each, given as its hash (``key_hash`` of ``topic#key``), commit-log offset and
        store time (int64 arrays, in commit-log order): the same files, byte for byte, as ``put_many`` of the same
        messages. Messages at or below ``indexed_until`` are skipped."""
        fresh = phys > self.indexed_until
        if not fresh.all():
            hashes, phys, store_ts = hashes[fresh], phys[fresh], store_ts[fresh]
        if len(hashes) == 1:  # put_many's single key: the scalar path, no arrays
            with self.lock:
                self._writable(1).put_entries([int(hashes[0])], [int(phys[0])], [int(store_ts[0])])
        elif len(hashes):
            self._put_one_each(hashes, phys, store_ts)

    def _put_one_each(self, hashes: np.ndarray, phys: np.ndarray, store_ts: np.ndarray) -> None:
        """One entry a message, filling each file and going on in the next."""
        with self.lock:
            done = 0
            while done < len(hashes):
                f = self._writable(1)
                take = min(f.entries - f.header.index_count, len(hashes) - done)
                f.put_entries(hashes[done : done + take], phys[done : done + take], store_ts[done : done + take])
                done += take

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
