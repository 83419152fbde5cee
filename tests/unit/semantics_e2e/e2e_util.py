"""Helpers of the semantics end-to-end tests: read a whole topic through PullConsumer.

Consume queues are built asynchronously from the commit log, so a queue's max offset may trail a send or a commit
that just returned by a few milliseconds; the helpers read the queue ranges once the broker's dispatch has reached
the log's end they saw and the ranges have stopped moving.
"""

from __future__ import annotations

import time

from broker.client import Admin, PullConsumer, PullStatus, ReceivedMessage
from broker.errors import TopicNotExistError
from tests.support.waiting import wait_until

SETTLE_S = 0.15  # once dispatch has caught up, ranges equal across this gap: held and delayed units shown
SETTLE_TIMEOUT_S = 20.0


def dispatched(admin: Admin) -> None:
    """Wait until each broker's dispatcher has reached the commit-log end it had when called: a pause of the
    broker (a garbage collection of the test's process, which hosts it) can outlast SETTLE_S."""
    ends = {name: s["store_commit_log_max_offset"] for name, s in admin.stats_by_broker().items()}

    def reached() -> bool:
        now = admin.stats_by_broker()
        return all(now[name]["store_dispatched_offset"] >= end for name, end in ends.items() if name in now)

    wait_until(reached, f"dispatch to the commit-log ends {ends}", timeout_s=SETTLE_TIMEOUT_S)


def settled_ranges(admin: Admin, topic: str) -> dict[int, tuple[int, int]]:
    """Queue ranges once every append acknowledged before the call is dispatched and the ranges stop moving
    (delayed and held units turn visible after their dispatch)."""
    dispatched(admin)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    last = admin.queue_offsets(topic)
    while time.monotonic() < deadline:
        time.sleep(SETTLE_S)
        now = admin.queue_offsets(topic)
        if now == last:
            return now
        last = now
    raise AssertionError(f"{topic}: queue offsets still moving after {SETTLE_TIMEOUT_S} s")


def read_topic(endpoint: str, topic: str, group: str = "e2e-reader", sql: str | None = None) -> list[ReceivedMessage]:
    """Every message of every queue of ``topic`` (queue by queue, in queue order), through PullMessage."""
    out: list[ReceivedMessage] = []
    with Admin(endpoint) as admin, PullConsumer(endpoint, group) as consumer:
        for queue_id, (low, high) in sorted(settled_ranges(admin, topic).items()):
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
    """Messages in the topic's consume queues, once they have settled."""
    with Admin(endpoint) as admin:
        try:
            return sum(high - low for low, high in settled_ranges(admin, topic).values())
        except TopicNotExistError:  # nothing sent to it yet: nothing visible
            return 0
