"""Resetting a consumer group's committed offsets: Kafka's ``--reset-offsets``, RocketMQ's ``resetOffsetByTime``.

A reset is planned on the client and applied by the broker in one call:

1. plan: the target of every queue of the topic (or of one queue) from the queue ranges (one GetQueueOffsets call)
   and, for a time, one SearchOffsetByTimestamp call per queue. ``earliest`` is the queue's min offset, ``latest``
   its max offset (nothing left to consume), a time the first message stored at or after it (the max offset when
   there is none), an offset the given one, moved into [min, max] when it lies outside (as Kafka does: a queue
   that does not reach offset N is set to its end, not refused);
2. apply: ResetConsumerOffsets stores every target or none, and only while the group has no live consumer. A
   running consumer keeps its offsets in memory and commits them on its next pull, so a reset under it would be
   overwritten without a word; the broker therefore refuses (Kafka refuses a reset of an active group too), and
   checks and stores in one step, so that a consumer starting meanwhile reads the reset offsets. Pull consumers
   (``sluice consume``, the Spark source) are not tracked as live: their next commit wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from broker.errors import InvalidArgumentError

if TYPE_CHECKING:
    from broker.client.admin import Admin

ResetKind = Literal["earliest", "latest", "offset", "timestamp"]


@dataclass(frozen=True)
class ResetTo:
    """Where a reset moves each queue: ``ResetTo.earliest()``, ``latest()``, ``offset(n)`` or ``timestamp(ms)``."""

    kind: ResetKind
    value: int = 0  # the offset, or the time in ms since the epoch

    @staticmethod
    def earliest() -> ResetTo:
        return ResetTo("earliest")

    @staticmethod
    def latest() -> ResetTo:
        return ResetTo("latest")

    @staticmethod
    def offset(offset: int) -> ResetTo:
        if offset < 0:
            raise InvalidArgumentError(f"offset {offset} is negative; give a queue offset >= 0")
        return ResetTo("offset", offset)

    @staticmethod
    def timestamp(timestamp_ms: int) -> ResetTo:
        if timestamp_ms < 0:
            raise InvalidArgumentError(f"timestamp {timestamp_ms} is negative; give milliseconds since the epoch")
        return ResetTo("timestamp", timestamp_ms)


@dataclass(frozen=True)
class OffsetReset:
    topic: str
    queue_id: int
    previous: int  # the committed offset replaced; -1: none was committed
    offset: int  # the committed offset now (or, for a dry run, the one a reset would set)
    min_offset: int
    max_offset: int
    broker_name: str = ""  # the broker holding the queue ("" for a client of one broker)


def plan_reset(admin: Admin, topic: str, to: ResetTo, queue_id: int | None = None) -> dict[int, tuple[int, int, int]]:
    """Queue id -> (target offset, min offset, max offset) for every queue of ``topic`` (or ``queue_id`` only)."""
    ranges = admin.queue_offsets(topic)
    if queue_id is not None:
        if queue_id not in ranges:
            raise InvalidArgumentError(
                f"topic {topic!r} has no queue {queue_id}; its queues are 0..{max(ranges, default=-1)}"
            )
        ranges = {queue_id: ranges[queue_id]}
    plan = {}
    for qid, (lo, hi) in sorted(ranges.items()):
        if to.kind == "earliest":
            target = lo
        elif to.kind == "latest":
            target = hi
        elif to.kind == "offset":
            target = to.value
        else:
            target = admin.search_offset_by_timestamp(topic, qid, to.value) if hi > lo else hi
        plan[qid] = (min(max(target, lo), hi), lo, hi)
    return plan
