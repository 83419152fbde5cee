"""Messages between the protocol's ``Message`` and Sluice's stored message, as the RocketMQ proxy converts them.

Sending: tag to ``TAGS``, keys to ``KEYS`` (space-separated), the client's message id to ``UNIQ_KEY`` (the id every
later answer, query and dead-letter record uses), message group to ``__SHARDINGKEY``, delivery timestamp to
``TIMER_DELIVER_MS``, born host and time, and the user properties (a user property with a name the system uses is
refused). GZIP bodies are stored as sent with the COMPRESSED flag, as RocketMQ does.

Receiving: the reverse, plus the message id (``UNIQ_KEY``, else the offset msgId of a message sent without one),
body digest (MD5), store host and time, queue id and offset, delivery attempt, receipt handle, and for dead letters
their origin topic and message id.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from google.protobuf import timestamp_pb2
from rocketmq.grpc_protocol import definition_pb2 as v2

from broker.errors import MessageIllegalError
from broker.format.message import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR, Prop, StoredMessage, SysFlag
from broker.semantics.retry import DLQ_ORIGIN_MESSAGE_ID, DLQ_ORIGIN_TOPIC

BORN_HOST = "__BORNHOST"  # RocketMQ's MessageConst.PROPERTY_BORN_HOST
TRACE_CONTEXT = "TRACE_CONTEXT"
MAX_USER_PROPERTIES = 128  # RocketMQ proxy's userPropertyMaxNum
MAX_USER_PROPERTY_BYTES = 16 * 1024  # RocketMQ proxy's maxUserPropertySize
MAX_MESSAGE_GROUP_BYTES = 64  # RocketMQ proxy's maxMessageGroupSize
# google.protobuf.Timestamp's range (0001-01-01 .. 9999-12-31 23:59:59.999), in milliseconds since the epoch
MIN_TIMESTAMP_MS, MAX_TIMESTAMP_MS = -62_135_596_800_000, 253_402_300_799_999

# Property names the system owns (RocketMQ's MessageConst.STRING_HASH_SET and the ones this protocol maps): not
# sendable as user properties, not shown as ones.
SYSTEM_PROPERTIES = frozenset({
    "TRACE_ON", "MSG_REGION", Prop.KEYS, Prop.TAGS, Prop.WAIT, Prop.DELAY, Prop.RETRY_TOPIC, Prop.REAL_TOPIC,
    Prop.REAL_QID, Prop.TRAN_MSG, Prop.PGROUP, Prop.MIN_OFFSET, Prop.MAX_OFFSET, "BUYER_ID", Prop.ORIGIN_MESSAGE_ID,
    "TRANSFER_FLAG", "CORRECTION_FLAG", "MQ2_FLAG", Prop.RECONSUME_TIME, Prop.UNIQ_KEY, Prop.MAX_RECONSUME_TIMES,
    Prop.CONSUME_START_TIME, "POP_CK", "POP_CK_OFFSET", "1ST_POP_TIME", Prop.TRAN_PREPARED_QUEUE_OFFSET, "DUP_INFO",
    "EXTEND_UNIQ_INFO", "INSTANCE_ID", "CORRELATION_ID", "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME",
    "CLUSTER", "MSG_TYPE", "INNER_MULTI_QUEUE_OFFSET", Prop.TIMER_DELAY_MS, Prop.TIMER_DELAY_SEC,
    Prop.TIMER_DELIVER_MS, "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES", "TIMER_OUT_MS",
    "TIMER_DEL_UNIQKEY", "TIMER_DELAY_LEVEL", BORN_HOST, "BORN_TIMESTAMP", DLQ_ORIGIN_TOPIC, DLQ_ORIGIN_MESSAGE_ID,
    "__CRC32#", Prop.SHARDING_KEY, Prop.TRANSACTION_ID, Prop.TRANSACTION_CHECK_TIMES,
    Prop.CHECK_IMMUNITY_TIME_IN_SECONDS, TRACE_CONTEXT,
})


@dataclass
class Outgoing:
    """A protocol message ready for Sluice's send path."""

    topic: str
    body: bytes
    properties: dict[str, str]
    sys_flag: int
    born_timestamp_ms: int
    message_type: int
    message_group: str
    message_id: str


def _has_separator(text: str) -> bool:
    return NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text


def _control(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def to_sluice(m: v2.Message, born_host: str) -> Outgoing:
    """MessageIllegalError naming the field for anything the proxy refuses (its codes come from codes.py)."""
    sp = m.system_properties
    if not sp.message_id:
        raise MessageIllegalError("message id is empty: every message needs the id its client made")
    props: dict[str, str] = {}
    size = 0
    if len(m.user_properties) > MAX_USER_PROPERTIES:
        raise MessageIllegalError(f"{len(m.user_properties)} user properties; at most {MAX_USER_PROPERTIES}")
    for name, value in m.user_properties.items():
        if name in SYSTEM_PROPERTIES:
            raise MessageIllegalError(f"user property {name!r} is a name the system uses; rename it")
        if _control(name) or _control(value):
            raise MessageIllegalError(f"user property {name!r} has a control character")
        size += len(name.encode()) + len(value.encode())
        props[name] = value
    if sp.tag:
        if sp.tag.isspace() or "|" in sp.tag or _control(sp.tag):
            raise MessageIllegalError(f"tag {sp.tag!r} is blank or holds '|' or a control character")
        props[Prop.TAGS] = sp.tag
        size += len(sp.tag.encode())
    keys = [k for k in sp.keys if k]
    for k in keys:
        if k.isspace() or " " in k or _control(k):
            raise MessageIllegalError(f"key {k!r} holds whitespace or a control character")
        size += len(k.encode())
    if keys:
        props[Prop.KEYS] = " ".join(keys)
    if size > MAX_USER_PROPERTY_BYTES:
        raise MessageIllegalError(f"user properties, tag and keys are {size} bytes; at most {MAX_USER_PROPERTY_BYTES}")
    props[Prop.UNIQ_KEY] = sp.message_id
    if sp.message_group:
        if len(sp.message_group.encode()) >= MAX_MESSAGE_GROUP_BYTES or _control(sp.message_group):
            raise MessageIllegalError(
                f"message group {sp.message_group[:40]!r} must be under {MAX_MESSAGE_GROUP_BYTES} bytes, no control "
                "characters"
            )
        props[Prop.SHARDING_KEY] = sp.message_group
    if sp.HasField("delivery_timestamp"):
        props[Prop.TIMER_DELIVER_MS] = str(millis(sp.delivery_timestamp, "delivery timestamp"))
    if sp.delivery_attempt > 0:
        props[Prop.RECONSUME_TIME] = str(sp.delivery_attempt)
    if sp.trace_context:
        props[TRACE_CONTEXT] = sp.trace_context
    if sp.born_host or born_host:
        props[BORN_HOST] = sp.born_host or born_host
    if sp.message_type == v2.TRANSACTION and sp.HasField("orphaned_transaction_recovery_duration"):
        props[Prop.CHECK_IMMUNITY_TIME_IN_SECONDS] = str(sp.orphaned_transaction_recovery_duration.seconds)
    if any(_has_separator(k) or _has_separator(v) for k, v in props.items()):
        raise MessageIllegalError("a property holds a \\x01 or \\x02 byte, which the store reserves as separators")
    sys_flag = SysFlag.COMPRESSED if sp.body_encoding == v2.GZIP else 0
    born = millis(sp.born_timestamp, "born timestamp") if sp.HasField("born_timestamp") else 0
    return Outgoing(m.topic.name, bytes(m.body), props, sys_flag, born, sp.message_type, sp.message_group,
                    sp.message_id)


def message_id(msg: StoredMessage) -> str:
    """The id clients know a message by: its UNIQ_KEY, else (sent without one) its offset msgId."""
    return msg.properties.get(Prop.UNIQ_KEY) or msg.msg_id


def millis(value: timestamp_pb2.Timestamp, what: str) -> int:
    """A Timestamp's milliseconds; MessageIllegalError for one outside Timestamp's range (year 1 to 9999), where
    protobuf's conversion raises ValueError: a bad request, not a broker failure."""
    try:
        return int(value.ToMilliseconds())
    except ValueError as e:
        raise MessageIllegalError(f"{what} is out of range ({e})") from None


def _timestamp(ms: int) -> timestamp_pb2.Timestamp:
    """``ms`` as a Timestamp, held to Timestamp's range: a message sent through sluice.v1 may carry any born time
    or TIMER_DELIVER_MS, and reading it must not fail."""
    ts = timestamp_pb2.Timestamp()
    ts.FromMilliseconds(min(max(ms, MIN_TIMESTAMP_MS), MAX_TIMESTAMP_MS))
    return ts


def to_v2(msg: StoredMessage, *, receipt_handle: str = "", attempt: int = 0, invisible_ms: int = 0) -> v2.Message:
    props = msg.properties
    sp = v2.SystemProperties(
        message_id=message_id(msg),
        body_digest=v2.Digest(type=v2.MD5, checksum=hashlib.md5(msg.body).hexdigest().upper()),
        body_encoding=v2.GZIP if msg.sys_flag & SysFlag.COMPRESSED else v2.IDENTITY,
        born_timestamp=_timestamp(msg.born_timestamp),
        born_host=props.get(BORN_HOST) or msg.born_host,
        store_timestamp=_timestamp(msg.store_timestamp),
        store_host=msg.store_host,
        queue_id=msg.queue_id,
        queue_offset=msg.queue_offset,
        delivery_attempt=attempt or max(msg.reconsume_times, 0) + 1,
    )
    if Prop.TAGS in props:
        sp.tag = props[Prop.TAGS]
    if props.get(Prop.KEYS):
        sp.keys.extend(props[Prop.KEYS].split(" "))
    if props.get(Prop.TRAN_MSG) == "true":
        sp.message_type = v2.TRANSACTION
    elif Prop.DELAY in props or Prop.TIMER_DELIVER_MS in props or Prop.TIMER_DELAY_SEC in props:
        sp.message_type = v2.DELAY
    elif Prop.SHARDING_KEY in props:
        sp.message_type = v2.FIFO
    else:
        sp.message_type = v2.NORMAL
    deliver = props.get(Prop.TIMER_DELIVER_MS, "")
    if deliver.lstrip("-").isdigit():
        sp.delivery_timestamp.CopyFrom(_timestamp(int(deliver)))
    if Prop.SHARDING_KEY in props:
        sp.message_group = props[Prop.SHARDING_KEY]
    if receipt_handle:
        sp.receipt_handle = receipt_handle
        sp.invisible_duration.FromMilliseconds(invisible_ms)
    if TRACE_CONTEXT in props:
        sp.trace_context = props[TRACE_CONTEXT]
    if DLQ_ORIGIN_TOPIC in props and DLQ_ORIGIN_MESSAGE_ID in props:
        sp.dead_letter_queue.topic = props[DLQ_ORIGIN_TOPIC]
        sp.dead_letter_queue.message_id = props[DLQ_ORIGIN_MESSAGE_ID]
    user = {k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES}
    return v2.Message(topic=v2.Resource(name=msg.topic), user_properties=user, system_properties=sp, body=msg.body)
