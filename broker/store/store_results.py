"""Outcomes of puts and gets, with RocketMQ's status names (``PutMessageStatus``, ``GetMessageStatus``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from broker.format.message import StoredMessage, decode_entry, msg_id_at


class PutStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"  # appended, but not confirmed on disk in time (or fsync failed)
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"  # shut down, disk full, or read-only after an I/O error
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"  # bad topic, framing, CRC; too big (MESSAGE_SIZE_EXCEEDED in the text)
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


# A store that cannot write now (shut down, disk full, a file it cannot create, read-only after an I/O error): the
# writer is answered SERVICE_NOT_AVAILABLE, to try again later or elsewhere; none of these is a broker bug.
CANNOT_WRITE_NOW = frozenset({PutStatus.SERVICE_NOT_AVAILABLE, PutStatus.CREATE_MAPPED_FILE_FAILED,
                              PutStatus.UNKNOWN_ERROR})


@dataclass
class PutResult:
    status: PutStatus
    # The store host part of every msgId (IPv4 + port, 16 hex characters): msg_ids are made from it on demand,
    # since a batch's caller rarely wants tens of thousands of strings.
    msg_id_prefix: str = ""
    commitlog_offsets: list[int] = field(default_factory=list)  # one per message
    queue_ids: list[int] = field(default_factory=list)
    queue_offsets: list[int] = field(default_factory=list)
    store_timestamp: int = 0
    wrote_bytes: int = 0
    error: str = ""  # human text when status != PUT_OK

    @property
    def ok(self) -> bool:
        return self.status is PutStatus.PUT_OK

    @property
    def msg_ids(self) -> list[str]:
        """One offset msgId per message (store IPv4 + port + commit-log offset, 32 upper-case hex characters)."""
        prefix = self.msg_id_prefix
        return [msg_id_at(prefix, offset) for offset in self.commitlog_offsets]


class GetStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"  # units read, none passed the filter
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"  # the commit-log file went away under the reader
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"  # the consume-queue file went away under the reader
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"  # offset > max
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"  # offset == max: nothing new yet
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"  # offset < min: expired
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"  # no such queue (bad topic name or queue id)
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"  # the queue is empty


@dataclass
class GetResult:
    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    buffer: bytes = b""  # the raw commit-log entries found, concatenated, exactly as on disk
    entry_positions: list[int] = field(default_factory=list)  # start of each entry inside buffer
    queue_offsets: list[int] = field(default_factory=list)  # queue offset of each entry (same order)

    @property
    def message_count(self) -> int:
        return len(self.entry_positions)

    def messages(self) -> list[StoredMessage]:
        """Decode ``buffer``; entries are checked for framing (the CRC was checked when they were stored)."""
        if not self.entry_positions:
            return []
        ends = [*self.entry_positions[1:], len(self.buffer)]
        return [decode_entry(self.buffer, p, e) for p, e in zip(self.entry_positions, ends, strict=True)]
