"""The PushConsumer's option values, with RocketMQ's names."""

from __future__ import annotations

import enum


class ConsumeStatus(enum.Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class MessageModel(enum.Enum):
    CLUSTERING = "CLUSTERING"  # the group shares the queues; offsets on the broker
    BROADCASTING = "BROADCASTING"  # every consumer reads every queue; offsets on the client


class ConsumeFrom(enum.Enum):
    LAST = "LAST"  # a queue without a committed offset starts at its max offset
    FIRST = "FIRST"  # ... at its min offset
    TIMESTAMP = "TIMESTAMP"  # ... at the first message stored at or after consume_timestamp_ms


CLUSTERING, BROADCASTING = MessageModel.CLUSTERING, MessageModel.BROADCASTING
LAST, FIRST, TIMESTAMP = ConsumeFrom.LAST, ConsumeFrom.FIRST, ConsumeFrom.TIMESTAMP
