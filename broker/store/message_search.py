"""Finding messages by key (KEYS or UNIQ_KEY, through the index) and by store time (a binary search over a queue):
``MessageStore.query_by_key``, ``offset_by_time`` and ``earliest_message_time``.

For a key, the index answers with candidate commit-log offsets, newest first; a candidate may be another key of
the same hash, a message of a deleted generation, one not yet confirmed by replicas or an undecided in-place
transaction. Those must not use up the answer, so the walk widens until enough match or the index has no more,
bounded because each candidate costs a commit-log read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.errors import InvalidArgumentError
from broker.format.message import Prop, StoredMessage

if TYPE_CHECKING:
    from broker.store.consume_queue import ConsumeQueue
    from broker.store.message_store import MessageStore

# Bodies in one query-by-key answer: the answer is built whole in memory, and 4096 messages of 4 MiB would
# otherwise be 16 GiB.
QUERY_MAX_BYTES = 64 * 1024 * 1024
QUERY_MAX_CANDIDATES = 65_536  # index entries one key query may read messages for (hash collisions, time edges)


def query_by_key(
    store: MessageStore, topic: str, key: str, max_num: int = 64, begin_ms: int = 0, end_ms: int = 2**62, *,
    confirmed_only: bool = True,
) -> list[StoredMessage]:
    """The newest ``max_num`` messages of ``topic`` with ``key`` in KEYS or UNIQ_KEY, stored in [begin_ms,
    end_ms], oldest first; fewer if their bodies pass QUERY_MAX_BYTES (the answer is built whole in memory).
    ``confirmed_only=False``: also messages past the read limit (the broker's own retry deduplication)."""
    if store.index is None:
        raise InvalidArgumentError("the message index is disabled (message_index_enable=False)")
    max_num = max(1, min(max_num, 4096))
    found: list[StoredMessage] = []
    nbytes = 0
    deleted_at = store.deleted_topics.get(topic, -1)  # entries before it belong to a deleted generation
    seen: set[int] = set()
    # Candidates that are not matches (another key of the same hash, a message stored later in the range's
    # last second) must not use up the answer: the walk widens until max_num match or the index has no more,
    # bounded because each candidate costs a commit-log read.
    limit, done = 4 * max_num, False
    while not done:
        candidates = store.index.lookup(topic, key, limit, begin_ms, end_ms)  # newest first
        for off in candidates:
            if off in seen or off < deleted_at:
                continue
            seen.add(off)
            msg = store.lookup_message(off)
            if msg is None or msg.topic != topic:
                continue
            if confirmed_only and not store.confirmed(off, msg.store_size):
                continue
            if not store.decided(msg):
                continue
            has_key = key in msg.keys or msg.properties.get(Prop.UNIQ_KEY) == key  # hash collisions stop here
            if has_key and begin_ms <= msg.store_timestamp <= end_ms:
                nbytes += len(msg.body)
                done = len(found) > 0 and nbytes > QUERY_MAX_BYTES
                if done:
                    break
                found.append(msg)
                done = len(found) == max_num
                if done:
                    break
        done = done or len(candidates) < limit or limit >= QUERY_MAX_CANDIDATES  # no more, or the bound
        limit = min(4 * limit, QUERY_MAX_CANDIDATES)
    found.sort(key=lambda m: m.commitlog_offset)
    return found


def _unit_timestamp(store: MessageStore, cq: ConsumeQueue, queue_offset: int) -> int | None:
    unit = cq.unit(queue_offset)
    if unit is None or unit.size <= 0:
        return None
    return store.commit_log.store_timestamp_at(unit.commitlog_offset)


def offset_by_time(store: MessageStore, topic: str, queue_id: int, timestamp_ms: int) -> int:
    """The first queue offset whose message was stored at or after ``timestamp_ms`` (max offset if none)."""
    cq = store.queues.find(topic, queue_id)
    if cq is None:
        return 0
    lo, hi = cq.min_offset, store.visible_max(cq)
    while lo < hi:  # binary search: store timestamps grow with queue offset
        mid = (lo + hi) // 2
        ts = _unit_timestamp(store, cq, mid)
        if ts is None or ts < timestamp_ms:  # None: expired while we looked, so everything below is gone
            lo = mid + 1
        else:
            hi = mid
    return lo


def earliest_message_time(store: MessageStore, topic: str, queue_id: int) -> int:
    """Store time of the queue's oldest message, -1 if the queue is empty."""
    cq = store.queues.find(topic, queue_id)
    if cq is None or cq.max_offset <= cq.min_offset:
        return -1
    ts = _unit_timestamp(store, cq, cq.min_offset)
    return -1 if ts is None else ts
