"""Driver-side resolution of topics and offsets against the brokers (one GetQueueOffsets call per topic and broker).

- which topics the query reads now (``topic``/``topics`` as given, ``topicPattern`` over the topics the broker or the
  name servers list);
- a snapshot of every queue's (min, max) offsets, and in a cluster the brokers of the routes that did not answer;
- the starting offsets for each ``startingOffsets`` / ``startingTimestamp`` mode and the batch ending offsets.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from connector.broker_link import BrokerLink
from connector.connector_errors import SourceOptionError
from connector.offsets import QueueKey, describe, parse_positions
from connector.options import EARLIEST, LATEST, SourceOptions

log = logging.getLogger(__name__)


class Snapshot(dict[QueueKey, tuple[int, int]]):
    """(topic, broker, queue) -> (min offset, max offset). ``gone``: brokers of the topics' routes that did not
    answer, with the reason (a cluster, while planning a stream; empty otherwise)."""

    def __init__(self, ranges: Mapping[QueueKey, tuple[int, int]] | None = None, gone: dict[str, str] | None = None):
        super().__init__(ranges or {})
        self.gone: dict[str, str] = gone or {}


def current_topics(options: SourceOptions, link: BrokerLink) -> list[str]:
    if options.topic_pattern is None:
        return list(options.topics)
    return [t for t in link.topics() if options.topic_matches(t)]


def missing_topics(options: SourceOptions, snap: Snapshot) -> list[str]:
    """Topics the ``topic``/``topics`` option names that have no queue in ``snap``: they exist on no broker (a topic
    always has at least one queue). A ``topicPattern`` matching nothing misses none."""
    present = {t for t, _, _ in snap}
    return [t for t in options.topics if t not in present]


def snapshot(link: BrokerLink, topics: list[str], *, tolerate_gone: bool = False) -> Snapshot:
    """Min/max offsets of every queue of ``topics``. ``tolerate_gone``: a broker that does not answer is named in
    the snapshot's ``gone`` instead of failing it (the stream reader decides what that means)."""
    out = Snapshot()
    gone: dict[str, str] | None = out.gone if tolerate_gone else None
    for topic in topics:
        for (broker, qid), (lo, hi) in link.queue_offsets(topic, gone).items():
            assert 0 <= lo <= hi, (topic, broker, qid, lo, hi)
            out[(topic, broker, qid)] = (lo, hi)
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
                f"option 'endingOffsets': {describe(k)} ends at {e}, before its start {start.get(k, 0)}"
            )
    return end


def fallback(options: SourceOptions, lo_hi: tuple[int, int]) -> int:
    return lo_hi[0] if options.starting_fallback == "earliest" else lo_hi[1]


def uncommitted(link: BrokerLink, snap: Snapshot) -> set[QueueKey]:
    """The queues of ``snap`` for which the group (the link's) has no committed offset."""
    out: set[QueueKey] = set()
    for topic in sorted({t for t, _, _ in snap}):
        committed = link.committed(topic)
        out |= {(t, b, q) for t, b, q in snap if t == topic and committed.get((b, q), -1) < 0}
    return out


def _committed(options: SourceOptions, link: BrokerLink, snap: Snapshot) -> dict[QueueKey, int]:
    out: dict[QueueKey, int] = {}
    for topic in sorted({t for t, _, _ in snap}):
        committed = link.committed(topic)
        for (t, broker, qid), lo_hi in snap.items():
            if t == topic:
                off = committed.get((broker, qid))
                out[(t, broker, qid)] = fallback(options, lo_hi) if off is None or off < 0 else off
    return out


def _by_timestamp(options: SourceOptions, link: BrokerLink, snap: Snapshot, ts_ms: int) -> dict[QueueKey, int]:
    out: dict[QueueKey, int] = {}
    for (topic, broker, qid), (lo, hi) in sorted(snap.items()):
        off = link.offset_by_timestamp(topic, broker, qid, ts_ms) if hi > lo else hi
        if hi > lo and off >= hi and options.timestamp_strategy == "error":
            raise SourceOptionError(
                f"option 'startingTimestamp': {describe((topic, broker, qid))} has no message stored at or after "
                f"{ts_ms}; set startingOffsetsByTimestampStrategy=latest to start such queues at their end"
            )
        out[(topic, broker, qid)] = min(max(off, lo), hi)
    return out


def _queue_ranges(queues: list[tuple[str, int]], *, one_broker: bool) -> str:
    """``0..7`` (one broker) or ``broker-a:0..7, broker-b:0..3``: the queues a topic has, for an error."""
    by_broker: dict[str, list[int]] = {}
    for broker, qid in sorted(queues):
        by_broker.setdefault(broker, []).append(qid)
    parts = [f"{'' if one_broker else b + ':'}{q[0]}..{q[-1]}" for b, q in by_broker.items()]
    return ", ".join(parts)


def _from_json(
    options: SourceOptions, snap: Snapshot, given: Mapping[str, Mapping[str, int]], name: str
) -> dict[QueueKey, int]:
    positions = parse_positions(options.broker_name, given, what=f"option {name!r}")
    for key in positions:
        topic = key[0]
        if not options.topic_matches(topic):
            raise SourceOptionError(f"option {name!r} names topic {topic!r}, which this query does not read")
        if key not in snap:  # a typo must not quietly become the fallback position (Kafka refuses too)
            have = _queue_ranges([(b, q) for t, b, q in snap if t == topic], one_broker=options.broker_name is not None)
            raise SourceOptionError(
                f"option {name!r} names queue {describe(key)}, which does not exist "
                + (f"(the topic has queues {have})" if have else "(no such topic on the broker)")
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
            raise SourceOptionError(f"option {name!r}: {describe(k)} = {off} is past the queue's end {hi}")
        else:
            out[k] = off  # below min: reported as data loss when read
    return out
