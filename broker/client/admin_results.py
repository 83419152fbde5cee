"""What Admin returns: a broker's topics, lags, transactions and groups, and the cluster-wide views built from them.

The rows of one broker (``TopicInfo``, ``QueueLag``, ``TransactionInfo``) are what a client of one broker has
always received. In a cluster the same rows come as their ``Broker...`` subclasses, which add the broker that
answered; code written against the base classes keeps working.

Users and access control entries (``UserInfo``, ``AclEntry``) never carry a secret key: the broker never answers
one. In a cluster each master keeps its own, so the rows come as ``BrokerUserInfo`` and ``BrokerAclEntry``, naming
the broker that holds them.

The cluster-wide views (``ClusterInfo``, ``TopicDescription``, ``GroupLag``) are what the ``sluice`` commands show;
``as_json()`` is the object ``--json`` prints. A broker that did not answer appears in a view with its ``error``
(the reason) instead of failing the whole view: an operator looks at these while something is down.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from broker.proto import namesrv_pb2 as npb
from broker.proto import sluice_pb2 as pb


@dataclass(frozen=True)
class TopicInfo:
    topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int


@dataclass(frozen=True)
class BrokerTopicInfo(TopicInfo):
    """A topic's queues on one broker of a cluster."""

    broker_name: str = ""
    cluster: str = ""


@dataclass(frozen=True)
class ClusterTopicInfo(TopicInfo):
    """A topic over a cluster: the queue counts are the sums over ``brokers`` (what producers and consumers see),
    ``perm`` the permission every broker grants."""

    brokers: tuple[BrokerTopicInfo, ...] = ()

    @staticmethod
    def of(topic: str, brokers: list[BrokerTopicInfo]) -> ClusterTopicInfo:
        perm = 0x7
        for b in brokers:
            perm &= b.perm
        return ClusterTopicInfo(topic, sum(b.read_queue_nums for b in brokers),
                                sum(b.write_queue_nums for b in brokers), perm if brokers else 0,
                                tuple(sorted(brokers, key=lambda b: b.broker_name)))


@dataclass(frozen=True)
class QueueLag:
    topic: str
    queue_id: int
    broker_offset: int
    consumer_offset: int  # -1: nothing committed
    lag: int


@dataclass(frozen=True)
class BrokerQueueLag(QueueLag):
    broker_name: str = ""


@dataclass(frozen=True)
class TransactionInfo:
    transaction_id: str
    producer_group: str
    status: str  # OPEN | ENDING | COMMITTED | ROLLED_BACK
    half_count: int
    first_store_ms: int
    last_activity_ms: int
    check_times: int
    ended_ms: int
    complete: bool  # a commit whose messages are all in their real topics
    # open and written in place: "topic/queue@offset" of each queue whose readers it holds back at that offset
    held_queues: tuple[str, ...] = ()


@dataclass(frozen=True)
class BrokerTransactionInfo(TransactionInfo):
    """A transaction's halves on one broker (a transaction may have halves on several)."""

    broker_name: str = ""


@dataclass(frozen=True)
class GroupInfo:
    group: str
    online_consumers: int  # live consumers (push consumers heartbeat; pull consumers are not counted)
    topics: list[str]  # topics with committed offsets or subscribed by a live consumer


@dataclass(frozen=True)
class SubscriptionGroup:
    group_name: str
    consume_enable: bool
    consume_from_min_enable: bool
    consume_broadcast_enable: bool
    retry_queue_nums: int
    retry_max_times: int
    consume_message_orderly: bool = False  # pop consumption: FIFO per message group


# ---------------------------------------------------------------------------------------------- users and ACLs
@dataclass(frozen=True)
class UserInfo:
    """A user as a broker holds it (never its secret key)."""

    access_key: str
    super_user: bool
    enabled: bool


@dataclass(frozen=True)
class BrokerUserInfo(UserInfo):
    """A user as one master of a cluster holds it (its slaves hold the same, replicated)."""

    broker_name: str = ""


@dataclass(frozen=True)
class ClusterUserInfo(UserInfo):
    """A user changed on several brokers: ``super_user`` and ``enabled`` hold only when they hold on every one of
    ``brokers`` (an update that sets neither leaves brokers that differed as they were)."""

    brokers: tuple[BrokerUserInfo, ...] = ()

    @staticmethod
    def of(access_key: str, brokers: list[BrokerUserInfo]) -> ClusterUserInfo:
        return ClusterUserInfo(access_key, all(b.super_user for b in brokers), all(b.enabled for b in brokers),
                               tuple(brokers))


@dataclass(frozen=True)
class AclEntry:
    """One access control entry of a user: ``decision`` (Allow or Deny) of ``actions`` on ``resource`` (Cluster,
    Topic:NAME, Group:NAME, NAME may end in ``*``; or ``*``), from ``source_ips`` (CIDRs; empty: anywhere)."""

    access_key: str
    resource: str
    actions: tuple[str, ...]
    decision: str
    source_ips: tuple[str, ...] = ()


@dataclass(frozen=True)
class BrokerAclEntry(AclEntry):
    """An entry as one master of a cluster holds it."""

    broker_name: str = ""


# ---------------------------------------------------------------------------------------------- cluster views
@dataclass(frozen=True)
class BrokerInfo:
    """One live broker as the name servers know it (``sluice cluster list``)."""

    cluster: str
    broker_name: str
    broker_id: int  # 0: the group's master
    address: str
    role: str  # MASTER | SLAVE
    last_update_ms: int  # wall clock of the name server when it last heard from the broker
    topic_count: int
    put_messages_per_s: float  # over the broker's last registration interval
    get_messages_per_s: float
    commit_log_max_offset: int
    uptime_ms: int
    data_version: int
    auto_create_topic_enable: bool
    ha_address: str


@dataclass(frozen=True)
class ClusterInfo:
    brokers: tuple[BrokerInfo, ...]  # sorted by cluster, broker name, broker id

    def clusters(self) -> list[str]:
        return sorted({b.cluster for b in self.brokers})

    def masters(self, cluster: str | None = None) -> list[BrokerInfo]:
        return [b for b in self.brokers if b.broker_id == 0 and cluster in (None, b.cluster)]

    def as_json(self) -> dict[str, Any]:
        """``{"brokers": [{"cluster", "broker_name", "broker_id", "address", "role", "last_update_ms", ...}]}``"""
        return asdict(self)


@dataclass(frozen=True)
class QueueRange:
    queue_id: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True)
class BrokerQueues:
    """A topic on one broker: its queue counts and permission, and each queue's offsets."""

    broker_name: str
    cluster: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    queues: tuple[QueueRange, ...]
    error: str = ""  # the broker did not answer: its queues' offsets are unknown


@dataclass(frozen=True)
class TopicDescription:
    """``sluice topic describe T``: the topic's queues per broker."""

    topic: str
    brokers: tuple[BrokerQueues, ...]  # in route order (broker name)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BrokerLag:
    broker_name: str
    lag: int
    queues: tuple[QueueLag, ...]
    error: str = ""  # the broker did not answer: its lag is unknown and not in the total


@dataclass(frozen=True)
class GroupLag:
    """``sluice group lag G``: the group's lag summed over the brokers, with each broker's part."""

    group: str
    total_lag: int
    brokers: tuple[BrokerLag, ...]

    @property
    def complete(self) -> bool:
        """Every broker answered (else ``total_lag`` misses the ones with an ``error``)."""
        return not any(b.error for b in self.brokers)

    def queues(self) -> list[QueueLag]:
        return [q for b in self.brokers for q in b.queues]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------- from the wire
def topic_info(t: pb.TopicInfo) -> TopicInfo:
    return TopicInfo(t.topic, t.read_queue_nums, t.write_queue_nums, t.perm)


def broker_topic_info(t: pb.TopicInfo, broker_name: str, cluster: str) -> BrokerTopicInfo:
    return BrokerTopicInfo(t.topic, t.read_queue_nums, t.write_queue_nums, t.perm, broker_name, cluster)


def queue_lag(q: pb.QueueLag, broker_name: str | None) -> QueueLag:
    """A broker's row; with ``broker_name`` (a cluster), the row names it."""
    if broker_name is None:
        return QueueLag(q.topic, q.queue_id, q.broker_offset, q.consumer_offset, q.lag)
    return BrokerQueueLag(q.topic, q.queue_id, q.broker_offset, q.consumer_offset, q.lag, broker_name)


def transaction(t: pb.TransactionInfo, broker_name: str | None) -> TransactionInfo:
    fields = (t.transaction_id, t.producer_group, t.status, t.half_count, t.first_store_ms, t.last_activity_ms,
              t.check_times, t.ended_ms, t.complete, tuple(t.held_queues))
    return TransactionInfo(*fields) if broker_name is None else BrokerTransactionInfo(*fields, broker_name)


def group(g: pb.SubscriptionGroup) -> SubscriptionGroup:
    return SubscriptionGroup(g.group_name, g.consume_enable, g.consume_from_min_enable, g.consume_broadcast_enable,
                             g.retry_queue_nums, g.retry_max_times, g.consume_message_orderly)


def broker_info(b: npb.BrokerLiveInfo) -> BrokerInfo:
    r = b.runtime
    return BrokerInfo(
        cluster=b.cluster, broker_name=b.broker_name, broker_id=b.broker_id, address=b.address, role=b.role,
        last_update_ms=b.last_update_ms, topic_count=b.topic_count, put_messages_per_s=r.put_messages_per_s,
        get_messages_per_s=r.get_messages_per_s, commit_log_max_offset=r.commit_log_max_offset,
        uptime_ms=r.uptime_ms, data_version=b.data_version, auto_create_topic_enable=b.auto_create_topic_enable,
        ha_address=b.ha_address,
    )


def user_info(u: pb.UserInfo, broker: BrokerInfo | None = None) -> UserInfo:
    """A broker's user; with ``broker`` (a cluster), the row names it."""
    if broker is None:
        return UserInfo(u.access_key, u.super_user, u.enabled)
    return BrokerUserInfo(u.access_key, u.super_user, u.enabled, broker.broker_name)


def acl_entry(e: pb.AclEntry, broker: BrokerInfo | None = None) -> AclEntry:
    """A broker's entry; with ``broker`` (a cluster), the row names it."""
    fields = (e.access_key, e.resource, tuple(e.actions), e.decision, tuple(e.source_ips))
    return AclEntry(*fields) if broker is None else BrokerAclEntry(*fields, broker.broker_name)
