"""Registration with the name servers: on start, whenever the broker's topics change, and every 30 s.

Design (RocketMQ's BrokerOuterAPI.registerBrokerAll, over Sluice's own messages):

* The broker registers with every name server, each on its own: one that is down delays nobody, and is tried again
  at the next pass.
* A full registration carries every client-visible topic with its queue counts and permission, and the topic
  table's data version. When a name server already holds that version, the next passes send a keep-alive with the
  version only, so an unchanged broker with 10,000 topics costs the name server a few bytes every 30 s. A name
  server that does not hold the version (it restarted, or expired the broker) answers ``accepted = False``, and
  the full registration follows at once.
* A topic created or deleted wakes the registrar at once: a producer that auto-created a topic on this broker
  finds its route within a round trip, not within 30 s.
* On a clean shutdown the broker unregisters from every name server, so clients stop routing to it at once rather
  than after the name servers' expiry time (120 s).
* A registration the name server refuses (another live broker holds this name and id) is logged at ERROR on every
  pass; the broker keeps serving its direct clients.
* A broker with ``--auth`` registers only where registration is authenticated: otherwise anyone could replace or
  remove its routes there, whatever the broker itself checks. Its registrations say so
  (``require_authentication``), and a name server that takes registrations from anyone refuses them before it
  stores anything, so the route never names the broker even for a moment; the answer of a name server that did
  authenticate says so (``authenticated``), and a broker that gets an answer without it (a name server that
  predates the field) unregisters at once and counts it as a refusal. Both ends decide from a field rather than by
  probing with an unsigned call: a probe would be refused, logged and counted on every name server at every pass,
  and on a name server that takes anyone would itself change the route.

Internal topics (the schedule and transaction topics) are not registered: no client reads or writes them.

A replicated broker (broker/ha) registers its role, master epoch, whether it is in sync and how far behind its
master it is, and registers again at once when its role changes. In controller mode the master registers as broker
id 0 and a slave under its own id: a replica that changes role unregisters the id it held before. The name
server's answer names the group's master and its replication endpoint, where a classic slave connects.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from broker.client.namesrv_client import NameServerClient
from broker.errors import BrokerError, BrokerUnreachableError, NoPermissionError
from broker.format.system_topics import is_system_topic
from broker.namesrv.route_table import Runtime
from broker.proto import namesrv_pb2 as npb
from broker.server.broker_identity import BrokerIdentity
from broker.server.topic_config import TopicConfigManager

if TYPE_CHECKING:
    from broker.ha.manager import Status

log = logging.getLogger(__name__)

DEFAULT_REGISTER_INTERVAL_MS = 30_000  # RocketMQ's registerNameServerPeriod
REGISTER_TIMEOUT_S = 5.0
UNREGISTER_TIMEOUT_S = 2.0  # a clean shutdown waits at most this long per name server


@dataclass
class _ServerState:
    sent_version: int = -1  # the data version this name server last accepted in a full registration
    refused: bool = False


class NameServerRegistrar:
    def __init__(
        self, namesrv: NameServerClient, identity: BrokerIdentity, topics: TopicConfigManager, *,
        interval_ms: int = DEFAULT_REGISTER_INTERVAL_MS, auto_create_topic_enable: bool = True,
        runtime: Callable[[], Runtime] = Runtime, role: str = "MASTER", ha_address: str = "",
        replica_status: Callable[[], Status] | None = None, require_authentication: bool = False,
        remoting_address: str = "",
    ) -> None:
        """``require_authentication``: register only with name servers that authenticate (module docstring)."""
        self.namesrv = namesrv
        self.require_authentication = require_authentication
        self.identity = identity
        self.topics = topics
        self.interval_ms = interval_ms
        self.auto_create_topic_enable = auto_create_topic_enable
        self.runtime = runtime
        self.role, self.ha_address = role, ha_address
        self.remoting_address = remoting_address  # the RocketMQ remoting port clients reach ("": none served)
        self.replica_status = replica_status
        self.master_ha_address = ""  # the group's master's replication endpoint, from the last answer
        self._registered_id = identity.broker_id
        self._states = {a: _ServerState() for a in namesrv.addresses}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.registrations = 0  # full registrations accepted, for tests and stats

    def start(self) -> None:
        self.register_all()  # before the broker reports ready: routes exist as soon as it serves
        self.topics.add_listener(self._wake.set)
        self._thread = threading.Thread(target=self._loop, name="namesrv-registrar", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Register now (the topics or this replica's role changed)."""
        self._wake.set()

    def _loop(self) -> None:
        next_pass = time.monotonic() + self.interval_ms / 1000
        while not self._stop.is_set():
            self._wake.wait(max(0.0, next_pass - time.monotonic()))
            if self._stop.is_set():
                return
            self._wake.clear()
            next_pass = time.monotonic() + self.interval_ms / 1000
            self.register_all()

    def register_all(self) -> None:
        self._follow_role()
        for address in self.namesrv.addresses:
            try:
                self._register(address)
            except BrokerUnreachableError as e:
                log.warning("name server %s did not answer the registration (%s); trying again in %d s", address,
                            e.message, self.interval_ms // 1000)
            except BrokerError as e:
                state = self._states[address]
                state.refused, state.sent_version = True, -1
                log.error("name server %s refused this broker's registration: %s", address, e.message)

    def _follow_role(self) -> None:
        """A replica whose registered id changes with its role (controller mode) leaves its old id first."""
        if self.replica_status is None:
            return
        status = self.replica_status()
        self.role = status.role or "SLAVE"
        if status.registered_id == self._registered_id:
            return
        old = self._registered_id
        self._unregister(old)
        self.identity = replace(self.identity, broker_id=status.registered_id)
        self._registered_id = status.registered_id
        for state in self._states.values():
            state.sent_version = -1
        log.info("registering as broker id %d (was %d): this replica is now %s", status.registered_id, old, self.role)

    def _register(self, address: str) -> None:
        state = self._states[address]
        version = self.topics.data_version
        if state.sent_version == version:
            answer = self.namesrv.call_one(address, "RegisterBroker", self._request(version, full=False),
                                           REGISTER_TIMEOUT_S)
            self._check_authenticated(address, answer)
            if answer.accepted:
                self.master_ha_address = answer.master_ha_address or self.master_ha_address
                return
            log.info("name server %s does not know this broker's topics (it restarted?); registering them", address)
        answer = self.namesrv.call_one(address, "RegisterBroker", self._request(version, full=True),
                                       REGISTER_TIMEOUT_S)
        self._check_authenticated(address, answer)
        self.master_ha_address = answer.master_ha_address or self.master_ha_address
        if state.refused:
            log.info("name server %s accepts this broker's registration again", address)
        state.sent_version, state.refused = version, False
        self.registrations += 1

    def _check_authenticated(self, address: str, answer: npb.RegisterBrokerResponse) -> None:
        """A broker that requires authentication leaves a name server that took its registration without it."""
        if not self.require_authentication or answer.authenticated:
            return
        self._unregister(self.identity.broker_id, [address])
        raise NoPermissionError(
            "this broker runs with --auth and the name server did not say it authenticated the registration (one "
            "older than this broker?); anyone could replace or remove this broker's routes there, so it unregistered "
            "again"
        )

    def _request(self, version: int, *, full: bool) -> npb.RegisterBrokerRequest:
        ident = self.identity
        r = self.runtime()
        request = npb.RegisterBrokerRequest(
            cluster=ident.cluster, broker_name=ident.broker_name, broker_id=ident.broker_id, address=ident.address,
            store_id=ident.store_id, data_version=version, topics_included=full,
            auto_create_topic_enable=self.auto_create_topic_enable, role=self.role, ha_address=self.ha_address,
            require_authentication=self.require_authentication, remoting_address=self.remoting_address,
            runtime=npb.BrokerRuntime(put_messages_per_s=r.put_messages_per_s, get_messages_per_s=r.get_messages_per_s,
                                      commit_log_max_offset=r.commit_log_max_offset, uptime_ms=r.uptime_ms),
        )
        if self.replica_status is not None:
            status = self.replica_status()
            request.epoch, request.in_sync, request.lag_bytes = status.epoch, status.in_sync, max(status.lag_bytes, 0)
        if full:
            request.topics.extend(
                npb.TopicQueues(topic=t.topic, read_queue_nums=t.read_queue_nums, write_queue_nums=t.write_queue_nums,
                                perm=t.perm)
                for t in self.topics.topics()
                if not is_system_topic(t.topic)
            )
        return request

    def shutdown(self) -> None:
        """Stop registering and unregister from every name server (a clean shutdown leaves routes at once)."""
        self._stop.set()
        self._wake.set()
        self.topics.remove_listener(self._wake.set)
        if self._thread is not None:
            self._thread.join()
        self._unregister(self.identity.broker_id)

    def _unregister(self, broker_id: int, addresses: list[str] | None = None) -> None:
        ident = self.identity
        request = npb.UnregisterBrokerRequest(cluster=ident.cluster, broker_name=ident.broker_name,
                                              broker_id=broker_id, store_id=ident.store_id)
        for address in self.namesrv.addresses if addresses is None else addresses:
            try:
                self.namesrv.call_one(address, "UnregisterBroker", request, UNREGISTER_TIMEOUT_S)
            except BrokerError as e:
                log.warning("could not unregister from name server %s (%s); it drops this broker when its "
                            "registration expires", address, e.message)
