"""The connector's way to its brokers: one link per (brokers, group) per process, for the driver and the executors.

A link answers in the connector's terms: queues are ``(topic, broker, queue id)``. ``DirectLink`` talks to one
broker (option ``endpoints``), whose queues carry the ``brokerName`` option's name; ``ClusterLink``
(cluster_link.py) to every broker of a cluster found through its name servers (option ``namesrv``).

Spark keeps its Python workers alive between tasks (``spark.python.worker.reuse``), so caching the links in the
module keeps one gRPC channel per broker per worker instead of one per task. Reader objects are pickled to
executors, so they never hold a link themselves: they ask ``link_for`` every time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from broker.client import Admin, PullConsumer, RawPullResult
from broker.client.route import DIRECT_BROKER, MessageQueue
from broker.errors import ServiceNotAvailableError, SubscriptionGroupNotExistError, TopicNotExistError
from connector.auth_options import ANONYMOUS, AuthKeys
from connector.connector_errors import SourceOptionError
from connector.offsets import QueueKey
from connector.options import SourceOptions
from connector.tls_options import PLAIN, TlsFiles

log = logging.getLogger(__name__)

T = TypeVar("T")
RETRY_DELAYS_S = (0.0, 0.2, 1.0, 3.0, 5.0)  # about 9 s: rides out a broker restart, not an outage

_lock = threading.Lock()
LinkKey = tuple[str, str, str, int, TlsFiles, AuthKeys]  # (brokers, broker name, group, timeout, TLS, credentials)
# keyed by the credentials too: two queries of different users in one worker never share a channel
_links: dict[LinkKey, BrokerLink] = {}

BrokerQueue = tuple[str, int]  # (broker name, queue id)


class BrokerLink:
    """What the source asks of its brokers (every method retried while a broker restarts)."""

    consumer: PullConsumer

    def queue_offsets(self, topic: str, gone: dict[str, str] | None = None) -> dict[BrokerQueue, tuple[int, int]]:
        """(broker, queue id) -> (min, max) offsets of every queue of ``topic``; a topic that does not exist has
        none. ``gone``: given (a cluster), a broker of the topic's route that does not answer is left out and named
        there with the reason, instead of failing the call."""
        raise NotImplementedError

    def topics(self) -> list[str]:
        raise NotImplementedError

    def committed(self, topic: str) -> dict[BrokerQueue, int]:
        """The consumer group's committed offsets of ``topic``'s queues (only those it committed)."""
        raise NotImplementedError

    def offset_by_timestamp(self, topic: str, broker: str, queue_id: int, timestamp_ms: int) -> int:
        raise NotImplementedError

    def commit(self, offsets: Mapping[QueueKey, int]) -> None:
        raise NotImplementedError

    def pull_raw(self, key: QueueKey, offset: int, *, max_msgs: int, tags: str) -> RawPullResult:
        """One pull that never waits (the driver planned only offsets that exist)."""
        raise NotImplementedError

    def live_brokers(self) -> set[str] | None:
        """The brokers the name servers list now; None with one broker (it cannot leave a cluster)."""
        return None

    def queues_on(self, broker: str, topic: str) -> set[int] | None:
        """The queue ids ``broker`` itself reports for ``topic``, asked directly rather than through a route the
        client cached; None when no name server lists the broker. ServiceNotAvailableError when it does not
        answer. (A cluster only: a queue missing from a snapshot is then told from one missing from a stale
        route.)"""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class DirectLink(BrokerLink):
    """One broker (``endpoints``); its queues are named by ``broker_name`` (the ``brokerName`` option)."""

    def __init__(self, endpoints: str, broker_name: str, group: str, timeout_s: float,
                 tls: TlsFiles = PLAIN, auth: AuthKeys = ANONYMOUS) -> None:
        self.name = broker_name
        self.consumer = PullConsumer(endpoints, group, timeout_s=timeout_s, **tls.client_args(), **auth.client_args())
        try:
            self.admin = Admin(endpoints, timeout_s=timeout_s, **tls.client_args(), **auth.client_args())
        except BaseException:  # e.g. no endpoint answered: the consumer's channel must not stay open
            self.consumer.close()
            raise

    def queue_offsets(self, topic: str, gone: dict[str, str] | None = None) -> dict[BrokerQueue, tuple[int, int]]:
        try:
            found = retried(lambda: self.admin.queue_offsets(topic))
        except TopicNotExistError:
            return {}
        return {(self.name, qid): lo_hi for qid, lo_hi in found.items()}

    def topics(self) -> list[str]:
        return sorted(t.topic for t in retried(self.admin.list_topics))

    def committed(self, topic: str) -> dict[BrokerQueue, int]:
        try:
            found = retried(lambda: self.consumer.committed_offsets(topic))
        except TopicNotExistError:
            return {}
        return {(self.name, qid): off for qid, off in found.items()}

    def offset_by_timestamp(self, topic: str, broker: str, queue_id: int, timestamp_ms: int) -> int:
        return retried(lambda: self.admin.search_offset_by_timestamp(topic, queue_id, timestamp_ms))

    def commit(self, offsets: Mapping[QueueKey, int]) -> None:
        self.consumer.commit_offsets({(t, q): off for (t, _, q), off in offsets.items()})

    def pull_raw(self, key: QueueKey, offset: int, *, max_msgs: int, tags: str) -> RawPullResult:
        topic, _, qid = key
        mq = MessageQueue(topic, DIRECT_BROKER, qid)
        return retried(lambda: self.consumer.pull_raw(mq, offset, max_msgs=max_msgs, timeout_ms=0, tags=tags))

    def close(self) -> None:
        self.consumer.close()
        self.admin.close()


def unknown_group(group: str, exc: SubscriptionGroupNotExistError) -> SourceOptionError:
    """The error for a consumer group the broker refuses (it runs with auto_create_subscription_group=false):
    permanent, so it fails the query at once instead of being retried like a broker that is away."""
    return SourceOptionError(
        f"the broker refuses consumer group {group!r} ({exc.message}); set the consumerGroup option to a group it "
        f"knows, or create {group!r} on it (Admin.update_subscription_group)"
    )


def retried(call: Callable[[], T], delays_s: tuple[float, ...] = RETRY_DELAYS_S) -> T:
    """``call()``, retried with backoff while the broker is unreachable (Kafka's source retries offset fetches too)."""
    for attempt, delay_s in enumerate(delays_s):
        time.sleep(delay_s)
        try:
            return call()
        except ServiceNotAvailableError as exc:
            if attempt == len(delays_s) - 1:
                raise
            log.warning("broker call failed (%s); retrying", exc)
    raise AssertionError("unreachable")


def _link_key(options: SourceOptions) -> LinkKey:
    return (options.namesrv or options.endpoints or "", options.broker_name or "", options.pull_group,
            options.poll_timeout_ms, options.tls, options.auth)


def link_for(options: SourceOptions) -> BrokerLink:
    from connector.cluster_link import ClusterLink

    key = _link_key(options)
    with _lock:
        link = _links.get(key)
        if link is None:
            timeout_s = options.poll_timeout_ms / 1000
            if options.namesrv is not None:
                link = ClusterLink(options.namesrv, options.pull_group, timeout_s, options.tls, options.auth)
            else:
                assert options.endpoints is not None and options.broker_name is not None
                link = DirectLink(options.endpoints, options.broker_name, options.pull_group, timeout_s,
                                  options.tls, options.auth)
            _links[key] = link
        return link


def release_link(options: SourceOptions) -> None:
    """Close and forget the link of ``options`` (the end of a driver-side reader); a later ``link_for`` opens a new
    one. Links of other options stay open: other queries of the process may be using them."""
    with _lock:
        link = _links.pop(_link_key(options), None)
    if link is not None:
        link.close()


def close_links() -> None:
    """Close every cached channel of this process."""
    with _lock:
        for link in _links.values():
            link.close()
        _links.clear()
