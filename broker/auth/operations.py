"""The rights each operation needs over the objects it touches: one table (``RULES``), one check (``authorize``).

An operation is what a request does, whatever protocol carried it: publishing, consuming, ending a transaction,
sending a message back for a retry... Each rule names the objects it is decided on and the rights it needs over
them (policy.py decides each need against the caller's entries and address). The operation itself asks: each
processor under the protocol fronts (broker/server/*_processor.py, the transaction service, the coordinator) calls
``authorize`` with the objects it is about to touch, first, before it reads, creates or changes anything; a
protocol front only translates its wire into those calls (requirements.py declares which operations each method
of each front does), so the same operation needs the same rights whichever front it came through, and a front
cannot decide a right on its own reading of a request.

Two kinds of object (``Rule.resolved``):

* **Named**: the objects are the ones the request names, and nothing else is touched (a pull reads the queue of
  the topic it names for the group it names).
* **Resolved**: the operation acts on an object it finds first: the stored message a send-back copies (its own
  topic, not a name in the request), the transaction an end or a half joins (the producer group recorded when the
  transaction was opened). A request that names one object and touches another is refused on the one it touches.

The caller of the running call lives in a context variable (caller.py's ``current``), set by the gate (gRPC) or
the remoting port for each call it admitted and reset when the call ends; a super user's caller passes every
check. With auth off and for the broker's own work (check-back answers recorded by a thread, recovery, the
participant resolver, a closed connection's clients leaving their groups), nothing is set and ``authorize`` lets
everything through: authorization never changes what an authorized caller sees.

System topics (broker/format/system_topics.py) hold what the broker still owes; no client reads their messages through
any read path whatever its rights (the processors refuse those reads for everyone); their offsets and routes are
for super users only, and no lookup creates one.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from broker.auth.caller import current_caller
from broker.auth.policy import CLUSTER, Action, Need, need
from broker.auth.policy import group as group_r
from broker.auth.policy import topic as topic_r
from broker.format.system_topics import is_system_topic

PUB, SUB, CREATE, UPDATE, DELETE, GET, LIST, ALL = (Action.PUB, Action.SUB, Action.CREATE, Action.UPDATE,
                                                    Action.DELETE, Action.GET, Action.LIST, Action.ALL)
READ_ANY = (PUB, SUB, GET)


class Operation(enum.Enum):
    PUBLISH = "publish"
    PUBLISH_BATCH = "publish_batch"
    OPEN_TRANSACTION = "open_transaction"
    JOIN_TRANSACTION = "join_transaction"
    END_TRANSACTION = "end_transaction"
    CHECK_TRANSACTIONS = "check_transactions"
    LIST_TRANSACTIONS = "list_transactions"
    END_TRANSACTIONS = "end_transactions"
    RECORD_DECISION = "record_decision"
    QUERY_DECISIONS = "query_decisions"
    CONSUME = "consume"
    SEND_BACK = "send_back"
    HEARTBEAT = "heartbeat"
    READ_TOPIC = "read_topic"
    QUERY_MESSAGES = "query_messages"
    VIEW_MESSAGE = "view_message"
    READ_GROUP = "read_group"
    GROUP_LAG = "group_lag"
    CREATE_TOPIC = "create_topic"
    DELETE_TOPIC = "delete_topic"
    LIST_RESOURCES = "list_resources"
    CLUSTER_STATS = "cluster_stats"
    READ_GROUP_SETTINGS = "read_group_settings"
    UPDATE_GROUP_SETTINGS = "update_group_settings"
    RESET_OFFSETS = "reset_offsets"
    SUPER_USER = "super_user"
    READ_ROUTES = "read_routes"
    LEAVE_GROUP = "leave_group"
    PUBLISHER_SETTINGS = "publisher_settings"
    SUBSCRIBER_SETTINGS = "subscriber_settings"


@dataclass(frozen=True, slots=True)
class Rule:
    """``needs(**objects)``: the rights over ``objects``; ``resolved``: the objects are ones the operation found,
    not the ones its request names (module docstring)."""

    objects: tuple[str, ...]
    needs: Callable[..., list[Need]]
    resolved: bool
    says: str  # the rule in words (docs/security.md, refusals)


def _transaction_group(producer_group: str) -> list[Need]:
    """A transaction belongs to its producer group: Pub there, or on the Cluster when nothing about the group
    decides (the coordinator's right, which names transactions, not groups); a transaction recorded without a
    group is the Cluster's."""
    if not producer_group:
        return [need(CLUSTER, PUB)]
    return [need(group_r(producer_group), PUB, or_cluster=True)]


def _consume(group: str, topics: Iterable[str]) -> list[Need]:
    return [need(group_r(group), SUB)] + [need(topic_r(t), SUB) for t in dict.fromkeys(topics)]


def _read_topic(topics: Iterable[str]) -> list[Need]:
    # a system topic's offsets count what the broker owes (open transactions, pending delays): super users only
    return [need(CLUSTER, ALL) if is_system_topic(t) else need(topic_r(t), *READ_ANY) for t in dict.fromkeys(topics)]


def _topic_offsets(topic: str) -> Need:
    """Reading where a topic stands for a group (its lag, a reset bounded by its offsets); a system topic's offsets
    count what the broker owes: super users only, as _read_topic."""
    return need(CLUSTER, ALL) if is_system_topic(topic) else need(topic_r(topic), SUB, GET, or_cluster=True)


def _reset_offsets(group: str, topics: Iterable[str]) -> list[Need]:
    return [need(group_r(group), UPDATE, or_cluster=True), *(_topic_offsets(t) for t in dict.fromkeys(topics))]


def _admin(kind: Callable[[str], Any], *actions: Action) -> Callable[..., list[Need]]:
    return lambda name: [need(kind(name), *actions, or_cluster=True)]


RULES: dict[Operation, Rule] = {
    Operation.PUBLISH: Rule(
        ("topics",),
        lambda topics: [need(topic_r(t), PUB) for t in dict.fromkeys(topics)],
        False,
        "Pub on each topic written",
    ),
    # A SendBatch names its topics inside its packed entries: decided where the send processor validates the batch
    # anyway (walking it twice costs more than storing it), before anything is stored.
    Operation.PUBLISH_BATCH: Rule(
        ("topics",),
        lambda topics: [need(topic_r(t), PUB) for t in dict.fromkeys(topics)],
        True,
        "Pub on each topic the batch's entries are stored in (for halves: their real topics)",
    ),
    Operation.OPEN_TRANSACTION: Rule(
        ("producer_group",),
        lambda producer_group: [need(group_r(producer_group), PUB)] if producer_group else [],
        False,
        "Pub on the producer group a new transaction is recorded under",
    ),
    Operation.JOIN_TRANSACTION: Rule(
        ("producer_group",),
        lambda producer_group: [] if producer_group is None else _transaction_group(producer_group),
        True,
        "Pub on the producer group recorded when the open transaction was opened (None: no open one joined)",
    ),
    Operation.END_TRANSACTION: Rule(
        ("producer_group",),
        _transaction_group,
        True,
        "Pub on the transaction's recorded producer group (for an id recorded now: the "
        "group the request names, recorded with the outcome)",
    ),
    Operation.CHECK_TRANSACTIONS: Rule(
        ("producer_group",),
        lambda producer_group: [need(group_r(producer_group), PUB)],
        False,
        "Pub on the producer group whose check-backs are received",
    ),
    Operation.LIST_TRANSACTIONS: Rule((), lambda: [need(CLUSTER, PUB, GET)], False, "Pub or Get on the Cluster"),
    Operation.END_TRANSACTIONS: Rule(
        (),
        lambda: [need(CLUSTER, PUB, UPDATE)],
        False,
        "Pub or Update on the Cluster, and each transaction ended as END_TRANSACTION",
    ),
    Operation.RECORD_DECISION: Rule(
        (), lambda: [need(CLUSTER, PUB)], False, "Pub on the Cluster (a decision names transactions on several brokers)"
    ),
    Operation.QUERY_DECISIONS: Rule((), lambda: [need(CLUSTER, PUB, GET)], False, "Pub or Get on the Cluster"),
    Operation.CONSUME: Rule(("group", "topics"), _consume, False, "Sub on the group and on each topic read"),
    Operation.SEND_BACK: Rule(
        ("group", "topic"),
        lambda group, topic: _consume(group, [topic] if topic else []),
        True,
        "Sub on the group and on the stored message's own topic",
    ),
    # A consumer's subscriptions are what its group then reports (its lag, its topics): joining with a topic takes
    # the right to read it, as a RocketMQ 5 consumer's settings do (SUBSCRIBER_SETTINGS).
    Operation.HEARTBEAT: Rule(
        ("group", "topics"),
        lambda group, topics=(): _consume(group, topics) if group else [],
        False,
        "Sub on the group and on each topic subscribed (a heartbeat naming no group: nothing)",
    ),
    Operation.READ_TOPIC: Rule(
        ("topics",), _read_topic, False, "Pub, Sub or Get on the topic (a system topic: super users only)"
    ),
    Operation.QUERY_MESSAGES: Rule(
        ("topic",), lambda topic: [need(topic_r(topic), SUB, GET)], False, "Sub or Get on the topic"
    ),
    # Decided on the entry the handler read, not on a preview: an id naming an offset nothing is stored at yet
    # previews no topic, and the message stored there a moment later must not pass unchecked.
    Operation.VIEW_MESSAGE: Rule(
        ("topic",),
        lambda topic: [need(topic_r(topic), SUB, GET)] if topic else [],
        True,
        "Sub or Get on the stored message's own topic",
    ),
    Operation.READ_GROUP: Rule(
        ("group",), lambda group: [need(group_r(group), SUB, GET)], False, "Sub or Get on the group"
    ),
    # A lag of every topic of the group (no topic named) shows only the topics this rule allows (admin_processor).
    Operation.GROUP_LAG: Rule(
        ("group", "topic"),
        lambda group, topic: (
            [need(group_r(group), SUB, GET, or_cluster=True)] + ([_topic_offsets(topic)] if topic else [])
        ),
        False,
        "Sub or Get on the group and the topic (or on the Cluster; a system topic: super users only)",
    ),
    Operation.CREATE_TOPIC: Rule(("name",), _admin(topic_r, CREATE), False, "Create on the topic (or the Cluster)"),
    Operation.DELETE_TOPIC: Rule(("name",), _admin(topic_r, DELETE), False, "Delete on the topic (or the Cluster)"),
    Operation.LIST_RESOURCES: Rule((), lambda: [need(CLUSTER, LIST)], False, "List on the Cluster"),
    Operation.CLUSTER_STATS: Rule((), lambda: [need(CLUSTER, GET)], False, "Get on the Cluster"),
    Operation.READ_GROUP_SETTINGS: Rule(
        ("name",), _admin(group_r, SUB, GET), False, "Sub or Get on the group (or the Cluster)"
    ),
    Operation.UPDATE_GROUP_SETTINGS: Rule(
        ("name",), _admin(group_r, CREATE, UPDATE), False, "Create or Update on the group (or the Cluster)"
    ),
    # Setting a group's offsets on a topic is reading where that topic stands (the reset is bounded by its offsets):
    # a right to read the topic too, as Kafka asks Read on the topic of each offset committed.
    Operation.RESET_OFFSETS: Rule(
        ("name", "topics"),
        lambda name, topics=(): _reset_offsets(name, topics),
        False,
        "Update on the group and Sub or Get on each topic reset (or the Cluster; a system topic: super users only)",
    ),
    Operation.SUPER_USER: Rule((), lambda: [need(CLUSTER, ALL)], False, "super users only"),
    Operation.READ_ROUTES: Rule((), lambda: [], False, "nothing: no credentials needed (name server routes)"),
    # Kafka asks Read on the group of a LeaveGroup: a leave ends a member's share of the group's queues and its
    # locks, which a right to publish under the group's name must not do.
    Operation.LEAVE_GROUP: Rule(
        ("group",), lambda group: [need(group_r(group), SUB)] if group else [], False,
        "Sub on the group a client leaves (if any), as joining it took",
    ),
    # A RocketMQ 5 Telemetry stream's settings arrive after the stream opened: decided as each one arrives.
    Operation.PUBLISHER_SETTINGS: Rule(
        ("topics",), lambda topics: [need(topic_r(t), PUB) for t in dict.fromkeys(topics)], True,
        "Pub on each topic a producer's settings list (it is sent those topics' check-backs)",
    ),
    Operation.SUBSCRIBER_SETTINGS: Rule(
        ("group", "topics"), lambda group, topics: _consume(group, topics), True,
        "Sub on a consumer's group and on each topic its settings subscribe",
    ),
}


def needs_of(operation: Operation, **objects: Any) -> list[Need]:
    return RULES[operation].needs(**objects)


def allowed(operation: Operation, **objects: Any) -> bool:
    """Whether the running call's caller may do ``operation`` on ``objects``, without refusing: for an answer that
    leaves out what the caller may not see (a group's lag over every topic it has offsets on)."""
    caller = current_caller()
    return caller is None or all(caller.allows(n) for n in needs_of(operation, **objects))


def authorize(operation: Operation, **objects: Any) -> None:
    """NoPermissionError unless the running call's caller (caller.py) may do ``operation`` on ``objects`` (what the
    operation resolved). Nothing to decide, nor to build, with auth off and for the broker's own work (no caller):
    every pull and send asks."""
    caller = current_caller()
    if caller is not None:
        caller.require(*needs_of(operation, **objects))


def transaction_access(use: str, producer_group: str) -> None:
    """The transaction service's check (semantics/transaction.py ``check_group``): ``use`` is "end", "join" or
    "open", ``producer_group`` the transaction's recorded group (or the one a new record takes)."""
    operation = {"end": Operation.END_TRANSACTION, "join": Operation.JOIN_TRANSACTION,
                 "open": Operation.OPEN_TRANSACTION}[use]
    authorize(operation, producer_group=producer_group)
