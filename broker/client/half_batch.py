"""Client side of batch transactions: a SendBatch buffer re-addressed as half messages, without decoding it.

A half entry differs from the entry the application encoded only in TOTALSIZE, QUEUEID (0), TOPIC
(``RMQ_SYS_TRANS_HALF_TOPIC``) and five properties appended at the end (REAL_TOPIC, REAL_QID, TRAN_MSG, PGROUP,
``__transactionId__``, in the order ``transaction_codec.half_properties`` writes them): BODYCRC covers the body
only, so the body and every other header field are copied as they are. The result is byte for byte what
``transaction_codec.rewrite_batch_as_half`` builds, at a fraction of its cost (it decodes and re-encodes every
entry), and the broker takes it on its fast path (only checked). Entries the byte-level rewrite cannot handle (one
already carrying a half property, or a transaction type in SYSFLAG) make the whole buffer go through
``rewrite_batch_as_half`` instead.
"""

from __future__ import annotations

from broker.errors import MessageIllegalError
from broker.semantics.system_topics import TRANS_HALF_TOPIC
from broker.semantics.transaction_codec import check_transaction_id, rewrite_batch_as_half
from broker.store.message import (
    BODY_START,
    I32,
    MAX_PROPERTIES_BYTES,
    MESSAGE_MAGIC,
    POS_BODY_LENGTH,
    POS_QUEUE_ID,
    POS_SYS_FLAG,
    PREFIX,
    PROPS_LEN,
    Prop,
    SysFlag,
)

HALF_TOPIC = TRANS_HALF_TOPIC.encode("ascii")
_HALF_TOPIC_FIELD = bytes([len(HALF_TOPIC)]) + HALF_TOPIC
_ZERO_QUEUE_ID = bytes(4)
# Any of these already inside a buffer: let the decoding rewrite decide (it refuses a foreign transaction id).
_RESERVED = tuple(f"{name}\x01".encode() for name in
                  (Prop.REAL_TOPIC, Prop.REAL_QID, Prop.TRAN_MSG, Prop.PGROUP, Prop.TRANSACTION_ID))  # fmt: skip


def _suffix(topic: bytes, queue_id: int, group: str, txn_id: str) -> bytes:
    return (
        f"{Prop.REAL_TOPIC}\x01{topic.decode('ascii')}\x02{Prop.REAL_QID}\x01{queue_id}\x02"
        f"{Prop.TRAN_MSG}\x01true\x02{Prop.PGROUP}\x01{group}\x02{Prop.TRANSACTION_ID}\x01{txn_id}\x02"
    ).encode()


def to_half_batch(buffer: bytes, producer_group: str, txn_id: str) -> bytes:
    """``buffer`` (entries from ``encode_entry``/``encode_message``) as half entries of ``txn_id``."""
    check_transaction_id(txn_id)
    if any(mark in buffer for mark in _RESERVED):
        return rewrite_batch_as_half(buffer, producer_group, txn_id)[0]
    out: list[bytes] = []
    append = out.append
    suffixes: dict[tuple[bytes, int], bytes] = {}
    unpack_prefix, unpack_i32, unpack_props_len = PREFIX.unpack_from, I32.unpack_from, PROPS_LEN.unpack_from
    pos, end = 0, len(buffer)
    while pos < end:
        if pos + BODY_START > end:
            raise MessageIllegalError(f"batch entry {len(out)} (at byte {pos}) is truncated")
        total, magic = unpack_prefix(buffer, pos)
        if magic != MESSAGE_MAGIC or total <= BODY_START or pos + total > end:
            raise MessageIllegalError(f"batch entry {len(out)} (at byte {pos}) is not an entry (size {total})")
        if unpack_i32(buffer, pos + POS_SYS_FLAG)[0] & SysFlag.TRANSACTION_MASK:
            return rewrite_batch_as_half(buffer, producer_group, txn_id)[0]
        topic_at = pos + BODY_START + unpack_i32(buffer, pos + POS_BODY_LENGTH)[0]
        topic_len = buffer[topic_at]
        props_at = topic_at + 1 + topic_len
        if props_at + 2 > pos + total:
            raise MessageIllegalError(f"batch entry {len(out)} (at byte {pos}): lengths overrun the entry")
        topic = buffer[topic_at + 1 : props_at]
        queue_id = unpack_i32(buffer, pos + POS_QUEUE_ID)[0]
        suffix = suffixes.get((topic, queue_id))
        if suffix is None:
            suffix = suffixes[(topic, queue_id)] = _suffix(topic, queue_id, producer_group, txn_id)
        props_len = unpack_props_len(buffer, props_at)[0] + len(suffix)
        if props_len > MAX_PROPERTIES_BYTES:
            raise MessageIllegalError(f"batch entry {len(out)}: properties over {MAX_PROPERTIES_BYTES} bytes as a half")
        new_total = total - topic_len + len(HALF_TOPIC) + len(suffix)
        append(I32.pack(new_total))
        append(buffer[pos + 4 : pos + POS_QUEUE_ID])
        append(_ZERO_QUEUE_ID)
        append(buffer[pos + POS_QUEUE_ID + 4 : topic_at])
        append(_HALF_TOPIC_FIELD)
        append(PROPS_LEN.pack(props_len))
        append(buffer[props_at + 2 : pos + total])
        append(suffix)
        pos += total
    return b"".join(out)


def split_entries(buffer: bytes, limit_bytes: int) -> list[tuple[bytes, int]]:
    """``buffer`` cut at entry boundaries into (chunk, entry count) of at most ``limit_bytes`` each (an entry
    bigger than the limit is a chunk of its own: the broker then names it in its refusal)."""
    chunks: list[tuple[bytes, int]] = []
    start = pos = count = 0
    unpack_prefix, end = PREFIX.unpack_from, len(buffer)
    while pos < end:
        total = unpack_prefix(buffer, pos)[0]
        if total <= 0:
            raise MessageIllegalError(f"batch entry at byte {pos} has size {total}")
        if count and pos + total - start > limit_bytes:
            chunks.append((buffer[start:pos], count))
            start, count = pos, 0
        pos += total
        count += 1
    if count:
        chunks.append((buffer[start:pos], count))
    return chunks
