"""The connector's way to the broker: one ``PullConsumer`` and one ``Admin`` per (endpoints, group) per process.

Spark keeps its Python workers alive between tasks (``spark.python.worker.reuse``), so caching the clients in the
module keeps one gRPC channel per worker instead of one per task. Reader objects are pickled to executors, so they
never hold a client themselves: they ask ``link_for`` every time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from broker.client import Admin, PullConsumer
from broker.errors import ServiceNotAvailableError, SubscriptionGroupNotExistError, TopicNotExistError
from connector.errors import SourceOptionError
from connector.options import SourceOptions

log = logging.getLogger(__name__)

T = TypeVar("T")
RETRY_DELAYS_S = (0.0, 0.2, 1.0, 3.0, 5.0)  # about 9 s: rides out a broker restart, not an outage

_lock = threading.Lock()
_links: dict[tuple[str, str, int], BrokerLink] = {}


@dataclass
class BrokerLink:
    consumer: PullConsumer
    admin: Admin

    def queue_offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """Queue id -> (min, max) offsets in one GetQueueOffsets call; a topic that does not exist has no queues."""
        try:
            return retried(lambda: self.admin.queue_offsets(topic))
        except TopicNotExistError:
            return {}

    def topics(self) -> list[str]:
        return sorted(t.topic for t in retried(self.admin.list_topics))

    def committed(self, topic: str) -> dict[int, int]:
        try:
            return retried(lambda: self.consumer.committed_offsets(topic))
        except TopicNotExistError:
            return {}

    def offset_by_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return retried(lambda: self.admin.search_offset_by_timestamp(topic, queue_id, timestamp_ms))

    def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        self.consumer.commit_offsets(offsets)


def unknown_group(group: str, exc: SubscriptionGroupNotExistError) -> SourceOptionError:
    """The error for a consumer group the broker refuses (it runs with auto_create_subscription_group=false):
    permanent, so it fails the query at once instead of being retried like a broker that is away."""
    return SourceOptionError(
        f"the broker refuses consumer group {group!r} ({exc.message}); set the consumerGroup option to a group it "
        f"knows, or create {group!r} on it (Admin.update_subscription_group)"
    )


def retried(call: Callable[[], T]) -> T:
    """``call()``, retried with backoff while the broker is unreachable (Kafka's source retries offset fetches too)."""
    for attempt, delay_s in enumerate(RETRY_DELAYS_S):
        time.sleep(delay_s)
        try:
            return call()
        except ServiceNotAvailableError as exc:
            if attempt == len(RETRY_DELAYS_S) - 1:
                raise
            log.warning("broker call failed (%s); retrying", exc)
    raise AssertionError("unreachable")


def link_for(options: SourceOptions) -> BrokerLink:
    key = (options.endpoints, options.pull_group, options.poll_timeout_ms)
    with _lock:
        link = _links.get(key)
        if link is None:
            timeout_s = options.poll_timeout_ms / 1000
            consumer = PullConsumer(options.endpoints, options.pull_group, timeout_s=timeout_s)
            try:
                admin = Admin(options.endpoints, timeout_s=timeout_s)
            except BaseException:  # e.g. no endpoint answered: the consumer's channel must not stay open
                consumer.close()
                raise
            link = _links[key] = BrokerLink(consumer, admin)
        return link


def close_links() -> None:
    """Close every cached channel (tests and the end of a driver-side reader)."""
    with _lock:
        for link in _links.values():
            link.consumer.close()
            link.admin.close()
        _links.clear()
