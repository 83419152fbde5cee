"""The ``checkpoint`` file: how far the commit log, the consume queues and the index are known to be on disk.

RocketMQ's three timestamps come first (same positions), then Sluice's offsets and a CRC::

    0                8                16               24               32               40               48     52
    +----------------+----------------+----------------+----------------+----------------+----------------+------+
    | PHYSIC MSG TS  | LOGICS MSG TS  | INDEX MSG TS   | PHYSIC OFFSET  | LOGICS OFFSET  | INDEX OFFSET   | CRC  |
    +----------------+----------------+----------------+----------------+----------------+----------------+------+

Timestamps are store timestamps (ms) of the last message flushed in each structure; offsets are commit-log offsets
below which that structure is complete on disk. Abnormal recovery checks the commit log from the smallest of the
three offsets and re-dispatches from the smaller of the logics and index offsets. The file is one 4 KiB page
rewritten in place; the CRC detects a torn write, and a torn checkpoint is treated as absent (recovery then starts
from the first commit-log file, which is slower but safe).
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import zlib
from collections.abc import Callable
from typing import NamedTuple

log = logging.getLogger(__name__)

CHECKPOINT = struct.Struct(
    ">"
    "q"  # PHYSIC MSG TIMESTAMP: store time of the last commit-log entry flushed
    "q"  # LOGICS MSG TIMESTAMP: store time of the last entry whose consume-queue unit is flushed
    "q"  # INDEX MSG TIMESTAMP: store time of the last entry whose index entries are flushed
    "q"  # PHYSIC OFFSET: commit-log flushed offset
    "q"  # LOGICS OFFSET: commit-log offset below which every consume-queue unit is flushed
    "q"  # INDEX OFFSET: commit-log offset below which every index entry is flushed
    "I"  # CRC: zlib.crc32 of the 48 bytes before it
)
assert CHECKPOINT.size == 52, CHECKPOINT.size
CHECKPOINT_FILE_SIZE = 4096  # one page, as RocketMQ


class CheckpointData(NamedTuple):
    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0
    physic_offset: int = 0
    logics_offset: int = 0
    index_offset: int = 0

    @property
    def min_dispatch_offset(self) -> int:
        return min(self.logics_offset, self.index_offset)

    @property
    def min_recovery_offset(self) -> int:
        """Where abnormal recovery starts checking the commit log: with ASYNC_FLUSH the consume queues and index
        can be on disk past the commit log's last fdatasync (physic offset), and what follows that may be lost."""
        return min(self.physic_offset, self.logics_offset, self.index_offset)


class Checkpoint:
    def __init__(self, path: str, sync: Callable[[int], None]) -> None:
        self.path = path
        self._sync = sync
        existed = os.path.exists(path)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if not existed:
            os.posix_fallocate(self.fd, 0, CHECKPOINT_FILE_SIZE)
        self.valid = False
        self._lock = threading.Lock()  # the commit-log and consume-queue flushers both change it
        self.data = self._read()

    def _read(self) -> CheckpointData:
        raw = os.pread(self.fd, CHECKPOINT.size, 0)
        if len(raw) < CHECKPOINT.size or raw.count(0) == len(raw):
            return CheckpointData()
        *fields, crc = CHECKPOINT.unpack(raw)
        if zlib.crc32(raw[:-4]) != crc:
            log.warning(
                "checkpoint %s: CRC mismatch at byte 48; ignoring it (recovery starts from the first file)", self.path
            )
            return CheckpointData()
        self.valid = True
        return CheckpointData(*fields)

    def set(self, **fields: int) -> None:
        """Change fields in memory only (the commit-log flusher); the next ``update``/``write`` persists them."""
        with self._lock:
            self.data = self.data._replace(**fields)

    def update(self, flush: bool = True, **fields: int) -> None:
        """Change fields and write the whole checkpoint (fdatasync unless ``flush`` is False)."""
        with self._lock:
            data = self.data._replace(**fields)
            crc = zlib.crc32(CHECKPOINT.pack(*data, 0)[: CHECKPOINT.size - 4])
            os.pwrite(self.fd, CHECKPOINT.pack(*data, crc), 0)
            if flush:
                self._sync(self.fd)
            self.data = data
            self.valid = True

    def close(self) -> None:
        os.close(self.fd)
