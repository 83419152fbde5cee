"""CommitLog: every message of every topic appended in order, in fixed-size files named by start offset.

All appends take one lock (``append_lock``). Under it the store assigns what only it can know: the physical
offset, the queue offset (from ``queue_table``: ``(topic, queueId) -> next offset``), and a store timestamp that
never goes backwards. These are patched into the encoded bytes (a batch: two row-wise numpy assignments, or struct
per entry for small ones) and the whole entry or batch is written with one copy (MappedFile.append). An entry or
batch that does not fit in the rest of a file (keeping 8 bytes for the blank head) goes to the next file; the
rest becomes a blank entry. The queue table changes only after the write succeeded.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from broker.errors import BrokerError, InvalidArgumentError, ServiceNotAvailableError
from broker.format.batch import SmallBatch, ValidatedBatch, assign_queue_offsets
from broker.format.message import (
    END_FILE_MIN_BLANK_LENGTH,
    ENTRY_HEADER,
    I32,
    I64,
    MAX_PROPERTIES_BYTES,
    MAX_TOPIC_BYTES,
    MESSAGE_MAGIC,
    MIN_ENTRY_SIZE,
    POS_PHYSICAL_OFFSET,
    POS_QUEUE_OFFSET,
    POS_STORE_HOST,
    POS_STORE_TIMESTAMP,
    PREFIX,
    StoredMessage,
    decode_entry,
    encode_blank,
    entry_size,
    pack_ipv4,
    parse_layout,
)
from broker.store.directory import fsync_directory
from broker.store.mapped_file import MappedFile, MappedFileQueue
from broker.store.store_config import StoreConfig

_QUEUE_AND_PHYS = struct.Struct(">qq")  # QUEUEOFFSET then PHYSICALOFFSET: adjacent in the entry header
assert POS_QUEUE_OFFSET + 8 == 28
_TIME_AND_HOST = struct.Struct(">q8s")  # STORETIMESTAMP then STOREHOST (IPv4 + port): adjacent too
assert POS_STORE_TIMESTAMP + 8 == POS_STORE_HOST


class CreateMappedFileError(BrokerError):
    """The next commit-log file could not be created (ENOSPC: the disk is full)."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(f"could not create the next commit-log file: {cause}")
        self.errno = cause.errno


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class CommitLog:
    def __init__(
        self,
        config: StoreConfig,
        sync: Callable[[int], None],
        allocate: Callable[[int, int, int], None] = os.posix_fallocate,
        sync_dir: Callable[[str], None] = fsync_directory,
    ) -> None:
        self.config = config
        self.files = MappedFileQueue(
            config.commit_log_dir, config.mapped_file_size_commit_log, sync, allocate, sync_dir
        )
        self.append_lock = threading.Lock()
        self.queue_table: dict[tuple[str, int], int] = {}
        self.last_store_timestamp = 0
        host, port = config.store_host
        self.store_ip = pack_ipv4(host)
        self.store_port = port
        self.store_host_bytes = self.store_ip + I32.pack(port)
        self.accepting = True  # False once shutdown began: checked under the lock, so no append can slip in
        # The largest entry a put can write (one file keeps room for a blank head after it): a bound for TOTALSIZE
        # read at an offset nobody vouched for (lookup).
        self.max_entry_size = min(
            entry_size(config.max_message_size, MAX_TOPIC_BYTES, MAX_PROPERTIES_BYTES),
            config.mapped_file_size_commit_log - END_FILE_MIN_BLANK_LENGTH,
        )

    def stop_appends(self) -> None:
        """After this returns no append is in flight and none will start."""
        with self.append_lock:
            self.accepting = False

    def _check_accepting(self) -> None:
        if not self.accepting:
            raise ServiceNotAvailableError("the store is shutting down; retry on the restarted broker")

    # ------------------------------------------------------------------------------------------------ positions
    @property
    def min_offset(self) -> int:
        return self.files.min_offset

    @property
    def max_offset(self) -> int:
        return self.files.max_offset

    @property
    def flushed_offset(self) -> int:
        return self.files.flushed_offset

    def _store_timestamp(self) -> int:
        ts = now_ms()
        if ts < self.last_store_timestamp:  # the wall clock stepped back: keep the log's times monotonic
            ts = self.last_store_timestamp
        self.last_store_timestamp = ts
        return ts

    def _file_with_room(self, n: int) -> MappedFile:
        """The file the next ``n`` bytes go to, ending the current one with a blank entry if they do not fit.

        OSError (ENOSPC...) from creating a file propagates; the caller maps it to a put status.
        """
        f = self._last_for_append()
        free = f.free_bytes
        if n + END_FILE_MIN_BLANK_LENGTH > free:
            f.write_at(f.wrote_position, encode_blank(free))
            f.wrote_position = f.file_size  # the blank's TOTALSIZE covers the rest of the file
            f = self._last_for_append()
            assert n + END_FILE_MIN_BLANK_LENGTH <= f.free_bytes, (n, f)
        return f

    def _last_for_append(self) -> MappedFile:
        try:
            return self.files.last_for_append()
        except OSError as e:
            raise CreateMappedFileError(e) from e

    # ------------------------------------------------------------------------------------------------ appends
    def append_entry(self, entry: bytearray, topic: str, queue_id: int, counted: bool) -> tuple[int, int, int]:
        """Append one encoded entry; return (physical offset, queue offset, store timestamp). Caller holds no lock."""
        key = (topic, queue_id)
        with self.append_lock:
            self._check_accepting()
            f = self._file_with_room(len(entry))
            phys = f.file_from_offset + f.wrote_position
            qoff = self.queue_table.get(key, 0) if counted else 0
            ts = self._store_timestamp()
            _QUEUE_AND_PHYS.pack_into(entry, POS_QUEUE_OFFSET, qoff, phys)
            I64.pack_into(entry, POS_STORE_TIMESTAMP, ts)
            f.append(entry)
            if counted:
                self.queue_table[key] = qoff + 1
        return phys, qoff, ts

    def append_small_batch(self, batch: SmallBatch) -> tuple[list[int], list[int], int]:
        """append_batch for a SmallBatch: struct patches per entry; returns (physical offsets, queue offsets, ts)."""
        data = batch.data
        with self.append_lock:
            table = self.queue_table  # under the lock: a topic deletion changes the table under it too
            self._check_accepting()
            f = self._file_with_room(len(data))
            base = f.file_from_offset + f.wrote_position
            ts = self._store_timestamp()
            taken: dict[tuple[str, int], int] = {}  # applied to the table only once the write succeeded
            qoffs: list[int] = []
            for pos, key, counted in zip(batch.positions, batch.keys, batch.counted, strict=True):
                q = 0
                if counted:
                    q = taken.get(key, table.get(key, 0))
                    taken[key] = q + 1
                _QUEUE_AND_PHYS.pack_into(data, pos + POS_QUEUE_OFFSET, q, base + pos)
                _TIME_AND_HOST.pack_into(data, pos + POS_STORE_TIMESTAMP, ts, self.store_host_bytes)
                qoffs.append(q)
            f.append(data)
            table.update(taken)
        return [base + p for p in batch.positions], qoffs, ts

    def append_batch(self, batch: ValidatedBatch) -> tuple[np.ndarray, np.ndarray, int]:
        """Patch and append a validated batch with one write; return (physical offsets, queue offsets, timestamp).

        The store fields come in two adjacent 16-byte pairs (QUEUEOFFSET+PHYSICALOFFSET, STORETIMESTAMP+STOREHOST),
        so patching is two row-wise numpy assignments through a strided view of the buffer.
        """
        data = batch.data
        run = batch.run
        n = run.positions.size
        rows = as_strided(np.frombuffer(data, np.uint8), shape=(len(data) - 15, 16), strides=(1, 1))
        qp = np.empty(n, dtype=[("q", ">i8"), ("p", ">i8")])
        th = np.empty(n, dtype=[("t", ">i8"), ("h", "S8")])
        th["h"] = self.store_host_bytes
        with self.append_lock:
            self._check_accepting()
            f = self._file_with_room(len(data))
            base = f.file_from_offset + f.wrote_position
            starts = [self.queue_table.get(k, 0) for k in batch.keys]
            qoffs, counts = assign_queue_offsets(batch.key_ids, batch.counted, starts)
            ts = self._store_timestamp()
            phys = run.positions + base
            qp["q"] = qoffs
            qp["p"] = phys
            th["t"] = ts
            rows[run.positions + POS_QUEUE_OFFSET] = qp.view(np.uint8).reshape(n, 16)
            rows[run.positions + POS_STORE_TIMESTAMP] = th.view(np.uint8).reshape(n, 16)
            f.append(data)
            for k, start, c in zip(batch.keys, starts, counts.tolist(), strict=True):
                if c:
                    self.queue_table[k] = start + c
        del rows
        return phys, qoffs, ts

    def append_replicated(self, offset: int, data: bytes | memoryview, last_store_timestamp: int,
                          fills_file: bool) -> None:
        """A slave's append: bytes its master wrote at ``offset``, written at the same offset so both logs stay byte
        for byte the same (broker/ha). The caller validated them (whole entries, CRCs, PHYSICALOFFSET fields) and
        keeps them inside one file; ``offset`` must be this log's end, or a file boundary when the log is empty.
        ``fills_file``: they end with the end-of-file blank, which completes the file as ``_file_with_room`` does.
        Queue offsets are the master's, already in the bytes: the queue table is rebuilt on promotion."""
        with self.append_lock:
            self._check_accepting()
            end = self.files.max_offset
            if (self.files.files and offset != end) or (not self.files.files and offset % self.files.file_size):
                raise InvalidArgumentError(
                    f"replicated bytes at commit-log offset {offset} do not continue this log, which ends at {end}"
                )
            try:
                f = self.files.last_for_append(offset)
            except OSError as e:
                raise CreateMappedFileError(e) from e
            if offset - f.file_from_offset + len(data) > f.file_size:
                raise InvalidArgumentError(f"replicated bytes at {offset} cross the end of file {f.path}")
            if data:
                f.append(data)
            if fills_file:
                f.wrote_position = f.file_size
            self.last_store_timestamp = max(self.last_store_timestamp, last_store_timestamp)

    # ------------------------------------------------------------------------------------------------ reads
    def read(self, offset: int, size: int) -> bytes | None:
        """``size`` bytes at global ``offset`` (one file); None if that file is gone or the range not written."""
        f = self.files.find(offset)
        if f is None:
            return None
        pos = offset - f.file_from_offset
        if pos + size > f.wrote_position:
            return None
        try:
            return f.read(pos, size)
        except ValueError:  # the file was closed by expiry between find() and read()
            return None

    def lookup(self, offset: int) -> StoredMessage | None:
        """Decode the message entry starting at ``offset``; None if there is none there (lookup_entry says how
        that is decided)."""
        raw = self.lookup_entry(offset)
        return None if raw is None else decode_entry(raw)

    def lookup_entry(self, offset: int) -> bytes | None:
        """The message entry starting at ``offset``, as stored; None if there is none there.

        The offset may come from a client (a msgId of another broker, an end-by-offset) and point anywhere, into
        a body that holds bytes shaped like an entry too: only a header with the message magic, this very offset
        as its PHYSICALOFFSET (which the store wrote, a client cannot) and a size no larger than the largest entry
        the store accepts is read further, so a stray offset never returns a forged entry nor makes the broker
        copy up to a file's worth of bytes before finding out."""
        head = self.read(offset, ENTRY_HEADER.size)  # every entry is longer (MIN_ENTRY_SIZE)
        if head is None:
            return None
        total, magic = PREFIX.unpack_from(head)
        if (
            magic != MESSAGE_MAGIC
            or not MIN_ENTRY_SIZE <= total <= self.max_entry_size
            or I64.unpack_from(head, POS_PHYSICAL_OFFSET)[0] != offset
        ):
            return None
        raw = self.read(offset, total)
        if raw is None:
            return None
        try:
            parse_layout(raw, 0, len(raw))
        except (BrokerError, struct.error, IndexError):  # no message entry starts at this offset
            return None
        return raw

    def store_timestamp_at(self, offset: int) -> int | None:
        raw = self.read(offset + POS_STORE_TIMESTAMP, 8)
        return None if raw is None else int(I64.unpack(raw)[0])

    def close(self) -> None:
        self.files.close()
