"""Helpers of the semantics end-to-end tests: read a whole topic through PullConsumer."""

from __future__ import annotations

from broker.client import Admin, PullConsumer, PullStatus, ReceivedMessage
from broker.errors import TopicNotExistError


def read_topic(endpoint: str, topic: str, group: str = "e2e-reader", sql: str | None = None) -> list[ReceivedMessage]:
    """Every message of every queue of ``topic`` (queue by queue, in queue order), through PullMessage."""
    out: list[ReceivedMessage] = []
    with Admin(endpoint) as admin, PullConsumer(endpoint, group) as consumer:
        ranges = admin.queue_offsets(topic)
        for queue_id, (low, high) in sorted(ranges.items()):
            offset = low
            while offset < high:
                r = consumer.pull(topic, queue_id, offset, max_msgs=4096, sql=sql)
                if r.status is PullStatus.FOUND or r.status is PullStatus.NO_MATCHED_MSG:
                    out += r.messages
                    assert r.next_begin_offset > offset, (topic, queue_id, offset, r)
                    offset = r.next_begin_offset
                else:
                    raise AssertionError(f"pull {topic}/{queue_id} at {offset} of {high}: {r.status}")
    return out


def visible_count(endpoint: str, topic: str) -> int:
    with Admin(endpoint) as admin:
        try:
            return sum(high - low for low, high in admin.queue_offsets(topic).values())
        except TopicNotExistError:  # nothing sent to it yet: nothing visible
            return 0
