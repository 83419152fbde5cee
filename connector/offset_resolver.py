"""Driver-side resolution of topics and offsets against the broker (one GetQueueOffsets call per topic).

- which topics the query reads now (``topic``/``topics`` as given, ``topicPattern`` over the broker's topic list);
- a snapshot of every queue's (min, max) offsets;
- the starting offsets for each ``startingOffsets`` / ``startingTimestamp`` mode and the batch ending offsets.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from connector.broker_link import BrokerLink
from connector.errors import SourceOptionError
from connector.offsets import QueueKey, parse_positions
from connector.options import EARLIEST, LATEST, SourceOptions

log = logging.getLogger(__name__)

Snapshot = dict[QueueKey, tuple[int, int]]  # (topic, queue) -> (min offset, max offset)


def current_topics(options: SourceOptions, link: BrokerLink) -> list[str]:
    if options.topic_pattern is None:
        return list(options.topics)
    return [t for t in link.topics() if options.topic_matches(t)]


def missing_topics(options: SourceOptions, snap: Snapshot) -> list[str]:
    """Topics the ``topic``/``topics`` option names that have no queue in ``snap``: they do not exist on the broker
    (a topic always has at least one queue). A ``topicPattern`` matching nothing misses none."""
    present = {t for t, _ in snap}
    return [t for t in options.topics if t not in present]


def snapshot(link: BrokerLink, topics: list[str]) -> Snapshot:
    """Min/max offsets of every queue of ``topics``: one GetQueueOffsets call per topic."""
    out: Snapshot = {}
    for topic in topics:
        for qid, (lo, hi) in link.queue_offsets(topic).items():
            assert 0 <= lo <= hi, (topic, qid, lo, hi)
            out[(topic, qid)] = (lo, hi)
    return out


def starting_positions(options: SourceOptions, link: BrokerLink, snap: Snapshot) -> dict[QueueKey, int]:
    start = options.starting
    if start.mode == "earliest":
        return {k: lo for k, (lo, _) in snap.items()}
    if start.mode == "latest":
        return {k: hi for k, (_, hi) in snap.items()}
    if start.mode == "committed":
        return _committed(options, link, snap)
    if start.mode == "timestamp":
        return _by_timestamp(options, link, snap, start.timestamp_ms)
    return _from_json(options, snap, start.offsets, "startingOffsets")


def ending_positions(options: SourceOptions, snap: Snapshot, start: Mapping[QueueKey, int]) -> dict[QueueKey, int]:
    """Batch end offsets: ``latest`` or JSON (-1 = latest); an end before the start is an error naming the queue."""
    end = {k: hi for k, (_, hi) in snap.items()}
    if options.ending is not None:
        end.update(_from_json(options, snap, options.ending, "endingOffsets"))
    for k, e in end.items():
        if e < start.get(k, 0):
            raise SourceOptionError(
                f"option 'endingOffsets': {k[0]}/{options.broker_name}:{k[1]} ends at {e}, before its start "
                f"{start.get(k, 0)}"
            )
    return end


def fallback(options: SourceOptions, lo_hi: tuple[int, int]) -> int:
    return lo_hi[0] if options.starting_fallback == "earliest" else lo_hi[1]


def uncommitted(link: BrokerLink, snap: Snapshot) -> set[QueueKey]:
    """The queues of ``snap`` for which the group (the link's) has no committed offset."""
    out: set[QueueKey] = set()
    for topic in sorted({t for t, _ in snap}):
        committed = link.committed(topic)
        out |= {(t, q) for t, q in snap if t == topic and committed.get(q, -1) < 0}
    return out


def _committed(options: SourceOptions, link: BrokerLink, snap: Snapshot) -> dict[QueueKey, int]:
    out: dict[QueueKey, int] = {}
    for topic in sorted({t for t, _ in snap}):
        committed = link.committed(topic)
        for (t, qid), lo_hi in snap.items():
            if t == topic:
                off = committed.get(qid)
                out[(t, qid)] = fallback(options, lo_hi) if off is None or off < 0 else off
    return out


def _by_timestamp(options: SourceOptions, link: BrokerLink, snap: Snapshot, ts_ms: int) -> dict[QueueKey, int]:
    out: dict[QueueKey, int] = {}
    for (topic, qid), (lo, hi) in sorted(snap.items()):
        off = link.offset_by_timestamp(topic, qid, ts_ms) if hi > lo else hi
        if hi > lo and off >= hi and options.timestamp_strategy == "error":
            raise SourceOptionError(
                f"option 'startingTimestamp': {topic}/{options.broker_name}:{qid} has no message stored at or after "
                f"{ts_ms}; set startingOffsetsByTimestampStrategy=latest to start such queues at their end"
            )
        out[(topic, qid)] = min(max(off, lo), hi)
    return out


def _from_json(
    options: SourceOptions, snap: Snapshot, given: Mapping[str, Mapping[str, int]], name: str
) -> dict[QueueKey, int]:
    positions = parse_positions(options.broker_name, given, what=f"option {name!r}")
    for topic, qid in positions:
        if not options.topic_matches(topic):
            raise SourceOptionError(f"option {name!r} names topic {topic!r}, which this query does not read")
        if (topic, qid) not in snap:  # a typo must not quietly become the fallback position (Kafka refuses too)
            have = sorted(q for t, q in snap if t == topic)
            raise SourceOptionError(
                f"option {name!r} names queue {topic}/{options.broker_name}:{qid}, which does not exist "
                + (f"(the topic has queues {have[0]}..{have[-1]})" if have else "(no such topic on the broker)")
            )
    out: dict[QueueKey, int] = {}
    for k, (lo, hi) in snap.items():
        off = positions.get(k)
        if off is None:
            out[k] = fallback(options, (lo, hi)) if name == "startingOffsets" else hi
        elif off == EARLIEST:
            out[k] = lo
        elif off == LATEST:
            out[k] = hi
        elif off > hi:
            raise SourceOptionError(
                f"option {name!r}: {k[0]}/{options.broker_name}:{k[1]} = {off} is past the queue's end {hi}"
            )
        else:
            out[k] = off  # below min: reported as data loss when read
    return out
