"""Where a topic's queues are: ``MessageQueue``, a topic's route over broker groups, and the rules that pick the
queues a producer may write and a consumer may read.

A route lists, per broker group (RocketMQ's brokerName), the topic's read and write queue counts and permission,
and the group's brokers by id (0 is the master). As in RocketMQ's clients:

* a queue is writable when the topic's permission allows writes and the group has a live master: writes go to
  masters only;
* a queue is readable when the permission allows reads and any broker of the group is live: the master, or a
  slave while the master is away (RocketMQ's slave read);
* queues are ordered by broker name, then queue id, so every client of a route sees the same order (a sharding
  key's queue is its hash modulo the writable queues of that order).

A client on one broker (``endpoint=``, no name server) sees a route of one group named ``""``: the broker it talks
to. Its queues are ``MessageQueue(topic, "", queue_id)`` and every other behaviour is the cluster's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from broker.proto import namesrv_pb2 as npb

PERM_READ = 0x4  # RocketMQ PermName
PERM_WRITE = 0x2
MASTER_ID = 0
DIRECT_BROKER = ""  # the one broker of a client without name servers


class MessageQueue(NamedTuple):
    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        where = f"{self.broker_name}:{self.queue_id}" if self.broker_name else str(self.queue_id)
        return f"{self.topic}/{where}"


@dataclass(frozen=True)
class BrokerGroup:
    """One broker group of a route: its cluster, name, and live brokers' addresses by id."""

    cluster: str
    broker_name: str
    addresses: Mapping[int, str]

    @property
    def master(self) -> str | None:
        return self.addresses.get(MASTER_ID)

    def read_address(self) -> str | None:
        """The master when it is live, else the live slave with the lowest id."""
        if not self.addresses:
            return None
        return self.addresses.get(MASTER_ID) or self.addresses[min(self.addresses)]


@dataclass(frozen=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int


@dataclass(frozen=True)
class TopicRoute:
    topic: str
    queues: tuple[QueueData, ...]  # sorted by broker name
    groups: Mapping[str, BrokerGroup]

    @staticmethod
    def from_pb(topic: str, data: npb.TopicRouteData) -> TopicRoute:
        queues = tuple(
            sorted(
                (QueueData(q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm) for q in data.queue_datas),
                key=lambda q: q.broker_name,
            )
        )
        groups = {b.broker_name: BrokerGroup(b.cluster, b.broker_name, dict(b.broker_addrs)) for b in data.broker_datas}
        return TopicRoute(topic, queues, groups)

    @staticmethod
    def direct(topic: str, read_queue_nums: int, write_queue_nums: int, perm: int, address: str) -> TopicRoute:
        return TopicRoute(
            topic,
            (QueueData(DIRECT_BROKER, read_queue_nums, write_queue_nums, perm),),
            {DIRECT_BROKER: BrokerGroup("", DIRECT_BROKER, {MASTER_ID: address})},
        )

    @property
    def broker_names(self) -> list[str]:
        return [q.broker_name for q in self.queues]

    def write_queues(self) -> list[MessageQueue]:
        out: list[MessageQueue] = []
        for q in self.queues:
            group = self.groups.get(q.broker_name)
            if q.perm & PERM_WRITE and group is not None and group.master is not None:
                out += [MessageQueue(self.topic, q.broker_name, i) for i in range(q.write_queue_nums)]
        return out

    def read_queues(self) -> list[MessageQueue]:
        out: list[MessageQueue] = []
        for q in self.queues:
            group = self.groups.get(q.broker_name)
            if q.perm & PERM_READ and group is not None and group.read_address() is not None:
                out += [MessageQueue(self.topic, q.broker_name, i) for i in range(q.read_queue_nums)]
        return out

    def queue_data(self, broker_name: str) -> QueueData | None:
        for q in self.queues:
            if q.broker_name == broker_name:
                return q
        return None
