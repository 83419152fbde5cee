"""The body of SEND_BATCH_MESSAGE: RocketMQ's batch encoding, read strictly, and turned into a Sluice batch buffer.

Each message, back to back (``MessageDecoder.encodeMessage``), big-endian::

    TOTALSIZE int32 | MAGIC int32 (0) | BODYCRC int32 (0) | FLAG int32 | BODY LEN int32 | BODY | PROPS LEN int16 | PROPS

TOTALSIZE counts the whole message, itself included: 22 + body + properties bytes. The topic, queue, sysFlag and
born timestamp are the request header's, for every message; each message carries its own properties (its UNIQ_KEY
among them). A body that does not follow this exactly is refused whole (MessageIllegalError naming the message
and the byte), before anything is stored.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from broker.errors import MessageIllegalError
from broker.format.message import (
    DEFAULT_MAX_MESSAGE_SIZE,
    PROPS_LEN,
    encode_entry,
    encode_properties,
    pack_ipv4,
)
from broker.remoting.message_properties import parse_properties_bytes

ITEM_HEAD = struct.Struct(">iiiii")  # TOTALSIZE, MAGIC, BODYCRC, FLAG, BODY LEN
MIN_ITEM_SIZE = ITEM_HEAD.size + PROPS_LEN.size  # 22: an empty body, no properties
# Messages in one batch: a 4.x producer's batch is bounded by its 4 MiB maxMessageSize, which holds at most
# 4 MiB / 22 empty messages; the broker caps the count far below that so a batch of empty messages cannot cost
# a per-message walk of hundreds of thousands.
MAX_BATCH_MESSAGES = 10_000


@dataclass
class BatchItem:
    body: bytes
    flag: int = 0
    properties: dict[str, str] = field(default_factory=dict)


def decode_batch(body: bytes, max_messages: int = MAX_BATCH_MESSAGES) -> list[BatchItem]:
    """Every message of a batch body; MessageIllegalError for an empty or malformed one."""
    if not body:
        raise MessageIllegalError("SEND_BATCH_MESSAGE carries no messages (an empty body); nothing stored")
    items: list[BatchItem] = []
    pos = 0
    while pos < len(body):
        i = len(items)
        if i >= max_messages:
            raise MessageIllegalError(f"the batch holds more than {max_messages} messages; send smaller batches")
        where = f"batch message {i} (byte {pos})"
        if pos + MIN_ITEM_SIZE > len(body):
            raise MessageIllegalError(
                f"{where}: {len(body) - pos} bytes left, fewer than the {MIN_ITEM_SIZE} of an empty message; "
                "nothing stored"
            )
        total, _magic, _crc, flag, body_len = ITEM_HEAD.unpack_from(body, pos)
        if total < MIN_ITEM_SIZE or pos + total > len(body):
            raise MessageIllegalError(
                f"{where}: TOTALSIZE {total} does not fit the {len(body) - pos} bytes left; nothing stored"
            )
        props_len_at = pos + ITEM_HEAD.size + body_len
        if body_len < 0 or props_len_at + PROPS_LEN.size > pos + total:
            raise MessageIllegalError(f"{where}: body length {body_len} does not fit TOTALSIZE {total}; nothing stored")
        props_len = PROPS_LEN.unpack_from(body, props_len_at)[0]
        props_at = props_len_at + PROPS_LEN.size
        if props_len < 0 or props_at + props_len != pos + total:
            raise MessageIllegalError(
                f"{where}: properties length {props_len} does not end at TOTALSIZE {total}; nothing stored"
            )
        items.append(BatchItem(body[pos + ITEM_HEAD.size : props_len_at], flag,
                               parse_properties_bytes(body[props_at : props_at + props_len])))
        pos += total
    return items


def encode_batch(items: list[BatchItem]) -> bytes:
    """A batch body as a 4.x producer writes it (MAGIC and BODYCRC 0)."""
    out = []
    for item in items:
        props = encode_properties(item.properties)
        total = MIN_ITEM_SIZE + len(item.body) + len(props)
        out += [ITEM_HEAD.pack(total, 0, 0, item.flag, len(item.body)), item.body, PROPS_LEN.pack(len(props)), props]
    return b"".join(out)


def sluice_batch(
    items: list[BatchItem], topic: str, queue_id: int, *, sys_flag: int, born_timestamp: int, born_host: str,
    reconsume_times: int = 0, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
) -> bytes:
    """The batch as Sluice's SendBatch takes it (commit-log entries, store fields left 0): what the send processor
    validates and stores, exactly as it does a batch of its own clients."""
    ip, _, port = born_host.rpartition(":")
    born_ip, born_port = pack_ipv4(ip), int(port) if port.isdigit() else 0
    raw_topic = topic.encode("utf-8")
    return b"".join(
        encode_entry(raw_topic, queue_id, item.body, encode_properties(item.properties), flag=item.flag,
                     sys_flag=sys_flag, born_timestamp=born_timestamp, born_ip=born_ip, born_port=born_port,
                     reconsume_times=reconsume_times, max_message_size=max_message_size)
        for item in items
    )
