"""Message: what an application sends, and its encoding into commit-log entries for SendBatch."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from broker.errors import MessageIllegalError
from broker.store.message import (
    Prop,
    StoredMessage,
    decode_entry,
    encode_entry,
    encode_properties,
    validate_topic,
)


@dataclass
class Message:
    topic: str
    body: bytes
    tags: str | None = None
    keys: Sequence[str] | str = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    flag: int = 0

    def key_list(self) -> list[str]:
        return self.keys.split() if isinstance(self.keys, str) else list(self.keys)

    def all_properties(self) -> dict[str, str]:
        """User properties plus TAGS and KEYS (space-separated), as RocketMQ stores them."""
        props = dict(self.properties)
        if self.tags:
            props[Prop.TAGS] = self.tags
        keys = self.key_list()
        for k in keys:
            if not k or " " in k:
                raise MessageIllegalError(f"key {k!r} is empty or has a space; keys are stored space-separated")
        if keys:
            props[Prop.KEYS] = " ".join(keys)
        return props


def encode_message(
    msg: Message, queue_id: int, born_timestamp: int | None = None, max_message_size: int = 4 << 20
) -> bytes:
    """One commit-log entry for SendBatch (store fields zero; the broker fills them in)."""
    if not isinstance(msg.body, bytes | bytearray | memoryview):
        raise MessageIllegalError(f"message body must be bytes, got {type(msg.body).__name__}; encode text first")
    return encode_entry(
        validate_topic(msg.topic), queue_id, bytes(msg.body), encode_properties(msg.all_properties()), flag=msg.flag,
        born_timestamp=born_timestamp if born_timestamp is not None else int(time.time() * 1000),
        max_message_size=max_message_size,
    )  # fmt: skip


def decode_entries(buffer: bytes, positions: Iterable[int]) -> list[StoredMessage]:
    pos_list = list(positions)
    if not pos_list:
        return []
    ends = [*pos_list[1:], len(buffer)]
    return [decode_entry(buffer, p, e) for p, e in zip(pos_list, ends, strict=True)]
