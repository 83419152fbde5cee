"""Router: a client's view of where topics live, and one connection per broker it talks to.

Every client (producer, consumers, admin, the Spark connector) goes through one. It is built from either

* ``namesrv="host:port[,host:port]"`` (or ``$SLUICE_NAMESRV``): cluster mode. Routes come from the name servers,
  tried in turn, cached for ``ROUTE_TTL_S`` (30 s, RocketMQ's pollNameServerInterval) and fetched again at once
  after any routing error (a broker that refused or did not answer, a topic a broker no longer holds);
* ``endpoint="host:port"`` (or ``$SLUICE_ENDPOINT``, default 127.0.0.1:10911): one broker, whose route for a
  topic is that broker's own answer (GetTopicRoute) under the broker name ``""``.

Auto-created topics (cluster mode): a topic no live broker holds is created, when the caller allows it, by
asking one broker that registered ``auto_create_topic_enable`` to create it (RocketMQ creates a topic on the
broker that received the first send). That broker registers it with every name server at once; until a name
server lists it, the route holds that broker alone.

Avoiding failed brokers: ``mark_failed`` keeps a broker out of the writable choices for ``FAULT_ISOLATION_S``
(RocketMQ's latency fault tolerance isolates a broker after an exception); the send path still uses it when no
other broker can take a message.

TLS (broker/client/tls.py): one ``TlsSettings`` (or ``https://`` on the endpoint or a name server) serves the
name servers and every broker the router connects to; a cluster runs TLS everywhere or nowhere.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Self

from broker.client.connection import ENDPOINT_ENV, Connection, resolve_endpoint
from broker.client.credentials import Credentials
from broker.client.namesrv_client import NAMESRV_ENV, NameServerClient, parse_namesrv_list
from broker.client.remoting_transport import RemotingConnection, is_remoting
from broker.client.route import DIRECT_BROKER, MASTER_ID, BrokerGroup, MessageQueue, QueueData, TopicRoute
from broker.client.tls import TlsSettings, resolve
from broker.errors import BrokerError, InvalidArgumentError, ServiceNotAvailableError, TopicNotExistError
from broker.proto import namesrv_pb2 as npb
from broker.proto import sluice_pb2 as pb

log = logging.getLogger(__name__)

ROUTE_TTL_S = 30.0  # RocketMQ's pollNameServerInterval
PROVISIONAL_ROUTE_TTL_S = 1.0  # an auto-created topic's one-broker route, until the name servers list it
FAULT_ISOLATION_S = 30.0
MAX_CACHED_ROUTES = 10_000  # topics one client keeps routes for; the oldest entry goes first past this


def choose_source(endpoint: str | None, namesrv: str | None) -> tuple[str | None, list[str] | None]:
    """(endpoint, None) or (None, name servers): explicit arguments first, then $SLUICE_NAMESRV, then the endpoint's
    own defaults ($SLUICE_ENDPOINT, 127.0.0.1:10911)."""
    if endpoint and namesrv:
        raise InvalidArgumentError("give either endpoint= (one broker) or namesrv= (a cluster), not both")
    if namesrv:
        return None, parse_namesrv_list(namesrv)
    if endpoint:
        return endpoint, None
    if os.environ.get(NAMESRV_ENV) and not os.environ.get(ENDPOINT_ENV):
        return None, parse_namesrv_list(os.environ[NAMESRV_ENV])
    return resolve_endpoint(None), None


class Router:
    def __init__(self, endpoint: str | None = None, namesrv: str | None = None, *, timeout_s: float = 30.0,
                 tls: TlsSettings | None = None, credentials: Credentials | None = None) -> None:
        self.timeout_s = timeout_s
        endpoint, tls = resolve(endpoint, tls)
        namesrv, tls = resolve(namesrv, tls)
        direct, servers = choose_source(endpoint, namesrv)
        if direct is not None:
            direct, tls = resolve(direct, tls)  # $SLUICE_ENDPOINT may say https:// too
        elif namesrv is None:
            tls = resolve(os.environ.get(NAMESRV_ENV, ""), tls)[1]  # and $SLUICE_NAMESRV
        self.tls = tls
        self.credentials = credentials
        self.namesrv: NameServerClient | None = NameServerClient(servers, tls=self.tls) if servers else None
        self._direct: Connection | None = self._open(direct) if direct else None
        self._lock = threading.Lock()
        self._routes: dict[str, tuple[float, TopicRoute]] = {}  # topic -> (monotonic expiry, route)
        self._connections: dict[str, Connection] = {}
        self._failed_until: dict[str, float] = {}  # broker name -> monotonic time it may be chosen again
        self._auto_create_brokers: tuple[float, list[BrokerGroup]] = (0.0, [])

    def _open(self, endpoint: str) -> Connection:
        """A gRPC connection, or the remoting transport's for ``remoting://host:port`` (remoting_transport.py)."""
        if not is_remoting(endpoint):
            return Connection(endpoint, self.timeout_s, self.tls, self.credentials)
        if self.tls is not None or self.credentials is not None:
            raise InvalidArgumentError("TLS and signed requests are not offered over remoting:// yet; use gRPC")
        return RemotingConnection(endpoint, self.timeout_s)  # type: ignore[return-value]  # a Connection's interface

    @property
    def cluster_mode(self) -> bool:
        return self.namesrv is not None

    @property
    def direct(self) -> Connection:
        """The one broker's connection (not in cluster mode)."""
        if self._direct is None:
            raise InvalidArgumentError("this client talks to a cluster (namesrv=); name the broker of the queue")
        return self._direct

    def describe(self) -> str:
        if self.namesrv is not None:
            return "name servers " + ",".join(self.namesrv.addresses)
        return f"broker {self.direct.endpoint}"

    # ---------------------------------------------------------------------------------------------- routes
    def route(self, topic: str, *, auto_create: bool = False) -> TopicRoute:
        """The topic's route, cached; TopicNotExistError when no broker holds it (and it may not be created)."""
        now = time.monotonic()
        with self._lock:
            cached = self._routes.get(topic)
        if cached is not None and cached[0] > now:
            return cached[1]
        route, ttl = self._fetch(topic, auto_create)
        with self._lock:
            if len(self._routes) >= MAX_CACHED_ROUTES and topic not in self._routes:
                self._routes.pop(next(iter(self._routes)))
            self._routes[topic] = (time.monotonic() + ttl, route)
        return route

    def refresh(self, topic: str) -> None:
        """Forget the topic's route: the next use asks again (after a routing error)."""
        with self._lock:
            self._routes.pop(topic, None)

    def _fetch(self, topic: str, auto_create: bool) -> tuple[TopicRoute, float]:
        if self._direct is not None:
            info = self._direct.call(self._direct.stub.GetTopicRoute,
                                     pb.GetTopicRouteRequest(topic=topic, auto_create=auto_create))
            return TopicRoute.direct(topic, info.read_queue_nums, info.write_queue_nums, info.perm,
                                     self._direct.endpoint), ROUTE_TTL_S
        assert self.namesrv is not None
        try:
            return TopicRoute.from_pb(topic, self.namesrv.route(topic)), ROUTE_TTL_S
        except TopicNotExistError:
            if not auto_create:
                raise
        return self._auto_create(topic), PROVISIONAL_ROUTE_TTL_S

    def _auto_create(self, topic: str) -> TopicRoute:
        """Create ``topic`` on one broker that allows auto-creation, chosen at random (spreading new topics)."""
        candidates = self.auto_create_brokers()
        if not candidates:
            raise TopicNotExistError(
                f"topic {topic!r} does not exist and no live broker of {self.describe()} creates topics on first "
                f"send; create it with `sluice topic create {topic}`"
            )
        group = random.choice(candidates)
        assert group.master is not None
        conn = self.connection(group.master)
        info = conn.call(conn.stub.GetTopicRoute, pb.GetTopicRouteRequest(topic=topic, auto_create=True))
        log.info("topic %s auto-created on broker %s", topic, group.broker_name)
        queues = (QueueData(group.broker_name, info.read_queue_nums, info.write_queue_nums, info.perm),)
        return TopicRoute(topic, queues, {group.broker_name: group})

    def auto_create_brokers(self) -> list[BrokerGroup]:
        now = time.monotonic()
        expiry, cached = self._auto_create_brokers
        if expiry > now:
            return cached
        groups = [
            BrokerGroup(b.cluster, b.broker_name, {MASTER_ID: b.address})
            for b in self.cluster_brokers()
            if b.auto_create_topic_enable and b.broker_id == MASTER_ID
        ]
        self._auto_create_brokers = (now + ROUTE_TTL_S, groups)
        return groups

    def cluster_brokers(self) -> list[npb.BrokerLiveInfo]:
        """Every live broker the name servers know (BrokerLiveInfo messages)."""
        if self.namesrv is None:
            return []
        return list(self.namesrv.cluster_info().brokers)

    # ---------------------------------------------------------------------------------------------- connections
    def connection(self, address: str) -> Connection:
        with self._lock:
            conn = self._connections.get(address)
            if conn is None:
                conn = self._connections[address] = Connection(address, self.timeout_s, self.tls, self.credentials)
            return conn

    def broker_connection(self, topic: str, broker_name: str, *, write: bool) -> Connection:
        """The connection to ``broker_name`` for ``topic``: its master for writes, any live broker for reads."""
        if self._direct is not None:
            if broker_name != DIRECT_BROKER:
                raise InvalidArgumentError(
                    f"queue of broker {broker_name!r}, but this client talks to the single broker {self.describe()}"
                )
            return self._direct
        group = self.group(topic, broker_name)
        address = group.master if write else group.read_address()
        if address is None:
            raise ServiceNotAvailableError(
                f"broker group {broker_name!r} has no live {'master' if write else 'broker'} in {self.describe()}"
            )
        return self.connection(address)

    def queue_connection(self, mq: MessageQueue, *, write: bool = False) -> Connection:
        return self.broker_connection(mq.topic, mq.broker_name, write=write)

    def group(self, topic: str, broker_name: str) -> BrokerGroup:
        route = self.route(topic)
        group = route.groups.get(broker_name)
        if group is None:
            self.refresh(topic)
            group = self.route(topic).groups.get(broker_name)
        if group is None:
            raise TopicNotExistError(f"broker {broker_name!r} holds no queue of topic {topic!r} in {self.describe()}")
        return group

    # ---------------------------------------------------------------------------------------------- faults
    def mark_failed(self, broker_name: str, topic: str | None = None) -> None:
        with self._lock:
            self._failed_until[broker_name] = time.monotonic() + FAULT_ISOLATION_S
        if topic is not None:
            self.refresh(topic)

    def mark_ok(self, broker_name: str) -> None:
        if broker_name in self._failed_until:
            with self._lock:
                self._failed_until.pop(broker_name, None)

    def available(self, broker_name: str) -> bool:
        until = self._failed_until.get(broker_name)
        return until is None or until <= time.monotonic()

    # ---------------------------------------------------------------------------------------------- fan-out
    def each_broker(self, topic: str, call: Callable[[str, Connection], object], *, write: bool = False) -> None:
        """``call(broker_name, connection)`` for each broker group holding ``topic``."""
        for name in self.route(topic).broker_names:
            call(name, self.broker_connection(topic, name, write=write))

    def close(self) -> None:
        with self._lock:
            conns = list(self._connections.values())
            self._connections.clear()
        for conn in conns:
            conn.close()
        if self._direct is not None:
            self._direct.close()
        if self.namesrv is not None:
            self.namesrv.close()


def first_available(queues: list[MessageQueue], start: int, ok: Callable[[str], bool],
                    exclude: frozenset[str] = frozenset()) -> MessageQueue:
    """Round-robin from ``start``: the first queue whose broker is ``ok`` and not excluded, else the first not
    excluded, else the first (RocketMQ's selectOneMessageQueue with fault tolerance)."""
    n = len(queues)
    for i in range(n):
        mq = queues[(start + i) % n]
        if mq.broker_name not in exclude and ok(mq.broker_name):
            return mq
    for i in range(n):
        mq = queues[(start + i) % n]
        if mq.broker_name not in exclude:
            return mq
    return queues[start % n]


class RouterClient:
    """A client that reaches brokers through a Router: its own, made from ``endpoint=`` or ``namesrv=``, TLS and
    credentials and closed with the client; or one given (``router=``), shared and left open. A context manager."""

    def __init__(
        self, endpoint: str | None, namesrv: str | None, timeout_s: float, router: Router | None,
        tls_ca: str | None, tls_cert: str | None, tls_key: str | None, access_key: str | None,
        secret_key: str | None,
    ) -> None:
        self.router = router or Router(endpoint, namesrv, timeout_s=timeout_s,
                                       tls=TlsSettings.of(tls_ca, tls_cert, tls_key),
                                       credentials=Credentials.of(access_key, secret_key))
        self._owns_router = router is None

    def close(self) -> None:
        if self._owns_router:
            self.router.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["BrokerError", "MessageQueue", "Router", "RouterClient", "TopicRoute", "first_available"]
