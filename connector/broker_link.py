"""The connector's way to the broker: one ``PullConsumer`` and one ``Admin`` per (endpoints, group) per process.

Spark keeps its Python workers alive between tasks (``spark.python.worker.reuse``), so caching the clients in the
module keeps one gRPC channel per worker instead of one per task. Reader objects are pickled to executors, so they
never hold a client themselves: they ask ``link_for`` every time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from broker.client import Admin, PullConsumer
from broker.errors import TopicNotExistError
from connector.options import SourceOptions

log = logging.getLogger(__name__)

_lock = threading.Lock()
_links: dict[tuple[str, str, int], BrokerLink] = {}


@dataclass
class BrokerLink:
    consumer: PullConsumer
    admin: Admin

    def queue_offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """Queue id -> (min, max) offsets in one GetQueueOffsets call; a topic that does not exist has no queues."""
        try:
            return self.admin.queue_offsets(topic)
        except TopicNotExistError:
            return {}

    def topics(self) -> list[str]:
        return sorted(t.topic for t in self.admin.list_topics())

    def committed(self, topic: str) -> dict[int, int]:
        try:
            return self.consumer.committed_offsets(topic)
        except TopicNotExistError:
            return {}

    def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        self.consumer.commit_offsets(offsets)


def link_for(options: SourceOptions) -> BrokerLink:
    key = (options.endpoints, options.pull_group, options.poll_timeout_ms)
    with _lock:
        link = _links.get(key)
        if link is None:
            timeout_s = options.poll_timeout_ms / 1000
            link = BrokerLink(
                PullConsumer(options.endpoints, options.pull_group, timeout_s=timeout_s),
                Admin(options.endpoints, timeout_s=timeout_s),
            )
            _links[key] = link
        return link


def close_links() -> None:
    """Close every cached channel (tests and the end of a driver-side reader)."""
    with _lock:
        for link in _links.values():
            link.consumer.close()
            link.admin.close()
        _links.clear()
