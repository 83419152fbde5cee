"""Pure planning arithmetic: how a message budget is shared among queues and how ranges become Spark partitions.

- ``share_budget``: a per-trigger message limit is split over the queues in proportion to their backlog, as Spark's
  Kafka source does: every queue with a backlog gets at least one message (a small queue beside a busy one would
  otherwise wait for as long as the busy one stays busy), and largest-remainder rounding makes the shares add up
  to exactly the limit whenever it is at least the number of such queues (Kafka's floor/ceil rounding can
  overshoot it with many small queues).
- ``split_ranges``: one partition per (queue, range); a range longer than ``max_messages_per_partition`` is cut into
  equal parts, and when there are fewer ranges than ``min_partitions`` the long ones are cut further in proportion
  to their size (Kafka's ``KafkaOffsetRangeCalculator`` rule).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from connector.offsets import QueueKey


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Queue offsets [start, end) of one queue of one topic."""

    topic: str
    queue_id: int
    start: int
    end: int  # exclusive
    broker: str = ""  # the broker that holds the queue (the connector's name for it)

    @property
    def key(self) -> QueueKey:
        return (self.topic, self.broker, self.queue_id)

    @property
    def size(self) -> int:
        return self.end - self.start


def share_budget(start: Mapping[QueueKey, int], latest: Mapping[QueueKey, int], budget: int) -> dict[QueueKey, int]:
    """End offsets reading about ``budget`` messages in total, shared in proportion to each queue's backlog. Every
    queue with a backlog moves by at least one message, so the total exceeds ``budget`` only when fewer messages
    than such queues are allowed (as Kafka's source, which never starves a partition)."""
    assert budget > 0, budget
    backlog = {k: latest[k] - start.get(k, 0) for k in latest if latest[k] > start.get(k, 0)}
    total = sum(backlog.values())
    end = {k: max(latest[k], start.get(k, 0)) for k in latest}
    if total <= budget:
        return end
    take = dict.fromkeys(backlog, 1)  # one each first: no queue waits behind the others
    rest, rest_total = budget - len(backlog), total - len(backlog)
    if rest > 0:  # the remaining budget in proportion to the remaining backlogs
        exact = {k: rest * (n - 1) / rest_total for k, n in backlog.items()}
        share = {k: math.floor(x) for k, x in exact.items()}
        left = rest - sum(share.values())
        # Largest remainders first; ties by key so the split is deterministic (a restarted query plans the same).
        for k in sorted(exact, key=lambda k: (share[k] - exact[k], k))[:left]:
            share[k] += 1
        take = {k: 1 + n for k, n in share.items()}
    for k, n in take.items():
        assert 1 <= n <= backlog[k], (k, n, backlog[k])
        end[k] = start.get(k, 0) + n
    return end


def split_ranges(
    ranges: list[OffsetRange], min_partitions: int | None, max_messages_per_partition: int | None
) -> list[OffsetRange]:
    """Cut ranges into partitions: none longer than the maximum, at least about ``min_partitions`` of them."""
    parts = [r for r in ranges if r.size > 0]
    if max_messages_per_partition is not None:
        parts = [p for r in parts for p in _cut(r, math.ceil(r.size / max_messages_per_partition))]
    if min_partitions is not None and 0 < len(parts) < min_partitions:
        total = sum(r.size for r in parts)
        parts = [p for r in parts for p in _cut(r, max(round(r.size / total * min_partitions), 1))]
    return sorted(parts, key=lambda r: (r.topic, r.broker, r.queue_id, r.start))


def _cut(r: OffsetRange, pieces: int) -> list[OffsetRange]:
    """``r`` in ``pieces`` contiguous parts whose sizes differ by at most one."""
    pieces = max(1, min(pieces, r.size))
    base, extra = divmod(r.size, pieces)
    out, at = [], r.start
    for i in range(pieces):
        n = base + (1 if i < extra else 0)
        out.append(OffsetRange(r.topic, r.queue_id, at, at + n, r.broker))
        at += n
    assert at == r.end, (r, pieces)
    return out
