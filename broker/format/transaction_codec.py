"""Encodings of the transaction service: half entries, committed entries, op-message bodies and properties.

Half message (``RMQ_SYS_TRANS_HALF_TOPIC``, queue 0), as RocketMQ's ``TransactionalMessageBridge`` stores it: the
real topic and queue in ``REAL_TOPIC`` / ``REAL_QID``, ``TRAN_MSG=true``, the producer group in ``PGROUP``, the
transaction id in ``__transactionId__``. Its SYSFLAG transaction bits are reset to NOT_TYPE, exactly as RocketMQ
does, because the store (like RocketMQ's) gives PREPARED entries no consume-queue unit, and the half queue must be
readable by offset. ``TRAN_MSG=true`` is what marks it as prepared.

Committed message: the half's body, flag, born time/host, reconsume count and properties minus REAL_TOPIC /
REAL_QID, stored in the real topic and queue with the COMMIT transaction type, PREPARED TRANSACTION OFFSET = the
half's commit-log offset and ``TRAN_PREPARED_QUEUE_OFFSET`` = the half's queue offset (RocketMQ's
``endMessageTransaction``). The half's commit-log offset is also what recovery uses to tell which halves were
already re-stored.

Op message (``RMQ_SYS_TRANS_OP_HALF_TOPIC``, queue 0), tag ``d`` ("remove", RocketMQ's REMOVETAG): the body lists
the half queue offsets the decision covers, comma-separated (RocketMQ 4 writes one offset, RocketMQ 5 a comma
list); Sluice also writes ``a-b`` for an inclusive run, so a decision over 50,000 contiguous halves stays a few
bytes. Properties: ``__transactionId__``, ``TRAN_DECISION`` = COMMIT | ROLLBACK, and for a commit
``TRAN_COMMIT_START`` = ``topic:queue=offset,...``, each real queue's next offset before any re-store (recovery scans
from there). A second op message with tag ``f`` (finished) marks a commit whose re-store is complete.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import numpy as np

from broker.errors import CorruptionError, MessageIllegalError, shown
from broker.format.batch import MAX_QUEUE_ID, scan
from broker.format.message import (
    BODY_START,
    ENTRY_HEADER,
    I32,
    MAX_PROPERTIES_BYTES,
    MESSAGE_MAGIC,
    POS_BODY_LENGTH,
    PROPS_LEN,
    TOPIC_LEN,
    Prop,
    StoredMessage,
    SysFlag,
    check_crc,
    decode_properties,
    encode_entry,
    encode_properties,
    entry_size,
    is_topic_name,
    pack_ipv4,
    parse_layout,
    validate_topic,
)
from broker.format.numbers import MAX_NUMBER_DIGITS, is_ascii_digits
from broker.format.properties import not_canonical, property_number, section_fault
from broker.format.send_checks import check_message
from broker.format.system_topics import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC

REMOVE_TAG = "d"  # RocketMQ's TransactionalMessageUtil.REMOVETAG
FINISHED_TAG = "f"  # Sluice: every committed half of the transaction is in its real topic
DECISION = "TRAN_DECISION"
COMMIT_START = "TRAN_COMMIT_START"
ATTEMPT = "TRAN_ATTEMPT"  # optional, on a half: which writer attempt sent it (e.g. "<partition>:<attempt>")
COORDINATOR = "TRAN_COORDINATOR"  # on a half: the broker that keeps its transaction's decision (participant_resolver)
COMMITTED_ATTEMPTS = "TRAN_COMMITTED_ATTEMPTS"  # on a commit decision: only halves of these attempts are committed
BATCH = "TRAN_BATCH"  # "true" on a decision of a batch transaction (its outcome is kept the whole retention time)
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"

HALF_TOPIC_BYTES = validate_topic(TRANS_HALF_TOPIC)
OP_TOPIC_BYTES = validate_topic(TRANS_OP_HALF_TOPIC)
MAX_TRANSACTION_ID_CHARS = 512  # it travels in every half's properties
MAX_ATTEMPTS_PROPERTY_CHARS = 16 * 1024  # the committed-attempt list travels in one property (limit 32767)


def real_queue_id(value: str | bytes | None) -> int | None:
    """The queue id a REAL_QID value names (ASCII digits, format.numbers, below MAX_QUEUE_ID); None if it names none.
    The one reading of REAL_QID: the send check, the commit and recovery must agree on every value."""
    if value is None or not is_ascii_digits(value) or len(value) > MAX_NUMBER_DIGITS:
        return None
    qid = int(value)
    return qid if qid < MAX_QUEUE_ID else None


def check_transaction_id(txn_id: str) -> None:
    if not txn_id or len(txn_id) > MAX_TRANSACTION_ID_CHARS or "\x01" in txn_id or "\x02" in txn_id:
        raise MessageIllegalError(
            f"transaction id {txn_id[:60]!r}: give 1..{MAX_TRANSACTION_ID_CHARS} characters without \\x01/\\x02"
        )


# ------------------------------------------------------------------------------------------- half messages


# The properties half_properties adds, in the order it adds them (a half entry's list ends with them).
HALF_PROPERTY_NAMES = (Prop.REAL_TOPIC, Prop.REAL_QID, Prop.TRAN_MSG, Prop.PGROUP, Prop.TRANSACTION_ID)
# How each of them starts inside a \x02-led property list (values never hold \x01 or \x02).
_HALF_NAME_MARKS = tuple((name, f"\x02{name}\x01".encode()) for name in HALF_PROPERTY_NAMES)


def refuse_delay(level: str | None, what: str) -> None:
    """MessageIllegalError for a half carrying a delay (DELAY > 0). Why: a commit stores its halves in their real
    topics at once, not through the delay service, so the delay would be silently ignored (RocketMQ's producer
    drops DELAY from transactional sends; Sluice says so instead)."""
    if level is not None and property_number(Prop.DELAY, level) > 0:
        raise MessageIllegalError(
            f"{what} has DELAY={shown(level)}: delayed transactional messages are not supported (a committed message "
            "is delivered at once); send it without DELAY, or send a plain delayed message after the commit"
        )


def half_property_conflict(
    props: Mapping[str, str], real_topic: str, real_qid: int, producer_group: str, txn_id: str | None
) -> str:
    """What is wrong with a message joining transaction ``txn_id`` whose own properties give a half property
    (half_properties) another value than the broker writes from the send ("" if nothing): a REAL_TOPIC, REAL_QID,
    TRAN_MSG, PGROUP or __transactionId__ of the client's own is refused (MessageIllegalError) rather than
    overwritten without a word. The same value is no conflict (``txn_id`` None: the id comes from the properties
    themselves)."""
    written = half_properties({}, real_topic, real_qid, producer_group, txn_id or props.get(Prop.TRANSACTION_ID, ""))
    for name, value in written.items():
        given = props.get(name)
        if given is not None and given != value:
            if name == Prop.TRANSACTION_ID:
                return foreign_transaction(props, value)
            return (
                f"sets {name}={shown(given)}, but the broker writes {name}={shown(value)} into its half (from the "
                "send's topic, queue and producer group); leave it out"
            )
    return ""


def foreign_transaction(props: Mapping[str, str], txn_id: str) -> str:
    """What is wrong with an entry of ``txn_id`` whose own properties name another transaction; "" if nothing."""
    other = props.get(Prop.TRANSACTION_ID, txn_id)
    return "" if other == txn_id else f"carries __transactionId__={shown(other)}, not {shown(txn_id)}"


def half_properties(
    props: Mapping[str, str], real_topic: str, real_qid: int, producer_group: str, txn_id: str
) -> dict[str, str]:
    out = dict(props)
    out[Prop.REAL_TOPIC] = real_topic
    out[Prop.REAL_QID] = str(real_qid)
    out[Prop.TRAN_MSG] = "true"
    out[Prop.PGROUP] = producer_group
    out[Prop.TRANSACTION_ID] = txn_id
    return out


def half_sys_flag(sys_flag: int) -> int:
    return sys_flag & ~SysFlag.TRANSACTION_MASK  # NOT_TYPE: see the module docstring


def rewrite_batch_as_half(buffer: bytes | memoryview, producer_group: str, txn_id: str) -> tuple[bytes, int]:
    """A client batch (entries for their real topics) re-encoded as half entries; returns (buffer, count).

    Each entry must pass what a plain send does (its CRC, send_checks, canonical properties: they are decoded and
    encoded again here, so they come out as they went in) and half_property_conflict; MessageIllegalError names
    the first that does not. Sizes are checked by the store's put_batch on the result, whose bodies are the same
    bytes.
    """
    out: list[bytes] = []
    pos, end = 0, len(buffer)
    while pos < end:
        i = len(out)
        try:
            lay = parse_layout(buffer, pos, end)
            check_crc(buffer, lay, pos=pos)
        except (CorruptionError, struct.error, IndexError) as e:
            raise MessageIllegalError(f"batch entry {i} (at byte {pos}) is malformed: {e}") from None
        h = lay.header
        raw_topic = bytes(buffer[lay.topic_start : lay.topic_start + lay.topic_len])
        if not is_topic_name(raw_topic):
            raise MessageIllegalError(f"batch entry {i}: TOPIC {shown(raw_topic)} is not a topic name")
        topic = raw_topic.decode("ascii")
        if not 0 <= h.queue_id < MAX_QUEUE_ID:
            raise MessageIllegalError(f"batch entry {i} has queue id {h.queue_id}; queue ids are 0..{MAX_QUEUE_ID - 1}")
        check_message(h.sys_flag, h.reconsume_times, what="SendBatch")
        raw_props = bytes(buffer[lay.props_start : lay.props_start + lay.props_len])
        why = section_fault(raw_props)
        if why:
            raise MessageIllegalError(not_canonical(f"batch entry {i}", why))
        props = decode_properties(raw_props)
        conflict = half_property_conflict(props, topic, h.queue_id, producer_group, txn_id)
        if conflict:
            raise MessageIllegalError(f"batch entry {i} {conflict}")
        refuse_delay(props.get(Prop.DELAY), f"batch entry {i}")
        body = bytes(buffer[lay.body_start : lay.body_start + h.body_length])
        out.append(
            encode_entry(
                HALF_TOPIC_BYTES,
                0,
                body,
                encode_properties(half_properties(props, topic, h.queue_id, producer_group, txn_id)),
                flag=h.flag,
                sys_flag=h.sys_flag,
                born_timestamp=h.born_timestamp,
                born_ip=h.born_ip,
                born_port=h.born_port,
                reconsume_times=h.reconsume_times,
            )
        )
        pos += h.total_size
    return b"".join(out), len(out)


def encode_half_entry(
    topic: str,
    queue_id: int,
    body: bytes,
    properties: Mapping[str, str] | None,
    producer_group: str,
    txn_id: str,
    **fields: int | bytes,
) -> bytes:
    """Client side of the fast path: one entry already in half form (``put_half_batch`` then only checks it).
    ``fields`` are encode_entry's keyword arguments (flag, born_timestamp, born_ip, born_port, ...)."""
    props = half_properties(properties or {}, topic, queue_id, producer_group, txn_id)
    return encode_entry(HALF_TOPIC_BYTES, 0, body, encode_properties(props), **fields)  # type: ignore[arg-type]


def check_half_batch(buffer: bytes | memoryview, producer_group: str, txn_id: str) -> int:
    """Check a batch the client encoded in half form (``encode_half_entry``); returns the entry count.

    Vectorised framing (the store's scan); per entry only byte-string tests: the half topic, queue 0, NOT_TYPE
    transaction bits, this transaction id and producer group, REAL_TOPIC / REAL_QID / TRAN_MSG present, each half
    property named once (the check, the commit and recovery must all read the same real queue and id), and no
    DELAY (``refuse_delay``). CRCs and sizes are checked by put_batch itself.
    """
    n = len(buffer)
    run = scan(buffer, 0, n, verify_crc=False)
    if run.end != n or run.stop_reason:
        raise MessageIllegalError(
            f"batch entry {len(run)} (at byte {run.end}) is malformed: {run.stop_reason or 'trailing bytes'}"
        )
    bad = np.flatnonzero((run.queue_ids != 0) | ((run.sys_flags & SysFlag.TRANSACTION_MASK) != 0))
    if bad.size:
        raise MessageIllegalError(f"half entry {int(bad[0])}: queue id must be 0 and transaction type NOT_TYPE")
    # Each property of an entry is "\x02NAME\x01VALUE\x02" once the entry's list is prefixed with \x02.
    txn_mark = f"\x02{Prop.TRANSACTION_ID}\x01{txn_id}\x02".encode()
    group_mark = f"\x02{Prop.PGROUP}\x01{producer_group}\x02".encode()
    tran_mark = f"\x02{Prop.TRAN_MSG}\x01true\x02".encode()
    topic_mark, qid_mark = f"\x02{Prop.REAL_TOPIC}\x01".encode(), f"\x02{Prop.REAL_QID}\x01".encode()
    if not (run.topic_lengths == len(HALF_TOPIC_BYTES)).all() or set(run.topics(buffer)) != {HALF_TOPIC_BYTES}:
        raise MessageIllegalError(f"a half batch must be all {TRANS_HALF_TOPIC}: encode it with encode_half_entry")
    for i, props in enumerate(run.properties(buffer)):
        p = b"\x02" + props
        if not (txn_mark in p and group_mark in p and tran_mark in p and topic_mark in p and qid_mark in p):
            raise MessageIllegalError(
                f"half entry {i} lacks __transactionId__={shown(txn_id)}, PGROUP={shown(producer_group)}, "
                "TRAN_MSG=true, REAL_TOPIC or REAL_QID; encode it with encode_half_entry"
            )
        for name, mark in _HALF_NAME_MARKS:
            if p.count(mark) > 1:
                raise MessageIllegalError(
                    f"half entry {i} names {name} {p.count(mark)} times; each half property must appear once "
                    "(encode it with encode_half_entry)"
                )
        refuse_delay(property_of(props, Prop.DELAY), f"half entry {i}")
    return len(run)


def is_half_batch(buffer: bytes | memoryview) -> bool:
    """Whether the first entry is addressed to the half topic (the client used encode_half_entry)."""
    try:
        lay = parse_layout(buffer, 0, len(buffer))
    except (CorruptionError, struct.error, IndexError):
        return False
    return bytes(buffer[lay.topic_start : lay.topic_start + lay.topic_len]) == HALF_TOPIC_BYTES


# ------------------------------------------------------------------------------------------- committed messages


class RawHalf(NamedTuple):
    """A half message as it lies in the commit log (read without decoding: the commit path is per message)."""

    queue_offset: int
    commitlog_offset: int
    entry: bytes


class Committed(NamedTuple):
    real_queue: tuple[str, int]
    entry: bytes  # ready for put_batch
    half: RawHalf


_topic_cache: dict[bytes, bytes] = {}


def _take_property(props: bytes, name: bytes) -> tuple[bytes | None, bytes]:
    """(value, props without that property) for an encoded property list."""
    key = name + b"\x01"
    if props.startswith(key):
        i = 0
    else:
        k = props.find(b"\x02" + key)
        if k < 0:
            return None, props
        i = k + 1
    j = props.find(b"\x02", i)
    if j < 0:
        return None, props
    return props[i + len(key) : j], props[:i] + props[j + 1 :]


def raw_property(entry: bytes, name: str) -> str | None:
    """One property of a raw entry, without decoding the rest."""
    body_len = I32.unpack_from(entry, POS_BODY_LENGTH)[0]
    topic_len = entry[BODY_START + body_len]
    return property_of(entry[BODY_START + body_len + 1 + topic_len + 2 :], name)


def property_of(props: bytes, name: str) -> str | None:
    """One property of an encoded property list (the first, if named twice), without decoding the rest."""
    value, _ = _take_property(props, name.encode())
    return None if value is None else value.decode("utf-8", "replace")


_REAL_TOPIC = Prop.REAL_TOPIC.encode()
_REAL_QID = Prop.REAL_QID.encode()
_PREPARED_QOFF = Prop.TRAN_PREPARED_QUEUE_OFFSET.encode() + b"\x01"


def commit_raw(half: RawHalf) -> Committed:
    """The committed entry of a raw half (as ``committed_entry``, about ten times faster: no full decode, and the
    body's CRC is carried over since the body is the same bytes)."""
    e = half.entry
    h = ENTRY_HEADER.unpack_from(e, 0)
    body_len = h[-1]
    topic_at = BODY_START + body_len
    props = e[topic_at + 1 + e[topic_at] + 2 :]
    real_topic, props = _take_property(props, _REAL_TOPIC)
    real_qid, props = _take_property(props, _REAL_QID)
    qid = real_queue_id(real_qid)
    if not real_topic or qid is None:
        raise MessageIllegalError(
            f"half message at commit-log offset {half.commitlog_offset} has no valid REAL_TOPIC/REAL_QID"
        )
    if _take_property(props, _REAL_TOPIC)[0] is not None or _take_property(props, _REAL_QID)[0] is not None:
        # checked on the way in since; one stored before names two queues and was admitted for the other one
        raise MessageIllegalError(
            f"half message at commit-log offset {half.commitlog_offset} names REAL_TOPIC/REAL_QID twice; it cannot "
            "be committed (roll the transaction back)"
        )
    topic = _topic_cache.get(real_topic)
    if topic is None:
        topic = _topic_cache.setdefault(real_topic, validate_topic(real_topic.decode("ascii", "replace")))
    props += _PREPARED_QOFF + str(half.queue_offset).encode() + b"\x02"
    if len(props) > MAX_PROPERTIES_BYTES:
        raise MessageIllegalError(f"half message at {half.commitlog_offset}: properties too long once committed")
    sys_flag = (h[7] & ~SysFlag.TRANSACTION_MASK) | SysFlag.TRANSACTION_COMMIT_TYPE
    total = entry_size(body_len, len(topic), len(props))
    head = ENTRY_HEADER.pack(
        total, MESSAGE_MAGIC, h[2], qid, h[4], 0, 0, sys_flag, h[8], h[9], h[10], 0, b"\x00\x00\x00\x00", 0, h[14],
        half.commitlog_offset, body_len,
    )
    entry = b"".join(
        (head, e[BODY_START:topic_at], TOPIC_LEN.pack(len(topic)), topic, PROPS_LEN.pack(len(props)), props)
    )
    return Committed((topic.decode("ascii"), qid), entry, half)


def committed_entry(half: StoredMessage) -> bytes:
    """The entry that makes a half message visible in its real topic (store fields left 0 for put_batch)."""
    props = dict(half.properties)
    real_topic = props.pop(Prop.REAL_TOPIC, "")
    real_qid = real_queue_id(props.pop(Prop.REAL_QID, None))
    if not real_topic or real_qid is None:
        raise MessageIllegalError(f"half message {half.msg_id} has no valid REAL_TOPIC/REAL_QID")
    props[Prop.TRAN_PREPARED_QUEUE_OFFSET] = str(half.queue_offset)
    ip, _, port = half.born_host.rpartition(":")
    return encode_entry(
        validate_topic(real_topic),
        real_qid,
        half.body,
        encode_properties(props),
        flag=half.flag,
        sys_flag=(half.sys_flag & ~SysFlag.TRANSACTION_MASK) | SysFlag.TRANSACTION_COMMIT_TYPE,
        born_timestamp=half.born_timestamp,
        born_ip=pack_ipv4(ip),
        born_port=int(port) if port.isdigit() else 0,
        reconsume_times=half.reconsume_times,
        prepared_transaction_offset=half.commitlog_offset,
    )


def real_queue_of(half: StoredMessage) -> tuple[str, int]:
    """(REAL_TOPIC, REAL_QID) of a half; queue -1 when REAL_QID names no queue."""
    qid = real_queue_id(half.properties.get(Prop.REAL_QID))
    return half.properties.get(Prop.REAL_TOPIC, ""), -1 if qid is None else qid


# ------------------------------------------------------------------------------------------- op bodies


def encode_offsets(offsets: Iterable[int]) -> bytes:
    """Sorted offsets as ``a,b-c,...`` (inclusive runs)."""
    parts: list[str] = []
    run_start = prev = None
    for off in sorted(set(offsets)):
        if prev is not None and off == prev + 1:
            prev = off
            continue
        if run_start is not None:
            parts.append(str(run_start) if run_start == prev else f"{run_start}-{prev}")
        run_start = prev = off
    if run_start is not None:
        parts.append(str(run_start) if run_start == prev else f"{run_start}-{prev}")
    return ",".join(parts).encode("ascii")


def decode_offsets(body: bytes) -> list[tuple[int, int]]:
    """Inclusive runs ``[(first, last), ...]`` of an op body; ValueError if it is not one."""
    runs: list[tuple[int, int]] = []
    text = body.decode("ascii").strip()
    if not text:
        return runs
    for part in text.split(","):
        first, sep, last = part.partition("-")
        a = int(first)
        b = int(last) if sep else a
        if b < a or a < 0:
            raise ValueError(f"bad offset run {part!r}")
        runs.append((a, b))
    return runs


def encode_commit_start(start: Mapping[tuple[str, int], int]) -> str:
    return ",".join(f"{t}:{q}={off}" for (t, q), off in sorted(start.items()))


def decode_commit_start(text: str) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for part in filter(None, text.split(",")):
        key, _, off = part.partition("=")
        topic, _, qid = key.rpartition(":")
        out[(topic, int(qid))] = int(off)
    return out


__all__ = [
    "ATTEMPT",
    "COMMIT",
    "COMMITTED_ATTEMPTS",
    "COMMIT_START",
    "COORDINATOR",
    "DECISION",
    "FINISHED_TAG",
    "HALF_PROPERTY_NAMES",
    "OP_TOPIC_BYTES",
    "REMOVE_TAG",
    "ROLLBACK",
    "Committed",
    "RawHalf",
    "check_half_batch",
    "commit_raw",
    "check_transaction_id",
    "committed_entry",
    "decode_commit_start",
    "decode_offsets",
    "encode_commit_start",
    "encode_half_entry",
    "encode_offsets",
    "foreign_transaction",
    "half_property_conflict",
    "half_properties",
    "half_sys_flag",
    "is_half_batch",
    "property_of",
    "raw_property",
    "real_queue_id",
    "real_queue_of",
    "refuse_delay",
    "rewrite_batch_as_half",
]
