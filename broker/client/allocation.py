"""Client-side queue allocation, as RocketMQ's AllocateMessageQueueAveragely and ...ByCircle.

Every consumer of a group sorts the same queue list and the same consumer-id list, so each computes the same
disjoint split without talking to the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

Q = TypeVar("Q")

AVERAGELY = "AVERAGELY"
CIRCLE = "CIRCLE"


def allocate_averagely(queues: Sequence[Q], consumer_ids: Sequence[str], me: str) -> list[Q]:
    """Contiguous ranges: the first ``len(queues) % len(ids)`` consumers get one queue more."""
    if me not in consumer_ids or not queues:
        return []
    index, n = list(consumer_ids).index(me), len(consumer_ids)
    base, extra = divmod(len(queues), n)
    size = base + (1 if index < extra else 0)
    start = index * base + min(index, extra)
    return list(queues[start : start + size])


def allocate_by_circle(queues: Sequence[Q], consumer_ids: Sequence[str], me: str) -> list[Q]:
    """Round-robin: queue i goes to consumer i mod n."""
    if me not in consumer_ids:
        return []
    index, n = list(consumer_ids).index(me), len(consumer_ids)
    return [q for i, q in enumerate(queues) if i % n == index]


STRATEGIES = {AVERAGELY: allocate_averagely, CIRCLE: allocate_by_circle}
