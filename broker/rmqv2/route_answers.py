"""QueryRoute and QueryAssignment answers: where a topic's queues are, as RocketMQ 5 clients expect them.

* One broker (no name servers): the broker answers for itself, under its broker name, at the address the client
  reached it by (the request's endpoints), so no advertised address has to be right for the client to connect.
* Cluster mode (``namesrv_addr`` set): the route comes from the name servers, every broker of it at the address it
  registered; a topic they do not list yet (just created here) is answered with this broker alone, as Sluice's own
  Router does until the registration reaches them.

Queues: per broker group, read-write queues for min(read, write) queue counts and read-only or write-only ones for
the rest, with the topic's permission (RocketMQ's genMessageQueueFromQueueData); each accepts every message type
(Sluice topics are not typed; the clients check the type they send is listed). Assignments: one per readable
broker with queue id -1 (a receive pops from every queue of the topic there), or every queue for a FIFO group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rocketmq.grpc_protocol import definition_pb2 as v2

from broker.client.namesrv_client import NameServerClient
from broker.client.route import MASTER_ID, PERM_READ, PERM_WRITE
from broker.config import parse_host_port
from broker.errors import TopicNotExistError
from broker.proto import namesrv_pb2 as npb

ACCEPTED_TYPES = (v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION)


@dataclass(frozen=True)
class BrokerRoute:
    broker_name: str
    address: str  # HOST:PORT of the broker group's master (or the live member serving reads)
    read_queue_nums: int
    write_queue_nums: int
    perm: int


def endpoints_of(address: str) -> v2.Endpoints:
    host, port = parse_host_port(address)
    scheme = v2.IPv4 if host.replace(".", "").isdigit() and host.count(".") == 3 else v2.DOMAIN_NAME
    return v2.Endpoints(scheme=scheme, addresses=[v2.Address(host=host, port=port)])


def request_address(endpoints: v2.Endpoints) -> str:
    """The address the client used, from a request's endpoints ("" when it sent none)."""
    if not endpoints.addresses:
        return ""
    a = endpoints.addresses[0]
    return f"{a.host}:{a.port}"


def _permission(perm: int) -> int:
    readable, writable = bool(perm & PERM_READ), bool(perm & PERM_WRITE)
    if readable and writable:
        return v2.READ_WRITE
    return v2.READ if readable else v2.WRITE if writable else v2.NONE


def message_queues(topic: str, brokers: list[BrokerRoute]) -> list[v2.MessageQueue]:
    out: list[v2.MessageQueue] = []
    for b in brokers:
        broker = v2.Broker(name=b.broker_name, id=MASTER_ID, endpoints=endpoints_of(b.address))
        readable, writable = bool(b.perm & PERM_READ), bool(b.perm & PERM_WRITE)
        rw = min(b.read_queue_nums, b.write_queue_nums) if readable and writable else 0
        r = b.read_queue_nums - rw if readable else 0
        w = b.write_queue_nums - rw if writable else 0
        kinds = [(r, v2.READ), (w, v2.WRITE), (rw, v2.READ_WRITE)]
        if not readable and not writable:
            kinds = [(max(1, b.read_queue_nums, b.write_queue_nums), v2.NONE)]
        queue_id = 0
        for count, permission in kinds:
            for _ in range(count):
                out.append(v2.MessageQueue(topic=v2.Resource(name=topic), id=queue_id, permission=permission,
                                           broker=broker, accept_message_types=ACCEPTED_TYPES))
                queue_id += 1
    return out


def assignments(topic: str, brokers: list[BrokerRoute], fifo: bool) -> list[v2.Assignment]:
    out: list[v2.Assignment] = []
    for b in brokers:
        if not b.perm & PERM_READ or b.read_queue_nums <= 0:
            continue
        broker = v2.Broker(name=b.broker_name, id=MASTER_ID, endpoints=endpoints_of(b.address))
        ids = range(b.read_queue_nums) if fifo else [-1]
        out += [v2.Assignment(message_queue=v2.MessageQueue(topic=v2.Resource(name=topic), id=i,
                                                            permission=_permission(b.perm), broker=broker))
                for i in ids]
    return out


class RouteSource:
    """The topic's brokers: this broker alone, or the cluster's route from the name servers."""

    def __init__(self, broker_name: str, local: Callable[[str], tuple[int, int, int]],
                 namesrv: NameServerClient | None) -> None:
        self.broker_name = broker_name
        self.local = local  # topic -> (read queues, write queues, perm) here; may auto-create; TopicNotExistError
        self.namesrv = namesrv

    def brokers(self, topic: str, client_address: str) -> list[BrokerRoute]:
        if self.namesrv is not None:
            try:
                return _from_route(self.namesrv.route(topic))
            except TopicNotExistError:
                pass  # not registered yet: this broker alone, if it has (or may create) the topic
        read, write, perm = self.local(topic)
        return [BrokerRoute(self.broker_name, client_address, read, write, perm)]


def _from_route(route: npb.TopicRouteData) -> list[BrokerRoute]:
    addresses = {b.broker_name: dict(b.broker_addrs) for b in route.broker_datas}
    out = []
    for q in route.queue_datas:
        members = addresses.get(q.broker_name) or {}
        address = members.get(MASTER_ID) or (members[min(members)] if members else "")
        if address:
            out.append(BrokerRoute(q.broker_name, address, q.read_queue_nums, q.write_queue_nums, q.perm))
    if not out:
        raise TopicNotExistError("no live broker holds the topic")
    return out
