"""The name server's route table: which live broker holds which topic, built only from what brokers register.

Design (RocketMQ's RouteInfoManager, over Sluice's registration messages):

* A broker is known by (broker_name, broker_id) inside one cluster; id 0 is its group's master. A broker name
  belongs to one cluster: a registration of the same name in another cluster is refused.
* A registration replaces the previous one of the same (name, id) when it comes from the same broker: the same
  store id (a restart, at any address) or the same address. Another broker claiming a live (name, id) is refused
  and logged, never merged, so two brokers can never split one route between them; once the first expires (or
  unregisters) the second is taken.
* A broker is live while it registers: one that has not been heard from for ``broker_expire_ms`` (120 s, RocketMQ's
  BROKER_CHANNEL_EXPIRED_TIME) leaves every route; one that shuts down cleanly unregisters and leaves at once.
* A topic's queues on a broker group come from the group's master registration when the master is live, else from
  the live member with the lowest id (a slave still serves reads), as RocketMQ's route answers do.
* Replicated groups (broker/ha): a registration carries the master epoch it serves under. In controller mode the
  group's master registers as id 0, whichever replica it is: a registration of id 0 with a *higher* epoch replaces
  the one there even when another live broker holds it (the new master wins over a stale one at once, instead of
  after its expiry), and one with a lower epoch is refused. ``master_of`` gives a group's master (for the
  registration answer, which tells a classic slave where to replicate from).
* Keep-alives carry only the broker's data version; a name server that does not hold that version (it restarted,
  or expired the broker) answers ``accepted = False`` and the broker sends its topics at once.

Limits: at most ``MAX_BROKERS`` registrations and ``MAX_TOPICS_PER_BROKER`` topics in one (a registration past
either is refused, naming the limit), so a misconfigured or hostile broker cannot grow the table without bound.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace

from broker.errors import InvalidArgumentError, MessageIllegalError, TopicNotExistError
from broker.format.message import validate_topic

log = logging.getLogger(__name__)

DEFAULT_BROKER_EXPIRE_MS = 120_000  # RocketMQ's BROKER_CHANNEL_EXPIRED_TIME
MAX_BROKERS = 1024  # registrations one name server keeps (RocketMQ clusters run tens of brokers)
MAX_TOPICS_PER_BROKER = 100_000  # topics in one registration (topics.json of a large RocketMQ broker: ~10k)
MAX_NAME_CHARS = 127  # cluster and broker names: the topic limit, so names fit wherever topics do
MAX_ADDRESS_CHARS = 255
MAX_STORE_ID_CHARS = 64
MAX_BROKER_ID = 1 << 20


@dataclass(frozen=True)
class QueueSpec:
    """One topic's queues on one broker (RocketMQ's QueueData)."""

    read_queue_nums: int
    write_queue_nums: int
    perm: int


@dataclass(frozen=True)
class Runtime:
    put_messages_per_s: float = 0.0
    get_messages_per_s: float = 0.0
    commit_log_max_offset: int = 0
    uptime_ms: int = 0


@dataclass
class BrokerLive:
    cluster: str
    broker_name: str
    broker_id: int
    address: str
    store_id: str
    data_version: int
    last_update_ms: int
    topics: dict[str, QueueSpec] = field(default_factory=dict)
    auto_create_topic_enable: bool = False
    role: str = "MASTER"
    ha_address: str = ""
    runtime: Runtime = field(default_factory=Runtime)
    epoch: int = 0
    in_sync: bool = False
    lag_bytes: int = 0
    remoting_address: str = ""  # HOST:PORT of its RocketMQ remoting port ("": none); routes for remoting clients


@dataclass(frozen=True)
class Registration:
    """What a broker sends; ``topics`` is None for a keep-alive."""

    cluster: str
    broker_name: str
    broker_id: int
    address: str
    store_id: str
    data_version: int
    topics: dict[str, QueueSpec] | None
    auto_create_topic_enable: bool = False
    role: str = "MASTER"
    ha_address: str = ""
    runtime: Runtime = field(default_factory=Runtime)
    epoch: int = 0
    in_sync: bool = False
    lag_bytes: int = 0
    remoting_address: str = ""


@dataclass(frozen=True)
class TopicRouteEntry:
    """A topic's queues per broker name, and the addresses of each of those broker groups by broker id."""

    queues: dict[str, QueueSpec]  # broker name -> queues
    brokers: dict[str, tuple[str, dict[int, str]]]  # broker name -> (cluster, {broker id: address})
    # broker name -> {broker id: remoting address}, members that serve RocketMQ's remoting protocol only
    remoting: dict[str, dict[int, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class BrokerSummary:
    live: BrokerLive
    topic_count: int


class RegistrationRefused(InvalidArgumentError):
    """A registration that would merge two brokers into one route, or break a limit."""


def _check_name(what: str, value: str, limit: int = MAX_NAME_CHARS) -> None:
    if not value or len(value) > limit or not value.isprintable() or " " in value:
        raise InvalidArgumentError(
            f"{what} {value[:40]!r} must be 1..{limit} printable characters without spaces"
        )


def check_topic(topic: str) -> None:
    try:
        validate_topic(topic)
    except MessageIllegalError as e:
        raise InvalidArgumentError(e.message) from None


def check_registration(reg: Registration) -> None:
    _check_name("cluster", reg.cluster)
    _check_name("broker name", reg.broker_name)
    _check_name("address", reg.address, MAX_ADDRESS_CHARS)
    if reg.remoting_address:
        _check_name("remoting address", reg.remoting_address, MAX_ADDRESS_CHARS)
    _check_name("store id", reg.store_id, MAX_STORE_ID_CHARS)
    if not 0 <= reg.broker_id <= MAX_BROKER_ID:
        raise InvalidArgumentError(f"broker id {reg.broker_id} must be in 0..{MAX_BROKER_ID}")
    if reg.role not in ("MASTER", "SLAVE"):
        raise InvalidArgumentError(f"role {reg.role[:20]!r} must be MASTER or SLAVE")
    if reg.epoch < 0 or reg.lag_bytes < 0:
        raise InvalidArgumentError("epoch and lag_bytes must be >= 0")
    if reg.topics is not None:
        if len(reg.topics) > MAX_TOPICS_PER_BROKER:
            raise RegistrationRefused(
                f"a registration names {len(reg.topics)} topics, more than the {MAX_TOPICS_PER_BROKER} one broker "
                "may hold in a name server"
            )
        for topic, q in reg.topics.items():
            check_topic(topic)
            if not (0 <= q.read_queue_nums <= 65_535 and 0 <= q.write_queue_nums <= 65_535 and 0 <= q.perm <= 7):
                raise InvalidArgumentError(f"topic {topic!r}: queue counts or perm out of range")


class RouteTable:
    def __init__(self, broker_expire_ms: int = DEFAULT_BROKER_EXPIRE_MS) -> None:
        self.broker_expire_ms = broker_expire_ms
        self._lock = threading.Lock()
        self._brokers: dict[tuple[str, int], BrokerLive] = {}  # (broker name, broker id) -> registration

    # ---------------------------------------------------------------------------------------------- changes
    def register(self, reg: Registration, now_ms: int) -> bool:
        """Record a registration; False for a keep-alive whose data version this table does not hold."""
        check_registration(reg)
        key = (reg.broker_name, reg.broker_id)
        with self._lock:
            self._expire_locked(now_ms)
            old = self._brokers.get(key)
            self._check_claim(reg, old)
            if reg.topics is None:
                if old is None or old.data_version != reg.data_version or old.store_id != reg.store_id:
                    return False
                old.last_update_ms = now_ms
                old.address, old.role, old.ha_address, old.runtime = reg.address, reg.role, reg.ha_address, reg.runtime
                old.auto_create_topic_enable = reg.auto_create_topic_enable
                old.epoch, old.in_sync, old.lag_bytes = reg.epoch, reg.in_sync, reg.lag_bytes
                old.remoting_address = reg.remoting_address
                return True
            if old is None and len(self._brokers) >= MAX_BROKERS:
                raise RegistrationRefused(f"this name server holds {MAX_BROKERS} brokers already; no room for another")
            if old is None or old.store_id != reg.store_id or old.address != reg.address:
                log.info("broker %s/%d (%s, cluster %s) registered at %s", reg.broker_name, reg.broker_id,
                         reg.role, reg.cluster, reg.address)
            self._brokers[key] = BrokerLive(
                cluster=reg.cluster, broker_name=reg.broker_name, broker_id=reg.broker_id, address=reg.address,
                store_id=reg.store_id, data_version=reg.data_version, last_update_ms=now_ms, topics=dict(reg.topics),
                auto_create_topic_enable=reg.auto_create_topic_enable, role=reg.role, ha_address=reg.ha_address,
                runtime=reg.runtime, epoch=reg.epoch, in_sync=reg.in_sync, lag_bytes=reg.lag_bytes,
                remoting_address=reg.remoting_address,
            )
            return True

    def _check_claim(self, reg: Registration, old: BrokerLive | None) -> None:
        for other in self._brokers.values():
            if other.broker_name == reg.broker_name and other.cluster != reg.cluster:
                raise RegistrationRefused(
                    f"broker name {reg.broker_name!r} belongs to cluster {other.cluster!r} here; a broker of "
                    f"cluster {reg.cluster!r} cannot use it"
                )
        if old is not None and old.store_id != reg.store_id and old.address != reg.address:
            if reg.broker_id == 0 and reg.epoch > old.epoch:
                log.warning("broker %s/0: the master of epoch %d at %s replaces the one of epoch %d at %s",
                            reg.broker_name, reg.epoch, reg.address, old.epoch, old.address)
                return
            if reg.broker_id == 0 and reg.epoch and reg.epoch < old.epoch:
                raise RegistrationRefused(
                    f"broker {reg.broker_name}/0 at {reg.address} registers as master of epoch {reg.epoch}, but the "
                    f"master of epoch {old.epoch} at {old.address} replaced it: it is stale"
                )
            log.warning(
                "refused broker %s/%d at %s (store %s): the name and id are held by the live broker at %s (store %s)",
                reg.broker_name, reg.broker_id, reg.address, reg.store_id, old.address, old.store_id,
            )
            raise RegistrationRefused(
                f"broker {reg.broker_name}/{reg.broker_id} is registered by another live broker at {old.address}; "
                "give this broker another --broker-name or --broker-id, or stop the other one"
            )

    def unregister(self, broker_name: str, broker_id: int, store_id: str) -> bool:
        with self._lock:
            old = self._brokers.get((broker_name, broker_id))
            if old is None or old.store_id != store_id:
                return False  # another broker's registration, or gone already: not this broker's to remove
            del self._brokers[(broker_name, broker_id)]
        log.info("broker %s/%d at %s unregistered", broker_name, broker_id, old.address)
        return True

    def delete_topic(self, topic: str) -> int:
        """Drop ``topic`` from every registration (``mqadmin deleteTopic``, after the brokers deleted it); the
        number of registrations that held it. A broker that still holds it brings it back with its next full
        registration, which a change of its topics sends."""
        check_topic(topic)
        with self._lock:
            holders = [b for b in self._brokers.values() if topic in b.topics]
            for b in holders:
                del b.topics[topic]
        if holders:
            log.info("topic %s deleted from the routes of %d broker(s)", topic, len(holders))
        return len(holders)

    def master_of(self, broker_name: str, now_ms: int) -> BrokerLive | None:
        """The group's master registration (id 0), if live."""
        with self._lock:
            self._expire_locked(now_ms)
            return self._brokers.get((broker_name, 0))

    def expire(self, now_ms: int) -> list[BrokerLive]:
        with self._lock:
            return self._expire_locked(now_ms)

    def _expire_locked(self, now_ms: int) -> list[BrokerLive]:
        gone = [b for b in self._brokers.values() if now_ms - b.last_update_ms > self.broker_expire_ms]
        for b in gone:
            del self._brokers[(b.broker_name, b.broker_id)]
            log.warning("broker %s/%d at %s expired: not heard from for %d ms", b.broker_name, b.broker_id,
                        b.address, now_ms - b.last_update_ms)
        return gone

    # ---------------------------------------------------------------------------------------------- reads
    def route(self, topic: str, now_ms: int) -> TopicRouteEntry:
        check_topic(topic)
        with self._lock:
            self._expire_locked(now_ms)
            groups: dict[str, list[BrokerLive]] = {}
            for b in self._brokers.values():
                groups.setdefault(b.broker_name, []).append(b)
            queues: dict[str, QueueSpec] = {}
            brokers: dict[str, tuple[str, dict[int, str]]] = {}
            remoting: dict[str, dict[int, str]] = {}
            for name, members in sorted(groups.items()):
                members.sort(key=lambda b: b.broker_id)
                source = members[0]  # the master when it is live (id 0), else the lowest live id
                spec = source.topics.get(topic)
                if spec is None:
                    continue
                queues[name] = spec
                brokers[name] = (source.cluster, {b.broker_id: b.address for b in members})
                served = {b.broker_id: b.remoting_address for b in members if b.remoting_address}
                if served:
                    remoting[name] = served
        if not queues:
            raise TopicNotExistError(f"no live broker holds topic {topic!r}")
        return TopicRouteEntry(queues, brokers, remoting)

    def brokers(self, now_ms: int) -> list[BrokerSummary]:
        """Every live broker (its registration without the topic table, and how many topics it holds)."""
        with self._lock:
            self._expire_locked(now_ms)
            live = [BrokerSummary(replace(b, topics={}), len(b.topics)) for b in self._brokers.values()]
        live.sort(key=lambda s: (s.live.cluster, s.live.broker_name, s.live.broker_id))
        return live

    def topic_names(self, now_ms: int) -> list[str]:
        with self._lock:
            self._expire_locked(now_ms)
            names: set[str] = set()
            for b in self._brokers.values():
                names.update(b.topics)
        return sorted(names)
