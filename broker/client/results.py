"""What sends and pulls return to applications, with RocketMQ's status names."""

from __future__ import annotations

import enum
from typing import NamedTuple

from broker.format.message import StoredMessage

# A pulled message: StoredMessage exposes msg_id, topic, queue_id, queue_offset, commitlog_offset, body, tags,
# keys, properties, born_timestamp/store_timestamp (and hosts) and reconsume_times.
ReceivedMessage = StoredMessage


class SendStatus(enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"  # stored, but not confirmed on disk in time
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"  # pull again at once from next_begin_offset
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"  # continue from next_begin_offset


class SendResult(NamedTuple):
    status: SendStatus
    msg_id: str  # the offset id: the storing broker's address and the commit-log offset (ViewMessageById)
    queue_id: int
    queue_offset: int
    broker_name: str = ""  # the broker group that stored it ("" for a client of one broker)
    uniq_key: str = ""  # the client's id of the message (UNIQ_KEY), which queries by key find


class PullResult(NamedTuple):
    status: PullStatus
    messages: list[ReceivedMessage]
    next_begin_offset: int
    min_offset: int
    max_offset: int


class RawPullResult(NamedTuple):
    status: PullStatus
    buffer: bytes
    entry_positions: list[int]
    next_begin_offset: int
    min_offset: int
    max_offset: int
