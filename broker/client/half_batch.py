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

import numpy as np

from broker.errors import MessageIllegalError
from broker.format.batch import MAX_QUEUE_ID, EntryRun, scan, splice
from broker.format.message import (
    MAX_PROPERTIES_BYTES,
    Prop,
    SysFlag,
)
from broker.format.system_topics import TRANS_HALF_TOPIC
from broker.format.transaction_codec import HALF_PROPERTY_NAMES, check_transaction_id, rewrite_batch_as_half

HALF_TOPIC = TRANS_HALF_TOPIC.encode("ascii")
_HALF_TOPIC_FIELD = bytes([len(HALF_TOPIC)]) + HALF_TOPIC
_ZERO_QUEUE_ID = bytes(4)
PROPERTY_END = 2  # \x02 closes every name\x01value pair; the half properties are appended after it
# Any of these already inside a buffer: let the decoding rewrite decide (it refuses a foreign transaction id).
RESERVED_MARKS = tuple(f"{name}\x01".encode() for name in HALF_PROPERTY_NAMES)


def half_suffix(topic: bytes, queue_id: int, group: str, txn_id: str) -> bytes:
    """The properties a half entry carries after the application's own (which end with \x02), in
    ``transaction_codec.half_properties``'s order."""
    return (
        f"{Prop.REAL_TOPIC}\x01{topic.decode('ascii')}\x02{Prop.REAL_QID}\x01{queue_id}\x02"
        f"{Prop.TRAN_MSG}\x01true\x02{Prop.PGROUP}\x01{group}\x02{Prop.TRANSACTION_ID}\x01{txn_id}\x02"
    ).encode()


def _topic_ids(buffer: bytes, run: EntryRun) -> tuple[np.ndarray, list[bytes]]:
    """Topic index per entry and the distinct topics; one vectorised comparison when all share one topic."""
    arr = np.frombuffer(buffer, np.uint8)
    first = bytes(buffer[int(run.topic_starts[0]) : int(run.topic_starts[0]) + int(run.topic_lengths[0])])
    if (run.topic_lengths == len(first)).all():
        rows = arr[run.topic_starts.astype(np.int64)[:, None] + np.arange(len(first))]
        if (rows == np.frombuffer(first, np.uint8)).all():
            return np.zeros(len(run), np.int64), [first]
    raw = run.topics(buffer)
    index: dict[bytes, int] = {}
    ids = np.fromiter((index.setdefault(t, len(index)) for t in raw), np.int64, len(raw))
    return ids, list(index)


def _check_queue_ids(buffer: bytes, run: EntryRun) -> None:
    """Every entry must name a queue: a half records it as REAL_QID, and the key below packs it in 32 bits next to
    the topic's index (a negative one would borrow from the index and name another topic)."""
    bad = np.flatnonzero((run.queue_ids < 0) | (run.queue_ids >= MAX_QUEUE_ID))
    if bad.size:
        i = int(bad[0])
        topic = bytes(buffer[int(run.topic_starts[i]) : int(run.topic_starts[i]) + int(run.topic_lengths[i])])
        raise MessageIllegalError(
            f"batch entry {i}: queue id {int(run.queue_ids[i])} of {topic.decode('ascii', 'replace')!r} is outside "
            f"0..{MAX_QUEUE_ID - 1}; a transactional batch must name each entry's queue (pick one from the route)"
        )


def to_half_batch(buffer: bytes, producer_group: str, txn_id: str) -> bytes:
    """``buffer`` (entries from ``encode_entry``/``encode_message``) as half entries of ``txn_id``.

    Vectorised: the output is gathered from the input and a small pool of new bytes with one index array."""
    check_transaction_id(txn_id)
    n = len(buffer)
    run = scan(buffer, 0, n, verify_crc=False)
    if run.end != n or run.stop_reason:
        raise MessageIllegalError(
            f"batch entry {len(run)} (at byte {run.end}) is malformed: {run.stop_reason or 'trailing bytes'}"
        )
    _check_queue_ids(buffer, run)
    if any(mark in buffer for mark in RESERVED_MARKS):
        return rewrite_batch_as_half(buffer, producer_group, txn_id)[0]
    with_props = run.props_lengths > 0
    last_props_byte = np.frombuffer(buffer, np.uint8)[(run.props_starts + run.props_lengths - 1)[with_props]]
    if (run.sys_flags & SysFlag.TRANSACTION_MASK).any() or (last_props_byte != PROPERTY_END).any():
        # a transaction type to clear, or a property list without its trailing separator: decode and re-encode
        return rewrite_batch_as_half(buffer, producer_group, txn_id)[0]
    count = len(run)
    topic_ids, topics = _topic_ids(buffer, run)
    keys, key_ids = np.unique(topic_ids * (1 << 32) + run.queue_ids.astype(np.int64), return_inverse=True)
    suffixes = [half_suffix(topics[int(k) >> 32], int(k) & 0xFFFFFFFF, producer_group, txn_id) for k in keys.tolist()]
    suffix_len = np.array([len(s) for s in suffixes], np.int64)[key_ids]
    new_props_len = run.props_lengths.astype(np.int64) + suffix_len
    if (new_props_len > MAX_PROPERTIES_BYTES).any():
        i = int(np.flatnonzero(new_props_len > MAX_PROPERTIES_BYTES)[0])
        raise MessageIllegalError(f"batch entry {i}: properties over {MAX_PROPERTIES_BYTES} bytes as a half")
    new_total = run.sizes.astype(np.int64) - run.topic_lengths + len(HALF_TOPIC) + suffix_len
    # the pool: [zero queue id][half topic field][suffixes...][new totals, 4 B each][new props lengths, 2 B each]
    suffix_pool = b"".join(suffixes)
    suffix_at = np.cumsum([0] + [len(s) for s in suffixes])[:-1].astype(np.int64)
    pool = b"".join(
        (
            _ZERO_QUEUE_ID,
            _HALF_TOPIC_FIELD,
            suffix_pool,
            new_total.astype(">i4").tobytes(),
            new_props_len.astype(">i2").tobytes(),
        )
    )
    base = n  # pool positions are offset by the buffer's length in the combined source
    zero_at, topic_field_at = base, base + 4
    suffixes_at = base + 4 + len(_HALF_TOPIC_FIELD)
    totals_at = suffixes_at + len(suffix_pool) + 4 * np.arange(count, dtype=np.int64)
    plens_at = suffixes_at + len(suffix_pool) + 4 * count + 2 * np.arange(count, dtype=np.int64)
    p = run.positions.astype(np.int64)
    topic_len_at = run.topic_starts.astype(np.int64) - 1
    props_at = run.props_starts.astype(np.int64)
    starts = np.stack(
        [
            totals_at,
            p + 4,
            np.full(count, zero_at),
            p + 16,
            np.full(count, topic_field_at),
            plens_at,
            props_at,
            suffixes_at + suffix_at[key_ids],
        ],
        axis=1,
    ).ravel()
    lengths = np.stack(
        [
            np.full(count, 4),
            np.full(count, 8),
            np.full(count, 4),
            topic_len_at - p - 16,
            np.full(count, len(_HALF_TOPIC_FIELD)),
            np.full(count, 2),
            run.props_lengths.astype(np.int64),
            suffix_len,
        ],
        axis=1,
    ).ravel()
    return splice(buffer + pool, starts, lengths)
