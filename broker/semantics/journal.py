"""A crash-safe record of a service's state: a snapshot plus an append-only journal of changes since it.

Used by the pop service (which messages are in flight, until when) and the timer service (which timer messages
are delivered). Both keep their state in memory and make every change durable here before they answer for it.

Files, in the service's own folder under ``config/``::

    snapshot.json        {"journal": N, "crc": crc32(state), "state": {...}}: the state as of journal N's start
    journal.N            records appended since that snapshot (N counts up from 1)

The one record format (declared here only): ``length (u32 big-endian) | crc32 of payload (u32) | payload``, where
the payload is one JSON object in UTF-8. A record is appended with one ``write`` before the change it describes is
answered, so a process killed at any instant leaves every answered change in the file (the page cache survives a
killed process; ``sync=True`` adds an fsync per record for a power loss, as SYNC_FLUSH does for messages).

Compaction: once the journal passes ``compact_bytes``, ``checkpoint(state)`` starts journal N+1, writes the
snapshot for N+1 (write_json_atomic: temp file, fsync, rename) and only then deletes journal N and older. A crash
in between leaves the old snapshot and both journals, which replay to the same state.

A full disk (ENOSPC) does not stop the service: the record is not written (a part the disk took is cut off again)
and the journal is *behind*: no later record is written either, since replay must not skip one, and ``due`` asks
for a checkpoint, whose snapshot holds every change kept in memory meanwhile; it succeeds once space returns. A
crash before then loses those changes (pop: messages received or acked meanwhile are delivered again).

Recovery reads the snapshot (its CRC checked), then every journal from its number on, in order. A record cut short
at the end of the last journal (a crash during the append, never answered) is cut off and logged; a bad record
anywhere else is damage, and start-up stops with a CorruptionError naming the file and the byte offset.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any

from broker.errors import CorruptionError
from broker.json_file import load_json, write_json_atomic
from broker.store.directory import fsync_directory

log = logging.getLogger(__name__)

SNAPSHOT_FILE = "snapshot.json"
JOURNAL_PREFIX = "journal."
RECORD_HEAD = struct.Struct(">II")  # payload length, crc32 of the payload
# One record describes one request's changes (a pop of at most a few hundred messages): anything larger is damage.
MAX_RECORD_BYTES = 16 << 20
DEFAULT_COMPACT_BYTES = 64 << 20  # journal size past which a checkpoint is due
_JOURNAL_NAME = re.compile(r"journal\.([0-9]+)\Z")


def _crc(data: bytes) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def encode_record(record: dict[str, Any]) -> bytes:
    payload = json.dumps(record, separators=(",", ":")).encode("utf-8")
    if len(payload) > MAX_RECORD_BYTES:
        raise ValueError(f"journal record of {len(payload)} bytes exceeds {MAX_RECORD_BYTES}")
    return RECORD_HEAD.pack(len(payload), _crc(payload)) + payload


def _state_crc(state: dict[str, Any]) -> int:
    return _crc(json.dumps(state, sort_keys=True, separators=(",", ":")).encode("utf-8"))


def read_records(path: str, *, last: bool) -> Iterator[dict[str, Any]]:
    """The records of one journal file. A torn tail of the ``last`` journal is cut off; anything else that fails its
    length or CRC check raises CorruptionError with the file and byte offset."""
    with open(path, "rb") as f:
        data = f.read()
    pos, end = 0, len(data)
    while pos < end:
        bad, body_end = "", end
        if pos + RECORD_HEAD.size > end:
            bad = "record header runs past the end of the file"
        else:
            length, crc = RECORD_HEAD.unpack_from(data, pos)
            body_end = pos + RECORD_HEAD.size + length
            if length > MAX_RECORD_BYTES:
                bad = f"record length {length} exceeds {MAX_RECORD_BYTES}"
            elif body_end > end:
                bad = f"record of {length} bytes runs past the end of the file"
            elif _crc(data[pos + RECORD_HEAD.size : body_end]) != crc:
                bad = "record CRC does not match"
        if bad:
            # A torn append is the last thing in the last journal: nothing follows it but zeros, if anything.
            ends_file = pos + RECORD_HEAD.size > end or body_end >= end
            if not (last and (ends_file or not data[pos:].strip(b"\x00"))):
                raise CorruptionError(f"journal damaged: {bad}", path, pos)
            log.warning("journal %s: cutting a torn last record at byte %d (%s)", path, pos, bad)
            with open(path, "r+b") as f:
                f.truncate(pos)
            return
        payload = data[pos + RECORD_HEAD.size : body_end]
        try:
            record = json.loads(payload)
        except ValueError as e:
            raise CorruptionError(f"journal record is not JSON ({e})", path, pos) from None
        if not isinstance(record, dict):
            raise CorruptionError("journal record is not a JSON object", path, pos)
        yield record
        pos = body_end


class Journal:
    """Snapshot + journal files in ``folder``; ``append`` is thread-safe."""

    def __init__(self, folder: str, *, sync: bool = False, compact_bytes: int = DEFAULT_COMPACT_BYTES) -> None:
        self.folder = folder
        self.sync = sync
        self.compact_bytes = compact_bytes
        self._lock = threading.Lock()
        self._fd = -1
        self._number = 0
        self._size = 0
        self._behind = False  # a record was not written for want of space: nothing is until a checkpoint

    def _journal_path(self, number: int) -> str:
        return os.path.join(self.folder, f"{JOURNAL_PREFIX}{number}")

    def _numbers(self) -> list[int]:
        found = []
        for name in os.listdir(self.folder):
            m = _JOURNAL_NAME.match(name)
            if m:
                found.append(int(m.group(1)))
        return sorted(found)

    def recover(self, restore: Callable[[dict[str, Any] | None], None],
                apply: Callable[[dict[str, Any]], None]) -> None:
        """Hand the snapshot's state to ``restore`` (None when there is none yet), then every record since it to
        ``apply`` in order, then open the newest journal for appending. Call once, before ``append``."""
        os.makedirs(self.folder, exist_ok=True)
        snapshot = load_json(os.path.join(self.folder, SNAPSHOT_FILE), _parse_snapshot)
        first, state = (1, None) if snapshot is None else snapshot
        restore(state)
        numbers = [n for n in self._numbers() if n >= first]
        if numbers and numbers[0] != first:
            raise CorruptionError(
                f"journal {first} is missing (found {numbers[:3]}): the records since the snapshot are incomplete",
                os.path.join(self.folder, SNAPSHOT_FILE), 0,
            )
        for i, number in enumerate(numbers):
            for record in read_records(self._journal_path(number), last=i == len(numbers) - 1):
                apply(record)
        self._number = numbers[-1] if numbers else first
        self._fd = os.open(self._journal_path(self._number), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._size = os.fstat(self._fd).st_size
        fsync_directory(self.folder)

    def append(self, record: dict[str, Any]) -> None:
        """Durable (as configured) when this returns, unless the disk is full (module docstring: the journal is
        then behind until a checkpoint); OSError when the write failed otherwise (nothing may be answered)."""
        data = encode_record(record)
        with self._lock:
            if self._behind:
                return  # the next checkpoint's snapshot holds this change
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(self._fd, view) :]
            except OSError as e:
                # A full disk takes part of a record and refuses the rest: cut it off, or the next record, written
                # once space returns, would follow a torn one, which recovery takes for damage.
                os.ftruncate(self._fd, self._size)
                if e.errno != errno.ENOSPC:
                    raise
                self._behind = True
                log.error("journal %s: disk full (%s); changes are kept in memory until a checkpoint can be written "
                          "(a crash before then loses them)", self._journal_path(self._number), e)
                return
            if self.sync:
                os.fdatasync(self._fd)
            self._size += len(data)

    @property
    def behind(self) -> bool:
        """Whether changes were kept in memory only (a full disk) and wait for a checkpoint."""
        return self._behind

    @property
    def due(self) -> bool:
        """Whether a checkpoint is due: the journal has grown past ``compact_bytes``, or it is behind (a full disk)."""
        return self._behind or self._size >= self.compact_bytes

    def checkpoint(self, state: dict[str, Any]) -> None:
        """``state``: everything appended so far, applied. The caller holds its own lock so no append comes between
        taking the state and this call."""
        with self._lock:
            if self._size == 0:
                # Nothing in the current journal (a checkpoint that failed on a full disk made it): the snapshot
                # can start at it, rather than a new empty journal per attempt while the disk stays full.
                new = self._number
            else:
                new = self._number + 1
                new_fd = os.open(self._journal_path(new), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd, self._number, self._size = new_fd, new, 0
        fsync_directory(self.folder)
        write_json_atomic(os.path.join(self.folder, SNAPSHOT_FILE),
                          {"journal": new, "crc": _state_crc(state), "state": state})
        if self._behind:
            log.warning("journal %s: caught up (checkpoint written)", self.folder)
        self._behind = False  # only now: without the snapshot, records after a skipped one must not be written
        for number in self._numbers():
            if number < new:
                os.unlink(self._journal_path(number))

    def close(self) -> None:
        if self._behind:
            log.error("journal %s closed behind: changes since the disk filled are lost (checkpoint failed)",
                      self.folder)
        with self._lock:
            if self._fd >= 0:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1


def _parse_snapshot(data: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    number, state = int(data["journal"]), data["state"]
    if not isinstance(state, dict):
        raise TypeError("state is not an object")
    if _state_crc(state) != int(data["crc"]):
        raise ValueError("state CRC does not match")
    return number, state
