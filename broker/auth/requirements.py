"""What every RPC needs, declared once: method name -> the rights its request asks for (policy.py decides them).

Every method of every service a broker serves has a row here (the Broker service, the transaction coordinator,
RocketMQ 5's MessagingService, and the user administration below); tests/unit/security walk this table against
the services' descriptors, so a new RPC cannot be served without a declared requirement. A method missing here is
refused for everyone but super users (default deny), never let through.

The rules, the way RocketMQ 5.3 and Kafka put them:

* Producing needs Pub on the topic. A transactional half also needs Pub on ``Group:<producer group>``: ending,
  checking and listing a group's transactions is that right (Kafka's Write on the transactional id).
* Consuming needs Sub on the topic and Sub on the group (Kafka: Read on both); offsets, locks, acks, send-backs and
  a group's retry and dead-letter topics follow (policy.py maps ``%RETRY%G``/``%DLQ%G`` to ``Group:G``).
* Reading a topic's offsets and routes needs any of Pub, Sub or Get on it: producers, consumers and tools all do.
* Administration needs Create/Update/Delete/Get/List on the named resource or on the Cluster; calls that name no
  resource (list every topic, broker statistics) need it on the Cluster.
* Coordinating transactions across brokers (the exactly-once sink's decisions and the by-prefix listing and
  ending of transactions) needs Pub on the Cluster: those calls name transactions, not topics.
* Users and access control entries: super users only (``SUPER_ONLY``); a right to manage rights is every right.
* The name server (a name server started with auth): registering and unregistering brokers is for the cluster's
  root user (the brokers sign with it); route reads are ``ANONYMOUS``, no credentials needed: a route names
  brokers and topics, never a message, and every client asks for routes before it knows which broker holds its
  users.

A requirement function gets the parsed request and a ``Lookup`` for what only the broker knows (the group of a
transaction that the request names by id, the topic of a message named by id). It raises InvalidArgumentError for
a request it cannot read; it never needs the store's lock for more than a dictionary lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from broker.auth.policy import CLUSTER, Action, Need, group, need, topic

PUB, SUB, CREATE, UPDATE, DELETE, GET, LIST = (Action.PUB, Action.SUB, Action.CREATE, Action.UPDATE, Action.DELETE,
                                               Action.GET, Action.LIST)  # fmt: skip
READ_ANY = (PUB, SUB, GET)
# Methods whose topic rights are checked where the request is parsed (deferred.py), beside their row's needs.
DEFERRED_TOPIC_CHECKS = frozenset({"/sluice.v1.Broker/SendBatch"})


class Lookup(Protocol):
    """What a requirement may ask the broker."""

    def transaction_group(self, txn_id: str, half_commitlog_offset: int | None) -> str | None: ...

    def message_topic(self, msg_id: str) -> str | None: ...


Requirement = Callable[[Any, Lookup], list[Need]]
SUPER_ONLY: Requirement = lambda request, lookup: [need(CLUSTER, Action.ALL)]  # noqa: E731  (marker, see is_super_only)


def _none(request: Any, lookup: Lookup) -> list[Need]:
    return []


def ANONYMOUS(request: Any, lookup: Lookup) -> list[Need]:
    return []


def _pubs(topics: Iterable[str], producer_group: str, transactional: bool) -> list[Need]:
    needs = [need(topic(t), PUB) for t in topics]
    if transactional and producer_group:
        needs.append(need(group(producer_group), PUB))
    return needs


def _consume(group_name: str, *topics: str) -> list[Need]:
    return [need(group(group_name), SUB)] + [need(topic(t), SUB) for t in dict.fromkeys(topics)]


def _admin(resource_of: Callable[[Any], Any], *actions: Action) -> Requirement:
    return lambda r, lookup: [need(resource_of(r), *actions, or_cluster=True)]


def _end_transaction(r: Any, lookup: Lookup) -> list[Need]:
    if r.producer_group:
        return [need(group(r.producer_group), PUB)]
    offset = r.half_commitlog_offset if r.WhichOneof("target") == "half_commitlog_offset" else None
    found = lookup.transaction_group(r.transaction_id, offset)
    # An unknown transaction needs nothing more: the handler answers "not found", which tells nothing.
    return [need(group(found), PUB)] if found else []


def _view_by_id(r: Any, lookup: Lookup) -> list[Need]:
    found = lookup.message_topic(r.msg_id)
    return [need(topic(found), SUB, GET)] if found else []


def _v2_name(resource: Any) -> str:
    return str(resource.name)


BROKER: dict[str, Requirement] = {
    "SendMessage": lambda r, _: _pubs([r.topic], r.producer_group, r.transactional),
    # Pub on each topic inside the batch: checked by the send processor (deferred.py); here the transaction's group
    "SendBatch": lambda r, _: _pubs((), r.producer_group, bool(r.transaction_id)),
    # Authenticated when they open; each request then needs what its unary call does (server/call_stream.py).
    "SendStream": _none,
    "PullStream": _none,
    "PullMessage": lambda r, _: _consume(r.consumer_group, r.topic),
    "QueryConsumerOffset": lambda r, _: _consume(r.consumer_group, r.topic),
    "UpdateConsumerOffsets": lambda r, _: _consume(r.consumer_group, *(o.topic for o in r.offsets)),
    "GetQueueOffsets": lambda r, _: [need(topic(r.topic), *READ_ANY)],
    "SearchOffsetByTimestamp": lambda r, _: [need(topic(r.topic), *READ_ANY)],
    "QueryMessageByKey": lambda r, _: [need(topic(r.topic), SUB, GET)],
    "ViewMessageById": _view_by_id,
    "CreateTopic": _admin(lambda r: topic(r.topic), CREATE),
    "DeleteTopic": _admin(lambda r: topic(r.topic), DELETE),
    "ListTopics": lambda r, _: [need(CLUSTER, LIST)],
    "GetTopicRoute": lambda r, _: [need(topic(r.topic), *READ_ANY)],
    "Heartbeat": lambda r, _: [need(group(r.consumer_group), SUB)] if r.consumer_group else [],
    "GetConsumerList": lambda r, _: [need(group(r.consumer_group), SUB, GET)],
    "GetConsumerLag": lambda r, _: (
        [need(group(r.consumer_group), SUB, GET, or_cluster=True)]
        + ([need(topic(r.topic), SUB, GET, or_cluster=True)] if r.topic else [])
    ),
    "GetBrokerStats": lambda r, _: [need(CLUSTER, GET)],
    "EndTransaction": _end_transaction,
    "ListTransactions": lambda r, _: [need(CLUSTER, PUB, GET)],
    "EndTransactions": lambda r, _: [need(CLUSTER, PUB, UPDATE)],
    "TransactionCheckStream": lambda r, _: [need(group(r.producer_group), PUB)],
    "ConsumerSendMsgBack": lambda r, _: [need(group(r.consumer_group), SUB)],
    "LockBatchMQ": lambda r, _: _consume(r.consumer_group, *(q.topic for q in r.queues)),
    "UnlockBatchMQ": lambda r, _: _consume(r.consumer_group, *(q.topic for q in r.queues)),
    "GetSubscriptionGroup": _admin(lambda r: group(r.consumer_group), SUB, GET),
    "UpdateSubscriptionGroup": _admin(lambda r: group(r.consumer_group), CREATE, UPDATE),
    "PopMessage": lambda r, _: _consume(r.consumer_group, r.topic),
    "AckMessage": lambda r, _: _consume(r.consumer_group, r.topic),
    "ChangeInvisibleTime": lambda r, _: _consume(r.consumer_group, r.topic),
    "ListGroups": lambda r, _: [need(CLUSTER, LIST)],
    "ResetConsumerOffsets": _admin(lambda r: group(r.consumer_group), UPDATE),
    "CreateUser": SUPER_ONLY,
    "UpdateUser": SUPER_ONLY,
    "DeleteUser": SUPER_ONLY,
    "ListUsers": SUPER_ONLY,
    "GrantAcl": SUPER_ONLY,
    "RevokeAcl": SUPER_ONLY,
    "ListAcls": SUPER_ONLY,
}

COORDINATOR: dict[str, Requirement] = {
    "RecordDecision": lambda r, _: [need(CLUSTER, PUB)],
    "QueryDecisions": lambda r, _: [need(CLUSTER, PUB, GET)],
}

# RocketMQ 5's MessagingService (broker/rmqv2): its resources carry a namespace, which Sluice does not use.
MESSAGING: dict[str, Requirement] = {
    "QueryRoute": lambda r, _: [need(topic(_v2_name(r.topic)), *READ_ANY)],
    "Heartbeat": lambda r, _: [need(group(_v2_name(r.group)), SUB)] if r.group.name else [],
    "SendMessage": lambda r, _: [need(topic(t), PUB) for t in dict.fromkeys(_v2_name(m.topic) for m in r.messages)],
    "QueryAssignment": lambda r, _: _consume(_v2_name(r.group), _v2_name(r.topic)),
    "ReceiveMessage": lambda r, _: _consume(_v2_name(r.group), _v2_name(r.message_queue.topic)),
    "AckMessage": lambda r, _: _consume(_v2_name(r.group), _v2_name(r.topic)),
    "ForwardMessageToDeadLetterQueue": lambda r, _: _consume(_v2_name(r.group), _v2_name(r.topic)),
    "PullMessage": lambda r, _: _consume(_v2_name(r.group), _v2_name(r.message_queue.topic)),
    "UpdateOffset": lambda r, _: _consume(_v2_name(r.group), _v2_name(r.message_queue.topic)),
    "GetOffset": lambda r, _: _consume(_v2_name(r.group), _v2_name(r.message_queue.topic)),
    "QueryOffset": lambda r, _: [need(topic(_v2_name(r.message_queue.topic)), *READ_ANY)],
    "EndTransaction": lambda r, _: [need(topic(_v2_name(r.topic)), PUB)],
    # A stream of client settings and commands; what the client then does is authorized call by call.
    "Telemetry": _none,
    "NotifyClientTermination": _none,
    "ChangeInvisibleDuration": lambda r, _: _consume(_v2_name(r.group), _v2_name(r.topic)),
    "RecallMessage": lambda r, _: [need(topic(_v2_name(r.topic)), PUB)],
    "SyncLiteSubscription": lambda r, _: _consume(_v2_name(r.group), _v2_name(r.topic)),
}

NAMESRV: dict[str, Requirement] = {
    "RegisterBroker": SUPER_ONLY,
    "UnregisterBroker": SUPER_ONLY,
    "GetRouteInfoByTopic": ANONYMOUS,
    "GetBrokerClusterInfo": ANONYMOUS,
    "GetAllTopicList": ANONYMOUS,
}

# gRPC service path -> its table
TABLES: dict[str, dict[str, Requirement]] = {
    "/sluice.v1.Broker/": BROKER,
    "/sluice.v1.TransactionCoordinator/": COORDINATOR,
    "/apache.rocketmq.v2.MessagingService/": MESSAGING,
    "/sluice.v1.NameServer/": NAMESRV,
}


def requirement_of(full_method: str) -> Requirement | None:
    """The requirement of ``/package.Service/Method``; None when the table has none (refused but to super users)."""
    service, _, method = full_method.rpartition("/")
    table = TABLES.get(service + "/")
    return table.get(method) if table is not None else None


def is_anonymous(requirement: Requirement | None) -> bool:
    return requirement is ANONYMOUS


def is_super_only(requirement: Requirement | None) -> bool:
    return requirement is None or requirement is SUPER_ONLY
