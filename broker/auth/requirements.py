"""What every RPC does, declared once: method name -> the operations it does (operations.py holds their rights).

Every method of every service a broker serves has a row here (the Broker service, the transaction coordinator,
RocketMQ 5's MessagingService, the name server, the remoting port's request codes); tests/unit/auth walk these
tables against the services' descriptors, so a new RPC cannot be served without a declared row. A method missing
here is refused for everyone but super users (default deny), never let through; the gate (gate.py) decides that,
and the rows marked ``SUPER_ONLY`` and ``ANONYMOUS``, from the method alone.

Every other right is asked by the operation itself (the processors under each front call operations.py's
``authorize`` on the objects they resolved, before they change anything), so a row decides nothing at run time:
it declares which operations a call does and on which of its request's objects. Called, a row gives every need
of a call, the operations on resolved objects previewed through the broker's ``Lookup`` (the group of a
transaction named by id, the topic of a message named by id): what a caller must be granted, which the tests
grant and check the operations against, and the docs list.

The rules, the way RocketMQ 5.3 and Kafka put them:

* Producing needs Pub on the topic. A transactional half also needs Pub on ``Group:<producer group>``: opening,
  joining, ending and checking a group's transactions is that right (Kafka's Write on the transactional id),
  decided on the group the transaction was recorded under when it was opened, whatever group a later request
  names. RocketMQ 5 clients name no producer group; their transactions are recorded under the topic's name.
* Consuming needs Sub on the topic and Sub on the group (Kafka: Read on both); offsets, locks, acks, a
  heartbeat's subscriptions and a group's retry and dead-letter topics follow (policy.py maps ``%RETRY%G``/``%DLQ%G``
  to ``Group:G``); resetting a group's offsets also needs a read right on each topic reset. A send-back needs
  Sub on the group and on the topic of the stored message it copies.
* Reading a topic's offsets and routes needs any of Pub, Sub or Get on it: producers, consumers and tools all do
  (a system topic's: super users only).
* Administration needs Create/Update/Delete/Get/List on the named resource or on the Cluster; calls that name no
  resource (list every topic, broker statistics) need it on the Cluster.
* Coordinating transactions across brokers (the exactly-once sink's decisions and the by-prefix listing and
  ending of transactions) needs Pub on the Cluster: those calls name transactions, not groups.
* Users and access control entries: super users only (``SUPER_ONLY``); a right to manage rights is every right.
* The name server (a name server started with auth): registering and unregistering brokers is for the cluster's
  root user (the brokers sign with it); route reads are ``ANONYMOUS``, no credentials needed: a route names
  brokers and topics, never a message, and every client asks for routes before it knows which broker holds its
  users.

An objects function gets the parsed request and the ``Lookup``; it never needs the store's lock for more than a
dictionary lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from broker.auth.operations import Operation, needs_of
from broker.auth.policy import Need
from broker.errors import BrokerError
from broker.format.message import Prop, iter_entries

Op = Operation


class Lookup(Protocol):
    """What a requirement may ask the broker (to preview a resolved operation's objects; see ``Row``)."""

    def transaction_group(self, txn_id: str, half_commitlog_offset: int | None) -> str | None: ...

    def message_topic(self, msg_id: str) -> str | None: ...


Requirement = Callable[[Any, Lookup], list[Need]]
Objects = Callable[[Any, Lookup], dict[str, Any]]


class Row:
    """One method: the operations it does, each with its objects as the request (and the broker's ``Lookup``)
    name them. Called, it gives every need of the call (module docstring)."""

    __slots__ = ("uses",)

    def __init__(self, *uses: tuple[Operation, Objects] | None) -> None:
        self.uses = tuple(u for u in uses if u is not None)

    def operations(self, request: Any, lookup: Lookup) -> tuple[Operation, ...]:
        """The operations a call with ``request`` does (a send: transactional or not)."""
        return tuple(op for op, _ in self.uses)

    def __call__(self, request: Any, lookup: Lookup) -> list[Need]:
        return [n for op, objects in self.uses for n in needs_of(op, **objects(request, lookup))]


def on(operation: Operation, objects: Objects = lambda r, lookup: {}) -> tuple[Operation, Objects]:
    return (operation, objects)


SUPER_ONLY = Row(on(Op.SUPER_USER))  # marker (is_super_only): refused but to super users before anything is read
ANONYMOUS = Row(on(Op.READ_ROUTES))  # marker (is_anonymous): no credentials asked
_NONE = Row()


def _names(*topics: str) -> dict[str, Any]:
    return {"topics": list(topics)}


def _end_transaction_objects(r: Any, lookup: Lookup) -> dict[str, Any]:
    """The group the end will be decided on: the transaction's recorded one, else (an id recorded now, or one
    this broker does not hold) the one the request names."""
    offset = r.half_commitlog_offset if r.WhichOneof("target") == "half_commitlog_offset" else None
    found = lookup.transaction_group(r.transaction_id, offset)
    return {"producer_group": found if found is not None else r.producer_group}


def _v2_end_transaction_objects(r: Any, lookup: Lookup) -> dict[str, Any]:
    found = lookup.transaction_group(r.transaction_id, None)  # RocketMQ 5 names no group: the topic stands for it
    return {"producer_group": found if found is not None else _v2_name(r.topic)}


def _joined(txn_id_of: Callable[[Any], str]) -> tuple[Operation, Objects]:
    """A half naming an id that is open already joins it: decided on that transaction's recorded group (looked up
    only when the row's needs are previewed: the transaction service decides it, under its lock)."""
    return on(
        Op.JOIN_TRANSACTION,
        lambda r, lookup: {"producer_group": lookup.transaction_group(txn_id_of(r), None) if txn_id_of(r) else None},
    )


def _v2_name(resource: Any) -> str:
    return str(resource.name)


class _Either(Row):
    """A method whose operations depend on the request (a send that may be transactional): two prebuilt rows."""

    __slots__ = ("other", "picks_other")

    def __init__(self, one: Row, other: Row, picks_other: Callable[[Any], bool]) -> None:
        super().__init__(*one.uses)
        self.other, self.picks_other = other, picks_other

    def __call__(self, request: Any, lookup: Lookup) -> list[Need]:
        return self.other(request, lookup) if self.picks_other(request) else super().__call__(request, lookup)

    def operations(self, request: Any, lookup: Lookup) -> tuple[Operation, ...]:
        return (
            self.other.operations(request, lookup) if self.picks_other(request) else super().operations(request, lookup)
        )


def _batch_topics(entries: bytes) -> list[str]:
    """The topics a SendBatch stores in (a half's real topic), for the preview (the send processor decides them on
    its own validation of the batch)."""
    try:
        return list(dict.fromkeys(m.properties.get(Prop.REAL_TOPIC) or m.topic for m in iter_entries(entries)))
    except (BrokerError, ValueError, IndexError):  # a batch the processor refuses as malformed
        return []


def _opens(producer_group: Callable[[Any], str], txn_id_of: Callable[[Any], str]) -> tuple[Operation, Objects]:
    """A transactional send opens a transaction under the group it names, unless its id names an open one, which it
    joins instead (``_joined``): then the group it names is not touched."""
    return on(
        Op.OPEN_TRANSACTION,
        lambda r, lookup: {"producer_group": None if txn_id_of(r) and lookup.transaction_group(txn_id_of(r), None)
                           else producer_group(r)},
    )


_OPEN = _opens(lambda r: str(r.producer_group), lambda r: str(getattr(r, "transaction_id", "")))
_SEND = on(Op.PUBLISH, lambda r, _: {"topics": [r.topic]})
_SEND_BATCH = on(Op.PUBLISH_BATCH, lambda r, _: {"topics": _batch_topics(r.entries)})


_V2_TRANSACTION = 4  # apache.rocketmq.v2.MessageType.TRANSACTION


def _v2_transactional(r: Any) -> list[Any]:
    return [m for m in r.messages if m.system_properties.message_type == _V2_TRANSACTION]


def _v2_topics(r: Any) -> dict[str, Any]:
    return {"topics": list(dict.fromkeys(_v2_name(m.topic) for m in r.messages))}


# RocketMQ 5 clients name no producer group: Sluice records their transactions under the topic's name
# (rmqv2/messaging_service.py), and the transaction's id is the message id the client chose.
_V2_SEND = _Either(
    Row(on(Op.PUBLISH, lambda r, _: _v2_topics(r))),
    Row(on(Op.PUBLISH, lambda r, _: _v2_topics(r)),
        _opens(lambda r: _v2_name(_v2_transactional(r)[0].topic),
               lambda r: str(_v2_transactional(r)[0].system_properties.message_id)),
        _joined(lambda r: _v2_transactional(r)[0].system_properties.message_id)),
    lambda r: any(m.system_properties.message_type == _V2_TRANSACTION for m in r.messages),
)
BROKER: dict[str, Requirement] = {
    "SendMessage": _Either(
        Row(_SEND),
        Row(_SEND, _OPEN, _joined(lambda r: r.transaction_id)),
        lambda r: r.transactional or bool(r.transaction_id),
    ),
    # Pub on each topic inside the batch: decided by the send processor on its validation of the batch
    "SendBatch": _Either(
        Row(_SEND_BATCH), Row(_SEND_BATCH, _OPEN, _joined(lambda r: r.transaction_id)), lambda r: bool(r.transaction_id)
    ),
    # Authenticated when they open; each request then needs what its unary call does (server/call_streams.py).
    "SendStream": _NONE,
    "PullStream": _NONE,
    "PullMessage": Row(on(Op.CONSUME, lambda r, _: {"group": r.consumer_group, "topics": [r.topic]})),
    "QueryConsumerOffset": Row(on(Op.CONSUME, lambda r, _: {"group": r.consumer_group, "topics": [r.topic]})),
    "UpdateConsumerOffsets": Row(
        on(Op.CONSUME, lambda r, _: {"group": r.consumer_group, "topics": [o.topic for o in r.offsets]})
    ),
    "GetQueueOffsets": Row(on(Op.READ_TOPIC, lambda r, _: _names(r.topic))),
    "SearchOffsetByTimestamp": Row(on(Op.READ_TOPIC, lambda r, _: _names(r.topic))),
    "QueryMessageByKey": Row(on(Op.QUERY_MESSAGES, lambda r, _: {"topic": r.topic})),
    # Decided by the handler on the entry it read (operations.py); previewed here through the lookup.
    "ViewMessageById": Row(on(Op.VIEW_MESSAGE, lambda r, lookup: {"topic": lookup.message_topic(r.msg_id)})),
    "CreateTopic": Row(on(Op.CREATE_TOPIC, lambda r, _: {"name": r.topic})),
    "DeleteTopic": Row(on(Op.DELETE_TOPIC, lambda r, _: {"name": r.topic})),
    "ListTopics": Row(on(Op.LIST_RESOURCES)),
    "GetTopicRoute": Row(on(Op.READ_TOPIC, lambda r, _: _names(r.topic))),
    "Heartbeat": Row(on(Op.HEARTBEAT, lambda r, _: {"group": r.consumer_group, "topics": list(r.subscriptions)})),
    "GetConsumerList": Row(on(Op.READ_GROUP, lambda r, _: {"group": r.consumer_group})),
    "GetConsumerLag": Row(on(Op.GROUP_LAG, lambda r, _: {"group": r.consumer_group, "topic": r.topic})),
    "GetBrokerStats": Row(on(Op.CLUSTER_STATS)),
    "EndTransaction": Row(on(Op.END_TRANSACTION, _end_transaction_objects)),
    "ListTransactions": Row(on(Op.LIST_TRANSACTIONS)),
    "EndTransactions": Row(on(Op.END_TRANSACTIONS)),
    "TransactionCheckStream": Row(on(Op.CHECK_TRANSACTIONS, lambda r, _: {"producer_group": r.producer_group})),
    # The retry topic written is the named group's; the message copied is resolved, and decided on its own topic.
    "ConsumerSendMsgBack": Row(
        on(
            Op.SEND_BACK,
            lambda r, lookup: {
                "group": r.consumer_group,
                "topic": (lookup.message_topic(r.msg_id) if r.WhichOneof("target") == "msg_id" else None) or "",
            },
        )
    ),
    "LockBatchMQ": Row(on(Op.CONSUME, lambda r, _: {"group": r.consumer_group, "topics": [q.topic for q in r.queues]})),
    "UnlockBatchMQ": Row(
        on(Op.CONSUME, lambda r, _: {"group": r.consumer_group, "topics": [q.topic for q in r.queues]})
    ),
    "GetSubscriptionGroup": Row(on(Op.READ_GROUP_SETTINGS, lambda r, _: {"name": r.consumer_group})),
    "UpdateSubscriptionGroup": Row(on(Op.UPDATE_GROUP_SETTINGS, lambda r, _: {"name": r.consumer_group})),
    "PopMessage": Row(on(Op.CONSUME, lambda r, _: {"group": r.consumer_group, "topics": [r.topic]})),
    "AckMessage": Row(on(Op.CONSUME, lambda r, _: {"group": r.consumer_group, "topics": [r.topic]})),
    "ChangeInvisibleTime": Row(on(Op.CONSUME, lambda r, _: {"group": r.consumer_group, "topics": [r.topic]})),
    "ListGroups": Row(on(Op.LIST_RESOURCES)),
    "ResetConsumerOffsets": Row(
        on(Op.RESET_OFFSETS, lambda r, _: {"name": r.consumer_group, "topics": [o.topic for o in r.offsets]})
    ),
    "CreateUser": SUPER_ONLY,
    "UpdateUser": SUPER_ONLY,
    "DeleteUser": SUPER_ONLY,
    "ListUsers": SUPER_ONLY,
    "GrantAcl": SUPER_ONLY,
    "RevokeAcl": SUPER_ONLY,
    "ListAcls": SUPER_ONLY,
}

COORDINATOR: dict[str, Requirement] = {
    "RecordDecision": Row(on(Op.RECORD_DECISION)),
    # Asked to abort the undecided ones it names, a query records decisions: what RecordDecision needs too.
    "QueryDecisions": _Either(Row(on(Op.QUERY_DECISIONS)), Row(on(Op.QUERY_DECISIONS), on(Op.RECORD_DECISION)),
                              lambda r: r.abort_undecided),
}


def _v2_consume(group_of: Callable[[Any], Any], topic_of: Callable[[Any], Any]) -> Row:
    return Row(on(Op.CONSUME, lambda r, _: {"group": _v2_name(group_of(r)), "topics": [_v2_name(topic_of(r))]}))


# RocketMQ 5's MessagingService (broker/rmqv2): its resources carry a namespace, which Sluice does not use.
MESSAGING: dict[str, Requirement] = {
    "QueryRoute": Row(on(Op.READ_TOPIC, lambda r, _: _names(_v2_name(r.topic)))),
    "Heartbeat": Row(on(Op.HEARTBEAT, lambda r, _: {"group": _v2_name(r.group)})),
    "SendMessage": _V2_SEND,
    "QueryAssignment": _v2_consume(lambda r: r.group, lambda r: r.topic),
    "ReceiveMessage": _v2_consume(lambda r: r.group, lambda r: r.message_queue.topic),
    "AckMessage": _v2_consume(lambda r: r.group, lambda r: r.topic),
    "ForwardMessageToDeadLetterQueue": _v2_consume(lambda r: r.group, lambda r: r.topic),
    "PullMessage": _v2_consume(lambda r: r.group, lambda r: r.message_queue.topic),
    "UpdateOffset": _v2_consume(lambda r: r.group, lambda r: r.message_queue.topic),
    "GetOffset": _v2_consume(lambda r: r.group, lambda r: r.message_queue.topic),
    "QueryOffset": Row(on(Op.READ_TOPIC, lambda r, _: _names(_v2_name(r.message_queue.topic)))),
    "EndTransaction": Row(on(Op.END_TRANSACTION, _v2_end_transaction_objects)),
    # A stream of client settings and commands: each settings message is decided as it arrives (PUBLISHER_SETTINGS,
    # SUBSCRIBER_SETTINGS, in rmqv2/messaging_service.py); what the client then does is authorized call by call.
    "Telemetry": _NONE,
    "NotifyClientTermination": Row(on(Op.LEAVE_GROUP, lambda r, _: {"group": _v2_name(r.group)})),
    "ChangeInvisibleDuration": _v2_consume(lambda r: r.group, lambda r: r.topic),
    "RecallMessage": Row(on(Op.PUBLISH, lambda r, _: _names(_v2_name(r.topic)))),
    "SyncLiteSubscription": _v2_consume(lambda r: r.group, lambda r: r.topic),
}

NAMESRV: dict[str, Requirement] = {
    "RegisterBroker": SUPER_ONLY,
    "UnregisterBroker": SUPER_ONLY,
    "GetRouteInfoByTopic": ANONYMOUS,
    "GetBrokerClusterInfo": ANONYMOUS,
    "GetAllTopicList": ANONYMOUS,
}

# RocketMQ's remoting protocol (broker/remoting): request code name -> row, over the requests its processors parse
# (``topic``, ``producer_group``, ``transactional``, ``consumer_group`` as the gRPC requests name them).
REMOTING: dict[str, Requirement] = {
    "SEND_MESSAGE": _Either(Row(_SEND), Row(_SEND, _OPEN), lambda r: r.transactional),
    "SEND_BATCH_MESSAGE": Row(on(Op.PUBLISH_BATCH, lambda r, _: {"topics": [r.topic]})),
    "PULL_MESSAGE": Row(on(Op.CONSUME, lambda r, _: {"group": r.consumer_group, "topics": [r.topic]})),
    "CONSUMER_SEND_MSG_BACK": Row(on(Op.SEND_BACK, lambda r, _: {"group": r.consumer_group, "topic": ""})),
    # Offsets and membership, as over gRPC (a heartbeat is decided once per consumer group it carries, over that
    # group's subscriptions).
    "GET_MAX_OFFSET": Row(on(Op.READ_TOPIC, lambda r, _: _names(r.topic))),
    "GET_MIN_OFFSET": Row(on(Op.READ_TOPIC, lambda r, _: _names(r.topic))),
    "GET_EARLIEST_MSG_STORETIME": Row(on(Op.READ_TOPIC, lambda r, _: _names(r.topic))),
    "SEARCH_OFFSET_BY_TIMESTAMP": Row(on(Op.READ_TOPIC, lambda r, _: _names(r.topic))),
    "QUERY_CONSUMER_OFFSET": Row(on(Op.CONSUME, lambda r, _: {"group": r.consumer_group, "topics": [r.topic]})),
    "UPDATE_CONSUMER_OFFSET": Row(on(Op.CONSUME, lambda r, _: {"group": r.consumer_group, "topics": [r.topic]})),
    "HEART_BEAT": Row(on(Op.HEARTBEAT, lambda r, _: {"group": r.consumer_group, "topics": list(r.subscriptions)})),
    "UNREGISTER_CLIENT": Row(on(Op.LEAVE_GROUP, lambda r, _: {"group": r.consumer_group})),
    "GET_CONSUMER_LIST_BY_GROUP": Row(on(Op.READ_GROUP, lambda r, _: {"group": r.consumer_group})),
    # The name server's: route reads, open as its gRPC port's are (module docstring).
    "GET_ROUTEINFO_BY_TOPIC": ANONYMOUS,
    "GET_BROKER_CLUSTER_INFO": ANONYMOUS,
    "GET_ALL_TOPIC_LIST_FROM_NAMESERVER": ANONYMOUS,
    "GET_KV_CONFIG": ANONYMOUS,
    # mqadmin deleteTopic's name server half: signed by the name server's root user (the only one it knows).
    "DELETE_TOPIC_IN_NAMESRV": Row(on(Op.DELETE_TOPIC, lambda r, _: {"name": r.topic})),
    # queries and mqadmin's codes (broker/remoting/query_processor.py, topic_ and group_admin_processor.py)
    "QUERY_MESSAGE": Row(on(Op.QUERY_MESSAGES, lambda r, _: {"topic": r.topic})),
    "VIEW_MESSAGE_BY_ID": Row(on(Op.VIEW_MESSAGE, lambda r, _: {"topic": ""})),  # decided on the entry read
    "UPDATE_AND_CREATE_TOPIC": Row(on(Op.CREATE_TOPIC, lambda r, _: {"name": r.topic})),
    "DELETE_TOPIC_IN_BROKER": Row(on(Op.DELETE_TOPIC, lambda r, _: {"name": r.topic})),
    "GET_TOPIC_STATS_INFO": Row(on(Op.READ_TOPIC, lambda r, _: _names(r.topic))),
    "GET_BROKER_RUNTIME_INFO": Row(on(Op.CLUSTER_STATS)),
    "UPDATE_AND_CREATE_SUBSCRIPTIONGROUP": Row(on(Op.UPDATE_GROUP_SETTINGS, lambda r, _: {"name": r.consumer_group})),
    "GET_CONSUMER_CONNECTION_LIST": Row(on(Op.READ_GROUP, lambda r, _: {"group": r.consumer_group})),
    "GET_CONSUME_STATS": Row(on(Op.GROUP_LAG, lambda r, _: {"group": r.consumer_group, "topic": r.topic})),
    "INVOKE_BROKER_TO_RESET_OFFSET": Row(
        on(Op.RESET_OFFSETS, lambda r, _: {"name": r.consumer_group, "topics": [r.topic]})
    ),
    # translated into the sluice.v1 requests of the same work, decided by those requests' rows
    "END_TRANSACTION": BROKER["EndTransaction"],
    "LOCK_BATCH_MQ": BROKER["LockBatchMQ"],
    "UNLOCK_BATCH_MQ": BROKER["UnlockBatchMQ"],
    "POP_MESSAGE": BROKER["PopMessage"],
    "ACK_MESSAGE": BROKER["AckMessage"],
    "CHANGE_MESSAGE_INVISIBLETIME": BROKER["ChangeInvisibleTime"],
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
