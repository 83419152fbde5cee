"""Commit-log bytes in flight from a master to a slave: how the master cuts them, how the slave checks them.

The master sends its log as it lies on disk, from the offset the slave continues at: a chunk is a plain byte range
``[offset, offset + n)`` of one commit-log file, at most ``MAX_CHUNK_BYTES``, never past the log's end and never
across the start of another epoch (each chunk names the epoch its bytes were written under). A chunk may end in
the middle of an entry; the slave keeps such a tail and completes it with the next chunk.

The slave writes nothing it has not checked (``check``): whole entries only, each framing and CRC-checking as
recovery checks them, storable (no torn TOPIC or PROPERTIES), and carrying its own position as PHYSICALOFFSET, so
that bytes meant for another offset are never written. The end-of-file blank is written as the master wrote it
(its 8-byte head; the rest of the file stays zero) and completes the file; chunk bytes after a blank head belong to
that blank and are skipped. Damage is reported with the commit-log offset where it starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from broker.errors import CorruptionError
from broker.format.batch import first_unstorable, scan
from broker.format.message import BLANK_MAGIC, END_FILE_MIN_BLANK_LENGTH, POS_PHYSICAL_OFFSET, PREFIX

# A chunk's bytes are one gRPC message: 4 MiB keeps a maximal batch (4 MiB) to one or two chunks and the stream's
# memory bounded (the slave keeps at most a chunk plus an entry's tail).
MAX_CHUNK_BYTES = 4 * 1024 * 1024
_INCOMPLETE = ("partial", "entry head cut short")


@dataclass(frozen=True)
class Checked:
    """The part of a chunk (after the slave's kept tail) that may be written."""

    length: int  # bytes from the start that hold whole valid entries (and a closing blank head)
    entries: int
    last_store_timestamp: int  # of the last entry, 0 when none
    fills_file: bool  # ends with the end-of-file blank: the file is complete


def check(data: bytes, offset: int, file_size: int, max_entry_bytes: int) -> Checked:
    """Check ``data`` (replicated bytes at commit-log ``offset``, inside one file); CorruptionError naming the
    offset of the first bad entry. A trailing incomplete entry is not part of ``length`` (the caller keeps it)
    unless it is already longer than any entry can be."""
    run = scan(data, 0, len(data), verify_crc=True)
    cut, why = first_unstorable(data, run)
    if cut < len(run):
        raise CorruptionError(f"replicated entry at commit-log offset {offset + int(run.positions[cut])}: {why}")
    if len(run):
        arr = np.frombuffer(data, np.uint8)
        idx = (run.positions + POS_PHYSICAL_OFFSET)[:, None] + np.arange(8)
        phys = arr[idx].view(">i8").ravel()
        del arr
        bad = np.flatnonzero(phys != run.positions + offset)
        if bad.size:
            i = int(bad[0])
            raise CorruptionError(
                f"replicated entry at commit-log offset {offset + int(run.positions[i])} says it belongs at "
                f"{int(phys[i])}: the master sent bytes of another offset"
            )
    last_ts = int(run.store_timestamps[-1]) if len(run) else 0
    if run.stop_reason == "blank":
        total, magic = PREFIX.unpack_from(data, run.end)
        rel = (offset + run.end) % file_size
        if magic != BLANK_MAGIC or total != file_size - rel or total < END_FILE_MIN_BLANK_LENGTH:
            raise CorruptionError(
                f"replicated end-of-file blank at commit-log offset {offset + run.end} says {total} bytes; "
                f"{file_size - rel} are left in the file"
            )
        return Checked(run.end + END_FILE_MIN_BLANK_LENGTH, len(run), last_ts, True)
    if run.stop_reason == "":
        return Checked(len(data), len(run), last_ts, False)
    if run.stop_reason in _INCOMPLETE and len(data) - run.end <= max_entry_bytes:
        rel = (offset + run.end) % file_size
        if rel + (len(data) - run.end) <= file_size:  # the rest may still complete inside this file
            return Checked(run.end, len(run), last_ts, False)
    where = offset + run.end
    raise CorruptionError(f"replicated bytes at commit-log offset {where} are not an entry: {run.stop_reason}")
