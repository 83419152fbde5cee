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

from broker.errors import CorruptionError, MessageIllegalError
from broker.semantics.system_topics import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from broker.store.message import (
    Prop,
    StoredMessage,
    SysFlag,
    decode_properties,
    encode_entry,
    encode_properties,
    pack_ipv4,
    parse_layout,
    validate_topic,
)

REMOVE_TAG = "d"  # RocketMQ's TransactionalMessageUtil.REMOVETAG
FINISHED_TAG = "f"  # Sluice: every committed half of the transaction is in its real topic
DECISION = "TRAN_DECISION"
COMMIT_START = "TRAN_COMMIT_START"
ATTEMPT = "TRAN_ATTEMPT"  # optional, on a half: which writer attempt sent it (e.g. "<partition>:<attempt>")
COMMITTED_ATTEMPTS = "TRAN_COMMITTED_ATTEMPTS"  # on a commit decision: only halves of these attempts are committed
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"

HALF_TOPIC_BYTES = validate_topic(TRANS_HALF_TOPIC)
OP_TOPIC_BYTES = validate_topic(TRANS_OP_HALF_TOPIC)
MAX_TRANSACTION_ID_CHARS = 512  # it travels in every half's properties


def check_transaction_id(txn_id: str) -> None:
    if not txn_id or len(txn_id) > MAX_TRANSACTION_ID_CHARS or "\x01" in txn_id or "\x02" in txn_id:
        raise MessageIllegalError(
            f"transaction id {txn_id[:60]!r}: give 1..{MAX_TRANSACTION_ID_CHARS} characters without \\x01/\\x02"
        )


# ------------------------------------------------------------------------------------------- half messages


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

    Framing is checked here (MessageIllegalError naming the entry); CRCs and sizes are checked by the store's
    put_batch on the result, whose bodies are the same bytes.
    """
    out: list[bytes] = []
    pos, end = 0, len(buffer)
    while pos < end:
        try:
            lay = parse_layout(buffer, pos, end)
        except (CorruptionError, struct.error, IndexError) as e:
            raise MessageIllegalError(f"batch entry {len(out)} (at byte {pos}) is malformed: {e}") from None
        h = lay.header
        topic = bytes(buffer[lay.topic_start : lay.topic_start + lay.topic_len]).decode("ascii", "replace")
        validate_topic(topic)
        props = decode_properties(buffer[lay.props_start : lay.props_start + lay.props_len])
        if props.get(Prop.TRANSACTION_ID, txn_id) != txn_id:
            raise MessageIllegalError(
                f"batch entry {len(out)} carries __transactionId__={props[Prop.TRANSACTION_ID]!r}, not {txn_id!r}"
            )
        body = bytes(buffer[lay.body_start : lay.body_start + h.body_length])
        out.append(
            encode_entry(
                HALF_TOPIC_BYTES,
                0,
                body,
                encode_properties(half_properties(props, topic, h.queue_id, producer_group, txn_id)),
                flag=h.flag,
                sys_flag=half_sys_flag(h.sys_flag),
                born_timestamp=h.born_timestamp,
                born_ip=h.born_ip,
                born_port=h.born_port,
                reconsume_times=h.reconsume_times,
            )
        )
        pos += h.total_size
    return b"".join(out), len(out)


# ------------------------------------------------------------------------------------------- committed messages


def committed_entry(half: StoredMessage) -> bytes:
    """The entry that makes a half message visible in its real topic (store fields left 0 for put_batch)."""
    props = dict(half.properties)
    real_topic = props.pop(Prop.REAL_TOPIC, "")
    real_qid = props.pop(Prop.REAL_QID, "")
    if not real_topic or not real_qid.isdigit():
        raise MessageIllegalError(f"half message {half.msg_id} has no valid REAL_TOPIC/REAL_QID")
    props[Prop.TRAN_PREPARED_QUEUE_OFFSET] = str(half.queue_offset)
    ip, _, port = half.born_host.rpartition(":")
    return encode_entry(
        validate_topic(real_topic),
        int(real_qid),
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
    return half.properties.get(Prop.REAL_TOPIC, ""), int(half.properties.get(Prop.REAL_QID, "0") or 0)


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
    "DECISION",
    "FINISHED_TAG",
    "OP_TOPIC_BYTES",
    "REMOVE_TAG",
    "ROLLBACK",
    "check_transaction_id",
    "committed_entry",
    "decode_commit_start",
    "decode_offsets",
    "encode_commit_start",
    "encode_offsets",
    "half_properties",
    "half_sys_flag",
    "real_queue_of",
    "rewrite_batch_as_half",
]
