"""A PushConsumer's settings, checked once, and the state its parts share: the workers by queue, the locks held,
the group's versions seen at the last heartbeat.

Apart so that the heartbeat, the orderly locks and the rebalance (each in its own module) build on one set of
fields, and the consumer itself (push_consumer.py) keeps its lifecycle and delivery."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from broker.client.allocation import AVERAGELY, STRATEGIES
from broker.client.connection import Connection
from broker.client.consumer_options import (
    BROADCASTING,
    CLUSTERING,
    LAST,
    ConsumeFrom,
    ConsumeStatus,
    MessageModel,
)
from broker.client.credentials import Credentials
from broker.client.offset_store import LocalOffsetStore, OffsetStore, RemoteOffsetStore
from broker.client.push_worker import QueueWorker
from broker.client.results import ReceivedMessage
from broker.client.route import MessageQueue
from broker.client.router import Router
from broker.client.tls import TlsSettings
from broker.errors import InvalidArgumentError
from broker.format.lock_lease import DEFAULT_LOCK_MAX_LIVE_MS
from broker.format.subscription import parse_tags
from broker.format.system_topics import DLQ_GROUP_TOPIC_PREFIX, retry_topic

# Orderly: how long the client trusts a lock without renewing it -- RocketMQ's client lockMaxLiveTime, half of the
# broker's (broker.format.lock_lease.DEFAULT_LOCK_MAX_LIVE_MS), so a client whose renewals stop pauses its queues
# well before the broker could give them to another consumer.
CLIENT_LOCK_MAX_LIVE_MS = DEFAULT_LOCK_MAX_LIVE_MS // 2
DEFAULT_ROUTE_POLL_INTERVAL_MS = 30_000  # RocketMQ's pollNameServerInterval
# Heartbeats, member lists and locks: in-memory lookups on the broker. The control thread sends them to each broker
# in turn, so one that does not answer (a host gone from the network) must not hold the others' lock renewals and
# commits up for a whole request timeout.
CONTROL_CALL_TIMEOUT_S = 5.0


Listener = Callable[[list[ReceivedMessage]], ConsumeStatus | None]


def default_client_id() -> str:
    return f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"


def _check_positive(**settings: float) -> None:
    """InvalidArgumentError naming the first setting that is not > 0. A consumer built with, say, long_poll_ms=0
    would pull in a busy loop, and a negative one would have every pull refused while it logged retries."""
    for name, value in settings.items():
        if not value > 0:
            raise InvalidArgumentError(f"{name}={value} must be > 0")


class PushConsumerState:
    """The consumer's settings and shared state; PushConsumer is this class with its parts."""

    def __init__(
        self, endpoint: str | None, group: str, subscription: Mapping[str, str], listener: Listener, *,
        namesrv: str | None = None, model: MessageModel = CLUSTERING, consume_from: ConsumeFrom = LAST,
        consume_timestamp_ms: int = 0, allocate: str = AVERAGELY, client_id: str | None = None,
        pull_batch_size: int = 32, consume_batch_size: int = 1, long_poll_ms: int = 15_000,
        heartbeat_interval_ms: int = 30_000, rebalance_interval_ms: int = 20_000, persist_interval_ms: int = 5_000,
        pull_backoff_ms: int = 3_000, reconsume_delay_ms: int = 1_000, offset_store_path: str | Path | None = None,
        timeout_s: float = 30.0, orderly: bool = False, max_reconsume_times: int = -1,
        expression_types: Mapping[str, str] | None = None, lock_renew_interval_ms: int = 20_000,
        send_back: bool = True, lock_max_live_ms: int = CLIENT_LOCK_MAX_LIVE_MS,
        route_poll_interval_ms: int = DEFAULT_ROUTE_POLL_INTERVAL_MS,
        tls_ca: str | None = None, tls_cert: str | None = None, tls_key: str | None = None,
        access_key: str | None = None, secret_key: str | None = None,
    ) -> None:
        """``endpoint``: one broker (``host:port``); or ``None`` with ``namesrv="host:port[,host:port]"``: a
        cluster found through its name servers."""
        if not subscription:
            raise InvalidArgumentError("subscription is empty; give {topic: tag expression}, e.g. {'T': '*'}")
        dead = [t for t in subscription if t.startswith(DLQ_GROUP_TOPIC_PREFIX)]
        if dead:
            raise InvalidArgumentError(f"{dead[0]} is a dead-letter queue: its messages are never redelivered")
        if allocate not in STRATEGIES:
            raise InvalidArgumentError(f"allocate {allocate!r} is not one of {sorted(STRATEGIES)}")
        _check_positive(
            pull_batch_size=pull_batch_size, consume_batch_size=consume_batch_size, long_poll_ms=long_poll_ms,
            heartbeat_interval_ms=heartbeat_interval_ms, rebalance_interval_ms=rebalance_interval_ms,
            persist_interval_ms=persist_interval_ms, pull_backoff_ms=pull_backoff_ms,
            lock_renew_interval_ms=lock_renew_interval_ms, lock_max_live_ms=lock_max_live_ms, timeout_s=timeout_s,
            route_poll_interval_ms=route_poll_interval_ms,
        )
        if reconsume_delay_ms < 0:
            raise InvalidArgumentError(f"reconsume_delay_ms={reconsume_delay_ms} is negative; use 0 or more")
        self.group, self.listener, self.model = group, listener, model
        self.subscription = dict(subscription)
        self.expression_types = {t: k.upper() for t, k in (expression_types or {}).items()}
        self.orderly, self.max_reconsume_times = orderly, max_reconsume_times
        self.lock_renew_interval_ms, self.lock_max_live_ms = lock_renew_interval_ms, lock_max_live_ms
        self.send_back = send_back and model is CLUSTERING and not orderly
        self.retry_topic = retry_topic(group)
        if self.send_back:  # failed messages come back through the group's retry topic
            self.subscription.setdefault(self.retry_topic, "*")
        self.tag_sets = {
            t: None if self.expression_types.get(t, "TAG") == "SQL92" else parse_tags(e)
            for t, e in self.subscription.items()
        }  # refuses bad tag expressions now; SQL92 ones are checked by the broker at the first pull
        self._locked: dict[MessageQueue, float] = {}  # orderly: queue -> time.monotonic() until which it is ours
        self._lock_calls = threading.RLock()  # orders lock renewals and unlocks of one queue as they were decided
        self.allocate = STRATEGIES[allocate]
        self.client_id = client_id or default_client_id()
        self.pull_batch_size, self.consume_batch_size = pull_batch_size, max(1, consume_batch_size)
        self.long_poll_ms, self.pull_backoff_ms, self.reconsume_delay_ms = (
            long_poll_ms,
            pull_backoff_ms,
            reconsume_delay_ms,
        )
        self.heartbeat_interval_ms, self.rebalance_interval_ms = heartbeat_interval_ms, rebalance_interval_ms
        self.persist_interval_ms, self.route_poll_interval_ms = persist_interval_ms, route_poll_interval_ms
        self.control_timeout_s = min(timeout_s, CONTROL_CALL_TIMEOUT_S)
        # after the checks: a refusal opens nothing
        self.router = Router(
            endpoint,
            namesrv,
            timeout_s=timeout_s,
            tls=TlsSettings.of(tls_ca, tls_cert, tls_key),
            credentials=Credentials.of(access_key, secret_key),
        )
        self.offsets: OffsetStore = (
            LocalOffsetStore(self.router, consume_from, consume_timestamp_ms, offset_store_path)
            if model is BROADCASTING
            else RemoteOffsetStore(self.router, group, consume_from, consume_timestamp_ms)
        )
        self._workers: dict[MessageQueue, QueueWorker] = {}
        self._retiring: dict[MessageQueue, QueueWorker] = {}  # dropped, still finishing (a listener call running)
        self._desired: set[MessageQueue] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = threading.Event()  # shutdown finished: committed, unregistered, channels closed
        self._rebalance_now = threading.Event()
        self._control: threading.Thread | None = None
        self._group_versions: dict[str, int] = {}  # broker address -> the group's version there at the last heartbeat
        self._next_route_poll = 0.0
        self._unrouted: set[str] = set()  # subscribed topics no broker holds now (logged once until they appear)

    @property
    def conn(self) -> Connection:
        """The broker's connection, for a consumer of one broker (``endpoint=``)."""
        return self.router.direct
