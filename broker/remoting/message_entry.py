"""The stored message as a 4.x client's ``MessageDecoder`` reads it (PULL_MESSAGE, VIEW_MESSAGE_BY_ID, QUERY_MESSAGE
bodies: entries back to back), and the offset message id.

The layout is the commit log's (``broker.format.message``), field for field; only the two host fields change width
with the sysFlag bits BORNHOST_V6 and STOREHOST_V6 (16 address bytes instead of 4). ``FIELDS`` declares it once;
the four fixed heads (v4/v6 born host x v4/v6 store host) are built from it, and the v4/v4 one is checked at import
to be Sluice's ``ENTRY_HEADER``, so the bytes a pull answers are the stored bytes, unchanged. The store itself only
holds IPv4 entries; the v6 forms are read and written here for clients that send or expect them.

MAGIC and BODYCRC are ignored by 4.x clients but written as the store does. TOPIC has a one-byte length: a topic
is at most 127 bytes (what Sluice enforces everywhere).
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterator

from broker.errors import MessageIllegalError, shown
from broker.format.compression import BORNHOST_V6, STOREHOST_V6
from broker.format.message import (
    ENTRY_HEADER,
    MAX_PROPERTIES_BYTES,
    MAX_TOPIC_BYTES,
    MESSAGE_MAGIC,
    PROPS_LEN,
    TOPIC_LEN,
    StoredMessage,
    body_crc,
)
from broker.remoting.message_properties import format_properties, parse_properties_bytes

BORN_HOST, STORE_HOST = "born_host", "store_host"
# (name, struct code) in wire order, through BODY's length; a host is address bytes + port (int32).
FIELDS: tuple[tuple[str, str], ...] = (
    ("total_size", "i"),  # TOTALSIZE: the whole entry, this field included
    ("magic", "i"),  # MAGICCODE
    ("body_crc", "i"),  # BODYCRC: crc32(body) & 0x7FFFFFFF
    ("queue_id", "i"),  # QUEUEID
    ("flag", "i"),  # FLAG: the application's
    ("queue_offset", "q"),  # QUEUEOFFSET
    ("commitlog_offset", "q"),  # PHYSICALOFFSET
    ("sys_flag", "i"),  # SYSFLAG
    ("born_timestamp", "q"),  # BORNTIMESTAMP (ms)
    (BORN_HOST, ""),  # BORNHOST: 4 or 16 address bytes by BORNHOST_V6, then the port
    ("store_timestamp", "q"),  # STORETIMESTAMP (ms)
    (STORE_HOST, ""),  # STOREHOST: 4 or 16 address bytes by STOREHOST_V6, then the port
    ("reconsume_times", "i"),  # RECONSUMETIMES
    ("prepared_transaction_offset", "q"),  # PREPARED TRANSACTION OFFSET
    ("body_length", "i"),  # BODY length; BODY, TOPIC (1-byte length) and PROPERTIES (2-byte length) follow
)
V4_ADDRESS, V6_ADDRESS = 4, 16


def _head(born_v6: bool, store_v6: bool) -> struct.Struct:
    widths = {BORN_HOST: V6_ADDRESS if born_v6 else V4_ADDRESS, STORE_HOST: V6_ADDRESS if store_v6 else V4_ADDRESS}
    return struct.Struct(">" + "".join(f"{widths[n]}si" if n in widths else code for n, code in FIELDS))


HEADS = {(b, s): _head(b, s) for b in (False, True) for s in (False, True)}
assert HEADS[False, False].format == ENTRY_HEADER.format, "the v4 layout must be the commit log's"
_HEAD_NAMES = [part for n, _ in FIELDS for part in ((n + "_ip", n + "_port") if n in (BORN_HOST, STORE_HOST) else (n,))]
_POS_SYS_FLAG = struct.calcsize(">iiiiiqq")


def _head_for(sys_flag: int) -> struct.Struct:
    return HEADS[bool(sys_flag & BORNHOST_V6), bool(sys_flag & STOREHOST_V6)]


# --------------------------------------------------------------------------------------------------- hosts


def pack_host(host: str) -> tuple[bytes, int]:
    """``"ip:port"`` or ``"[v6]:port"`` -> (4 or 16 address bytes, port). MessageIllegalError for anything else."""
    addr, sep, port = host.rpartition(":")
    try:
        if not sep:
            raise ValueError("no port")
        ip = ipaddress.ip_address(addr.strip("[]"))
        return ip.packed, int(port)
    except ValueError:
        raise MessageIllegalError(f"host {shown(host)} is not ip:port") from None


def unpack_host(address: bytes, port: int) -> str:
    ip = ipaddress.ip_address(address)
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def host_flags(born_host: str, store_host: str) -> int:
    """The sysFlag host bits the two hosts' address families call for."""
    return (BORNHOST_V6 if len(pack_host(born_host)[0]) == V6_ADDRESS else 0) | (
        STOREHOST_V6 if len(pack_host(store_host)[0]) == V6_ADDRESS else 0
    )


# --------------------------------------------------------------------------------------------------- ids

_ID_PORT_OFFSET = struct.Struct(">iq")
V4_ID_CHARS = 2 * (V4_ADDRESS + _ID_PORT_OFFSET.size)  # 32
V6_ID_CHARS = 2 * (V6_ADDRESS + _ID_PORT_OFFSET.size)  # 56


def offset_msg_id(store_host: str, commitlog_offset: int) -> str:
    """RocketMQ's offset message id: store address, port (int32) and commit-log offset (int64), upper-case hex."""
    address, port = pack_host(store_host)
    return (address + _ID_PORT_OFFSET.pack(port, commitlog_offset)).hex().upper()


def parse_offset_msg_id(msg_id: str) -> tuple[str, int]:
    """(store host, commit-log offset) of an offset message id of 32 (IPv4) or 56 (IPv6) hex characters."""
    if len(msg_id) not in (V4_ID_CHARS, V6_ID_CHARS):
        raise MessageIllegalError(
            f"msgId {shown(msg_id)} must be {V4_ID_CHARS} or {V6_ID_CHARS} hex characters (store host, offset)"
        )
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise MessageIllegalError(f"msgId {shown(msg_id)} is not hexadecimal") from None
    width = len(raw) - _ID_PORT_OFFSET.size
    port, offset = _ID_PORT_OFFSET.unpack_from(raw, width)
    return unpack_host(raw[:width], port), offset


# --------------------------------------------------------------------------------------------------- entries


def encode_stored(m: StoredMessage) -> bytes:
    """One entry as a stored message is answered; the host bits of SYSFLAG follow the hosts' address families."""
    topic = m.topic.encode("utf-8")
    props = format_properties(m.properties).encode("utf-8")
    if len(topic) > MAX_TOPIC_BYTES or len(props) > MAX_PROPERTIES_BYTES:
        raise MessageIllegalError(
            f"topic ({len(topic)} bytes) or properties ({len(props)} bytes) over {MAX_TOPIC_BYTES} / "
            f"{MAX_PROPERTIES_BYTES}: a 4.x client could not read the entry"
        )
    sys_flag = (m.sys_flag & ~(BORNHOST_V6 | STOREHOST_V6)) | host_flags(m.born_host, m.store_host)
    head = _head_for(sys_flag)
    total = head.size + len(m.body) + TOPIC_LEN.size + len(topic) + PROPS_LEN.size + len(props)
    born_ip, born_port = pack_host(m.born_host)
    store_ip, store_port = pack_host(m.store_host)
    return b"".join((
        head.pack(total, MESSAGE_MAGIC, body_crc(m.body), m.queue_id, m.flag, m.queue_offset, m.commitlog_offset,
                  sys_flag, m.born_timestamp, born_ip, born_port, m.store_timestamp, store_ip, store_port,
                  m.reconsume_times, m.prepared_transaction_offset, len(m.body)),
        m.body, TOPIC_LEN.pack(len(topic)), topic, PROPS_LEN.pack(len(props)), props,
    ))


def decode_stored(buf: bytes, pos: int = 0) -> tuple[StoredMessage, int]:
    """The entry at ``pos`` and where the next one starts. MessageIllegalError when the lengths do not fit."""
    if pos + _POS_SYS_FLAG + 4 > len(buf):
        raise MessageIllegalError(f"entry at byte {pos}: {len(buf) - pos} bytes left, too few for a head")
    sys_flag = struct.unpack_from(">i", buf, pos + _POS_SYS_FLAG)[0]
    head = _head_for(sys_flag)
    if pos + head.size > len(buf):
        raise MessageIllegalError(f"entry at byte {pos}: {len(buf) - pos} bytes left, its head takes {head.size}")
    h = dict(zip(_HEAD_NAMES, head.unpack_from(buf, pos), strict=True))
    end = pos + h["total_size"]
    body_at = pos + head.size
    topic_len_at = body_at + h["body_length"]
    if h["total_size"] < head.size or end > len(buf) or h["body_length"] < 0 or topic_len_at + 1 > end:
        raise MessageIllegalError(
            f"entry at byte {pos}: TOTALSIZE {h['total_size']} / body length {h['body_length']} do not fit "
            f"the {len(buf) - pos} bytes left"
        )
    topic_len = TOPIC_LEN.unpack_from(buf, topic_len_at)[0]
    props_len_at = topic_len_at + 1 + topic_len
    if topic_len <= 0 or props_len_at + PROPS_LEN.size > end:
        raise MessageIllegalError(f"entry at byte {pos}: topic length {topic_len} does not fit the entry")
    props_len = PROPS_LEN.unpack_from(buf, props_len_at)[0]
    props_at = props_len_at + PROPS_LEN.size
    if props_len < 0 or props_at + props_len != end:
        raise MessageIllegalError(
            f"entry at byte {pos}: properties length {props_len} does not end at TOTALSIZE {h['total_size']}"
        )
    message = StoredMessage(
        topic=buf[topic_len_at + 1 : props_len_at].decode("utf-8", "replace"),
        queue_id=h["queue_id"], queue_offset=h["queue_offset"], commitlog_offset=h["commitlog_offset"],
        body=bytes(buf[body_at:topic_len_at]), properties=parse_properties_bytes(bytes(buf[props_at:end])),
        flag=h["flag"], sys_flag=sys_flag, born_timestamp=h["born_timestamp"],
        born_host=unpack_host(h["born_host_ip"], h["born_host_port"]), store_timestamp=h["store_timestamp"],
        store_host=unpack_host(h["store_host_ip"], h["store_host_port"]), reconsume_times=h["reconsume_times"],
        prepared_transaction_offset=h["prepared_transaction_offset"], store_size=h["total_size"],
    )
    message.msg_id = offset_msg_id(message.store_host, message.commitlog_offset)
    return message, end


def iter_stored(buf: bytes) -> Iterator[StoredMessage]:
    """Every entry of a body of entries back to back (a pull's answer)."""
    pos = 0
    while pos < len(buf):
        message, pos = decode_stored(buf, pos)
        yield message
