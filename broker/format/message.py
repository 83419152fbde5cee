"""The commit-log entry: RocketMQ's v1 message format, byte for byte.

One entry, big-endian (offsets in bytes)::

    0        4        8        12       16       20               28               36
    +--------+--------+--------+--------+--------+----------------+----------------+--------+
    |TOTALSIZE| MAGIC |BODYCRC |QUEUEID | FLAG   |  QUEUEOFFSET   | PHYSICALOFFSET |SYSFLAG |
    +--------+--------+--------+--------+--------+----------------+----------------+--------+
    40               48      52       56               64      68       72       76
    +----------------+--------+--------+----------------+--------+--------+--------+----------------+
    | BORNTIMESTAMP  |BORN IP |BORNPORT| STORETIMESTAMP |STORE IP|STOREPRT|RECONSUM| PREPARED TX OFF|
    +----------------+--------+--------+----------------+--------+--------+--------+----------------+
    84       88                 88+b  89+b             89+b+t  91+b+t
    +--------+------ ... ------+-----+------ ... -----+-------+------ ... ------+
    |BODY LEN|      BODY       |TLEN | TOPIC          |PROPLEN|   PROPERTIES    |
    +--------+------ ... ------+-----+------ ... -----+-------+------ ... ------+

The 88-byte fixed part (through BODY LEN) is ``ENTRY_HEADER``; TOPIC LEN is one signed byte (so a topic is at most
127 bytes) and PROPERTIES LEN a signed short (at most 32767 bytes), exactly as RocketMQ writes them, so a file
either side wrote reads the same on the other. BODYCRC is ``crc32(body) & 0x7FFFFFFF`` (RocketMQ's
``UtilAll.crc32``). At the end of a file the rest is one blank entry: TOTALSIZE = bytes left, MAGIC = BLANK_MAGIC.

Properties are ``name \\x01 value \\x02`` repeated, with RocketMQ's property names (``Prop``).
"""

from __future__ import annotations

import functools
import re
import socket
import struct
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from broker.errors import CorruptionError, MessageIllegalError, shown

MESSAGE_MAGIC = -626843481  # 0xDAA320A7 as a signed int: a message entry
BLANK_MAGIC = -875286124  # 0xCBD43194: the blank entry filling the end of a file
END_FILE_MIN_BLANK_LENGTH = 8  # TOTALSIZE + MAGIC: every file keeps room for a blank entry's head

ENTRY_HEADER = struct.Struct(
    ">"
    "i"  # TOTALSIZE: whole entry length in bytes, this field included
    "i"  # MAGICCODE: MESSAGE_MAGIC or BLANK_MAGIC
    "i"  # BODYCRC: crc32(body) & 0x7FFFFFFF
    "i"  # QUEUEID: queue within the topic
    "i"  # FLAG: for the application, never interpreted
    "q"  # QUEUEOFFSET: index of this message in its consume queue
    "q"  # PHYSICALOFFSET: this entry's offset in the commit log
    "i"  # SYSFLAG: SysFlag bits (compression, multi tags, transaction type, IPv6 hosts)
    "q"  # BORNTIMESTAMP: producer clock, ms since the epoch
    "4s"  # BORNHOST ip: producer IPv4
    "i"  # BORNHOST port
    "q"  # STORETIMESTAMP: broker clock, ms, taken under the append lock so it never goes back
    "4s"  # STOREHOST ip: broker IPv4
    "i"  # STOREHOST port
    "i"  # RECONSUMETIMES: how many times the message was sent back for retry
    "q"  # PREPAREDTRANSACTIONOFFSET: for a committed transactional message, its half message's offset
    "i"  # BODY length, the body follows
)
assert ENTRY_HEADER.size == 88, ENTRY_HEADER.size


class EntryHeader(NamedTuple):
    total_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp: int
    born_ip: bytes
    born_port: int
    store_timestamp: int
    store_ip: bytes
    store_port: int
    reconsume_times: int
    prepared_transaction_offset: int
    body_length: int


assert len(EntryHeader._fields) == len(ENTRY_HEADER.unpack(bytes(ENTRY_HEADER.size)))

# Byte offsets of the fields the store fills in or reads directly (derived from ENTRY_HEADER above).
POS_TOTAL_SIZE = 0
POS_MAGIC = 4
POS_BODY_CRC = 8
POS_QUEUE_ID = 12
POS_QUEUE_OFFSET = 20
POS_PHYSICAL_OFFSET = 28
POS_SYS_FLAG = 36
POS_BORN_TIMESTAMP = 40
POS_STORE_TIMESTAMP = 56
POS_STORE_HOST = 64
POS_RECONSUME_TIMES = 72
POS_PREPARED_TX_OFFSET = 76
POS_BODY_LENGTH = 84
BODY_START = ENTRY_HEADER.size
MIN_ENTRY_SIZE = BODY_START + 1 + 1 + 2  # empty body, one-byte topic, no properties
assert struct.calcsize(">iiiii") == POS_QUEUE_OFFSET
assert struct.calcsize(">iiiiiqqiq4si") == POS_STORE_TIMESTAMP
assert struct.calcsize(">iiiiiqqiq4siq4sii") == POS_PREPARED_TX_OFFSET

PREFIX = struct.Struct(">ii")  # TOTALSIZE + MAGICCODE: enough to walk a file entry by entry
TOPIC_LEN = struct.Struct(">b")  # signed, as RocketMQ writes it
PROPS_LEN = struct.Struct(">h")  # signed, as RocketMQ writes it
I64 = struct.Struct(">q")
I32 = struct.Struct(">i")

MAX_TOPIC_BYTES = 127
MAX_PROPERTIES_BYTES = 32767
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024
TOPIC_PATTERN = re.compile(r"[%|a-zA-Z0-9_-]+")  # used with fullmatch: "$" would also admit a trailing "\n"
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"


class SysFlag:
    """RocketMQ's ``MessageSysFlag`` bits."""

    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_NOT_TYPE = 0
    TRANSACTION_PREPARED_TYPE = 0x1 << 2
    TRANSACTION_COMMIT_TYPE = 0x2 << 2
    TRANSACTION_ROLLBACK_TYPE = 0x3 << 2
    TRANSACTION_MASK = 0x3 << 2
    BORNHOST_V6 = 0x1 << 4
    STOREHOST_V6 = 0x1 << 5

    @staticmethod
    def transaction_type(sys_flag: int) -> int:
        return sys_flag & SysFlag.TRANSACTION_MASK


def in_place_transactional(sys_flag: int, prepared_transaction_offset: int) -> bool:
    """Whether an entry was written in its real queue by a transaction still to be decided there: transaction
    type PREPARED with the transaction's handle (> 0) in PREPARED TRANSACTION OFFSET (txn_visibility.py). RocketMQ
    never stores a PREPARED entry outside its half topic, and Sluice refuses transaction types from clients, so
    no other entry looks like one."""
    return sys_flag & SysFlag.TRANSACTION_MASK == SysFlag.TRANSACTION_PREPARED_TYPE and prepared_transaction_offset > 0


def delivered_sys_flag(sys_flag: int, prepared_transaction_offset: int) -> int:
    """SYSFLAG for a copy of a delivered message (a retry, a dead letter): an in-place transactional entry that a
    reader was given is a committed one, and its copy is a committed message (type COMMIT, as the half/op path
    stores them), never a new in-place entry nor a PREPARED one no queue would take."""
    if in_place_transactional(sys_flag, prepared_transaction_offset):
        return (sys_flag & ~SysFlag.TRANSACTION_MASK) | SysFlag.TRANSACTION_COMMIT_TYPE
    return sys_flag


def takes_queue_offset(sys_flag: int, prepared_transaction_offset: int) -> bool:
    """Whether an entry gets a unit in its consume queue: as RocketMQ, not a PREPARED (half) or ROLLBACK entry,
    except an in-place transactional one, which readers skip until its transaction's marker shows it."""
    tx = sys_flag & SysFlag.TRANSACTION_MASK
    if tx == SysFlag.TRANSACTION_PREPARED_TYPE:
        return prepared_transaction_offset > 0
    return tx != SysFlag.TRANSACTION_ROLLBACK_TYPE


class Prop:
    """Property names, spelled as RocketMQ's ``MessageConst`` so stored data reads the same."""

    KEYS = "KEYS"
    TAGS = "TAGS"
    WAIT = "WAIT"  # "false": the producer does not wait for SYNC_FLUSH
    DELAY = "DELAY"  # delay level 1..18
    RETRY_TOPIC = "RETRY_TOPIC"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QID = "REAL_QID"
    TRAN_MSG = "TRAN_MSG"
    PGROUP = "PGROUP"
    MIN_OFFSET = "MIN_OFFSET"
    MAX_OFFSET = "MAX_OFFSET"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    RECONSUME_TIME = "RECONSUME_TIME"
    UNIQ_KEY = "UNIQ_KEY"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    CONSUME_START_TIME = "CONSUME_START_TIME"
    TRAN_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
    TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
    CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
    SHARDING_KEY = "__SHARDINGKEY"
    TIMER_DELIVER_MS = "TIMER_DELIVER_MS"  # a timer message's delivery time, ms since the epoch
    TIMER_DELAY_SEC = "TIMER_DELAY_SEC"  # ... or its delay from the send, in s or ms (made absolute at the send)
    TIMER_DELAY_MS = "TIMER_DELAY_MS"
    TRANSACTION_ID = "__transactionId__"


# --------------------------------------------------------------------------------------------- checksums, hashes


def body_crc(body: bytes | memoryview) -> int:
    """RocketMQ's ``UtilAll.crc32``: IEEE CRC-32 masked to 31 bits so it fits a signed int."""
    return zlib.crc32(body) & 0x7FFFFFFF


@functools.lru_cache(maxsize=65536)
def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode``: 31-polynomial over UTF-16 code units, wrapped to a signed 32-bit int."""
    h = 0
    if s.isascii():
        for c in s.encode("ascii"):
            h = (31 * h + c) & 0xFFFFFFFF
    else:
        units = s.encode("utf-16-be")
        for i in range(0, len(units), 2):
            h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def tag_hash_code(tags: str | None) -> int:
    """The consume queue's tag field: ``String.hashCode`` of the tag, 0 for a message with no tag."""
    return java_string_hash(tags) if tags else 0


# ------------------------------------------------------------------------------------------------- hosts, ids


def pack_ipv4(host: str) -> bytes:
    """Four address bytes for a dotted IPv4 string; '' or a host name counts as 127.0.0.1."""
    try:
        return socket.inet_aton(host)
    except OSError:
        return b"\x7f\x00\x00\x01"


def msg_id_prefix_of(store_ip: bytes, store_port: int) -> str:
    """The store host part of an offset message id (IPv4 + port, 16 upper-case hex characters): one per broker, so
    a batch's answer carries it once and its message ids are made on demand (``msg_id_at``)."""
    return (store_ip + I32.pack(store_port)).hex().upper()


def msg_id_at(prefix: str, commitlog_offset: int) -> str:
    """The offset message id of the entry at ``commitlog_offset`` of the store ``prefix`` names: 32 upper-case hex
    characters (the format ``parse_msg_id`` reads)."""
    return f"{prefix}{commitlog_offset:016X}"


def make_msg_id(store_ip: bytes, store_port: int, commitlog_offset: int) -> str:
    """The offset message id: store IPv4 + port + commit log offset as 32 upper-case hex characters."""
    return msg_id_at(msg_id_prefix_of(store_ip, store_port), commitlog_offset)


class MsgIdParts(NamedTuple):
    store_ip: bytes
    store_port: int
    commitlog_offset: int


def parse_msg_id(msg_id: str) -> MsgIdParts:
    if len(msg_id) != 32:
        raise MessageIllegalError(f"msgId {shown(msg_id)} must be 32 hex characters (IPv4, port, commit log offset)")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise MessageIllegalError(f"msgId {shown(msg_id)} is not hexadecimal") from None
    return MsgIdParts(raw[:4], I32.unpack_from(raw, 4)[0], I64.unpack_from(raw, 8)[0])


# ------------------------------------------------------------------------------------------------- properties


def encode_properties(props: Mapping[str, str]) -> bytes:
    if not props:
        return b""
    text = "".join([f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}" for name, value in props.items()])
    # Each pair adds exactly one of each separator: a name or value holding one makes a count exceed len(props).
    if text.count(NAME_VALUE_SEPARATOR) != len(props) or text.count(PROPERTY_SEPARATOR) != len(props):
        for name, value in props.items():
            if any(sep in name or sep in value for sep in (NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR)):
                raise MessageIllegalError(
                    f"property {shown(name)} contains a \\x01 or \\x02 byte, which the format reserves as separators"
                )
    return text.encode("utf-8")


def decode_properties(raw: bytes | memoryview) -> dict[str, str]:
    if not raw:
        return {}
    props: dict[str, str] = {}
    for item in bytes(raw).decode("utf-8", "replace").split(PROPERTY_SEPARATOR):
        if item:
            name, _, value = item.partition(NAME_VALUE_SEPARATOR)
            props[name] = value
    return props


def properties_complete(buf: bytes | bytearray | memoryview, props_start: int, props_len: int) -> bool:
    """Whether a PROPERTIES field is empty or ends with a non-zero byte. A copy cut short by a crash leaves the
    tail of the entry zero, and framing alone admits it. Every encoding of name\x01value pairs ends with \x02
    (encode_properties, RocketMQ's messageProperties2String) or, from encoders that leave the last separator
    off (RocketMQ's batch encoder allows for them), with a value's last character: never with \x00. So this,
    not "ends with \x02", is the rule: a log another writer made is never cut where it is whole."""
    return props_len == 0 or buf[props_start + props_len - 1] != 0


def is_topic_name(raw: bytes) -> bool:
    """Whether stored TOPIC bytes are a name validate_topic accepts (a torn write leaves zeros there)."""
    return raw.isascii() and TOPIC_PATTERN.fullmatch(raw.decode("ascii")) is not None


# ------------------------------------------------------------------------------------------------- validation


def validate_topic(topic: str) -> bytes:
    """The topic as stored bytes, or MessageIllegalError saying which rule it broke."""
    if not topic:
        raise MessageIllegalError("topic is empty; give a name of letters, digits, '%', '|', '_' or '-'")
    if not TOPIC_PATTERN.fullmatch(topic):
        raise MessageIllegalError(
            f"topic {shown(topic)} has characters outside ^[%|a-zA-Z0-9_-]+$; rename it with only those"
        )
    raw = topic.encode("ascii")
    if len(raw) > MAX_TOPIC_BYTES:
        raise MessageIllegalError(f"topic {topic[:40]!r}... is {len(raw)} bytes; the limit is {MAX_TOPIC_BYTES}")
    return raw


# ------------------------------------------------------------------------------------------------- encoding


DEFAULT_BORN_IP = b"\x7f\x00\x00\x01"  # BORNHOST of an entry a client encodes (the broker keeps what it is sent)
UNSET_STORE_IP = b"\x00\x00\x00\x00"  # STOREHOST until the store fills it in at append time


def entry_size(body_len: int, topic_len: int, props_len: int) -> int:
    return ENTRY_HEADER.size + body_len + 1 + topic_len + 2 + props_len


def encode_entry(
    topic: bytes,
    queue_id: int,
    body: bytes,
    properties: bytes = b"",
    *,
    flag: int = 0,
    sys_flag: int = 0,
    born_timestamp: int = 0,
    born_ip: bytes = DEFAULT_BORN_IP,
    born_port: int = 0,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    queue_offset: int = 0,
    physical_offset: int = 0,
    store_timestamp: int = 0,
    store_ip: bytes = UNSET_STORE_IP,
    store_port: int = 0,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
) -> bytes:
    """One complete entry. Producers leave the store fields at 0; the store fills them in at append time."""
    if len(body) > max_message_size:
        raise MessageIllegalError(
            f"body is {len(body)} bytes, over maxMessageSize {max_message_size}; split it or raise the limit"
        )
    if len(properties) > MAX_PROPERTIES_BYTES:
        raise MessageIllegalError(
            f"properties are {len(properties)} bytes, over {MAX_PROPERTIES_BYTES}; store big values in the body"
        )
    if len(topic) > MAX_TOPIC_BYTES:
        raise MessageIllegalError(f"topic is {len(topic)} bytes; the limit is {MAX_TOPIC_BYTES}")
    total = entry_size(len(body), len(topic), len(properties))
    head = ENTRY_HEADER.pack(
        total, MESSAGE_MAGIC, body_crc(body), queue_id, flag, queue_offset, physical_offset, sys_flag,
        born_timestamp, born_ip, born_port, store_timestamp, store_ip, store_port, reconsume_times,
        prepared_transaction_offset, len(body),
    )
    return b"".join((head, body, TOPIC_LEN.pack(len(topic)), topic, PROPS_LEN.pack(len(properties)), properties))


def encode_blank(length: int) -> bytes:
    """The blank entry that fills the rest of a file: only its head is meaningful."""
    assert length >= END_FILE_MIN_BLANK_LENGTH, length
    return PREFIX.pack(length, BLANK_MAGIC)


# ------------------------------------------------------------------------------------------------- decoding


@dataclass(slots=True)
class StoredMessage:
    """A decoded commit-log entry, with the names the client API exposes."""

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: str = ""
    store_timestamp: int = 0
    store_host: str = ""
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    store_size: int = 0
    msg_id: str = ""

    @property
    def tags(self) -> str | None:
        return self.properties.get("TAGS")  # Prop.TAGS, without its lookup: a consumer reads this once a message

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get("KEYS", "")  # Prop.KEYS
        if " " not in raw:  # one key or none, the common case: no split
            return [raw] if raw else []
        return [k for k in raw.split(" ") if k]


class EntryLayout(NamedTuple):
    """Where the variable parts of one entry lie, relative to the entry's start."""

    header: EntryHeader
    body_start: int
    topic_start: int
    topic_len: int
    props_start: int
    props_len: int


def parse_layout(buf: bytes | memoryview, pos: int, limit: int, path: str = "", base: int = 0) -> EntryLayout:
    """Check one message entry's framing (not its CRC) and say where its parts are.

    ``limit`` is the end of readable bytes in ``buf``; ``path``/``base`` only make error messages precise.
    """
    if pos + ENTRY_HEADER.size > limit:
        raise CorruptionError("entry header runs past the end of written data", path, base + pos)
    h = EntryHeader._make(ENTRY_HEADER.unpack_from(buf, pos))
    if h.magic != MESSAGE_MAGIC:
        raise CorruptionError(f"bad magic {h.magic:#x}, expected {MESSAGE_MAGIC & 0xFFFFFFFF:#x}", path, base + pos)
    if h.sys_flag & (SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6):
        raise CorruptionError("IPv6 host flags are not supported by this store", path, base + pos)
    body_start = pos + BODY_START
    topic_len_at = body_start + h.body_length
    if h.body_length < 0 or topic_len_at + 1 > pos + h.total_size or pos + h.total_size > limit:
        raise CorruptionError(
            f"body length {h.body_length} does not fit entry of {h.total_size} bytes", path, base + pos
        )
    topic_len = buf[topic_len_at]
    topic_len = topic_len - 256 if topic_len > 127 else topic_len
    props_len_at = topic_len_at + 1 + topic_len
    if topic_len <= 0 or props_len_at + 2 > pos + h.total_size:
        raise CorruptionError(f"topic length {topic_len} does not fit the entry", path, base + pos)
    props_len = PROPS_LEN.unpack_from(buf, props_len_at)[0]
    if props_len < 0 or props_len_at + 2 + props_len != pos + h.total_size:
        raise CorruptionError(
            f"lengths (body {h.body_length}, topic {topic_len}, properties {props_len}) do not add up to "
            f"TOTALSIZE {h.total_size}",
            path,
            base + pos,
        )
    return EntryLayout(h, body_start, topic_len_at + 1, topic_len, props_len_at + 2, props_len)


# Indexes into an ENTRY_HEADER tuple, for loops where a NamedTuple per entry would cost more than the work.
H_BODY_CRC = EntryHeader._fields.index("body_crc")
H_QUEUE_ID = EntryHeader._fields.index("queue_id")
H_QUEUE_OFFSET = EntryHeader._fields.index("queue_offset")
H_SYS_FLAG = EntryHeader._fields.index("sys_flag")
H_STORE_TIMESTAMP = EntryHeader._fields.index("store_timestamp")
H_PREPARED_TX_OFFSET = EntryHeader._fields.index("prepared_transaction_offset")
H_BODY_LENGTH = EntryHeader._fields.index("body_length")
_V6_FLAGS = SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6


def quick_layout(buf: bytes, pos: int, limit: int) -> tuple[tuple, int, int, int] | None:
    """parse_layout's framing checks without building NamedTuples, for per-entry loops over many small entries:
    (header tuple, topic start, topic length, properties length) when the entry is well framed; None when it is
    not, and parse_layout (the definition) must say why."""
    if pos + ENTRY_HEADER.size > limit:
        return None
    h = ENTRY_HEADER.unpack_from(buf, pos)
    total, body_len = h[0], h[H_BODY_LENGTH]
    end = pos + total
    topic_at = pos + BODY_START + body_len + 1
    if h[1] != MESSAGE_MAGIC or h[H_SYS_FLAG] & _V6_FLAGS or body_len < 0 or end > limit or topic_at >= end:
        return None
    topic_len = buf[topic_at - 1]
    props_at = topic_at + topic_len + 2
    if not 0 < topic_len < 128 or props_at > end:
        return None
    props_len = PROPS_LEN.unpack_from(buf, props_at - 2)[0]
    if props_at + props_len != end:
        return None
    return h, topic_at, topic_len, props_len


def check_crc(buf: bytes | memoryview, lay: EntryLayout, path: str = "", base: int = 0, pos: int = 0) -> None:
    h = lay.header
    crc = body_crc(buf[lay.body_start : lay.body_start + h.body_length])
    if crc != h.body_crc:
        raise CorruptionError(f"body CRC {crc:#x} != stored {h.body_crc:#x}", path, base + pos)


def _host(ip: bytes, port: int) -> str:
    return f"{socket.inet_ntoa(ip)}:{port}"


def decode_entry(
    buf: bytes | memoryview, pos: int = 0, limit: int | None = None, *, verify_crc: bool = False
) -> StoredMessage:
    """Decode the message entry at ``pos``; raises CorruptionError on bad framing (or CRC when asked)."""
    lim = len(buf) if limit is None else limit
    lay = parse_layout(buf, pos, lim)
    if verify_crc:
        check_crc(buf, lay, pos=pos)
    h = lay.header
    body = bytes(buf[lay.body_start : lay.body_start + h.body_length])
    topic = bytes(buf[lay.topic_start : lay.topic_start + lay.topic_len]).decode("ascii", "replace")
    props = decode_properties(buf[lay.props_start : lay.props_start + lay.props_len])
    return StoredMessage(
        topic=topic,
        queue_id=h.queue_id,
        queue_offset=h.queue_offset,
        commitlog_offset=h.physical_offset,
        body=body,
        properties=props,
        flag=h.flag,
        sys_flag=h.sys_flag,
        born_timestamp=h.born_timestamp,
        born_host=_host(h.born_ip, h.born_port),
        store_timestamp=h.store_timestamp,
        store_host=_host(h.store_ip, h.store_port),
        reconsume_times=h.reconsume_times,
        prepared_transaction_offset=h.prepared_transaction_offset,
        store_size=h.total_size,
        msg_id=make_msg_id(h.store_ip, h.store_port, h.physical_offset),
    )


def iter_entries(buf: bytes | memoryview, pos: int = 0, limit: int | None = None) -> Iterator[StoredMessage]:
    """Decode consecutive message entries (as a pull returns them) until ``limit``."""
    lim = len(buf) if limit is None else limit
    while pos < lim:
        total, magic = PREFIX.unpack_from(buf, pos)
        if magic == BLANK_MAGIC:
            pos += total
            continue
        yield decode_entry(buf, pos, lim)
        pos += total
