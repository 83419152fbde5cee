"""Admin: topics, queue offsets, consumer lag and groups, message queries, transactions, broker stats -- of one
broker (``endpoint=``) or of a cluster (``namesrv=``).

In a cluster, as RocketMQ's MQAdminExt:

* ``cluster_info()`` lists the live brokers from the name servers (every one of them is asked and the answers
  merged, so a broker registered with only some of them is listed too).
* ``create_topic(..., cluster=C)`` creates the topic on every master of cluster C, ``broker=B`` on one. Before
  anything is created every target must answer and, unless ``if_not_exists``, none may hold the topic yet: an
  unknown name, a broker that is down or a topic that exists changes nothing anywhere.
* ``delete_topic`` deletes the topic on every master that holds it, asking each master (the name servers may be a
  registration behind). A master that does not answer while the topic's route lists it stops the deletion before
  anything is deleted.
* Reads of one topic (offsets, lag, describe, key queries) go to the brokers of its route; reads of the whole
  cluster (lag of every topic, transactions, stats) to every live master. Rows say which broker they came from
  (``BrokerTopicInfo``, ``BrokerQueueLag``, ``BrokerTransactionInfo``) and keys of offsets are ``(broker_name,
  queue_id)``, as ``PullConsumer``'s.

Users and access control entries (``create_user`` ... ``list_acls``, super users only): admin_access.py.

A partial failure of a change made on several brokers (a create or a delete that one broker refused after others
had done it) raises an error naming the brokers where it was done and the one that failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.client.admin_access import AccessAdmin
from broker.client.admin_base import ask_broker, with_broker
from broker.client.admin_results import (
    AclEntry,
    BrokerAclEntry,
    BrokerInfo,
    BrokerLag,
    BrokerQueueLag,
    BrokerQueues,
    BrokerTopicInfo,
    BrokerTransactionInfo,
    BrokerUserInfo,
    ClusterInfo,
    ClusterTopicInfo,
    ClusterUserInfo,
    GroupInfo,
    GroupLag,
    QueueLag,
    QueueRange,
    SubscriptionGroup,
    TopicDescription,
    TopicInfo,
    TransactionInfo,
    UserInfo,
    broker_topic_info,
    group,
    queue_lag,
    topic_info,
    transaction,
)
from broker.client.connection import Connection
from broker.client.offset_reset import OffsetReset, ResetTo, plan_reset
from broker.client.outgoing_message import decode_entries
from broker.client.results import ReceivedMessage
from broker.client.route import DIRECT_BROKER, MessageQueue, TopicRoute
from broker.client.router import Router
from broker.errors import (
    BrokerError,
    InvalidArgumentError,
    QueryNotFoundError,
    ResponseCode,
    ServiceNotAvailableError,
    SubscriptionGroupNotExistError,
    TopicExistsError,
    TopicNotExistError,
)
from broker.format.message import parse_msg_id, validate_topic
from broker.format.system_topics import retry_topic
from broker.proto import sluice_pb2 as pb

__all__ = [
    "AclEntry", "Admin", "BrokerAclEntry", "BrokerInfo", "BrokerLag", "BrokerQueueLag", "BrokerQueues",
    "BrokerTopicInfo", "BrokerTransactionInfo", "BrokerUserInfo", "ClusterInfo", "ClusterTopicInfo",
    "ClusterUserInfo", "GroupInfo", "GroupLag", "QueueLag", "QueueRange", "SubscriptionGroup", "TopicDescription",
    "TopicInfo", "TransactionInfo", "UserInfo",
]


class Admin(AccessAdmin):
    def _probe(self, broker: BrokerInfo, topic: str) -> TopicInfo | None:
        """The topic as ``broker`` holds it, None when it does not; raises when the broker does not answer."""
        conn = self._connection(broker)
        try:
            return topic_info(conn.call(conn.stub.GetTopicRoute, pb.GetTopicRouteRequest(topic=topic)))
        except TopicNotExistError:
            return None
        except BrokerError as e:
            raise with_broker(e, f"{broker.broker_name} ({broker.address})") from None

    def _route(self, topic: str) -> TopicRoute:
        """The topic's route as the name servers (or the one broker) know it now, not as cached."""
        self.router.refresh(topic)
        return self.router.route(topic)

    def _topic_brokers(self, topic: str) -> list[tuple[str, Connection]]:
        """(broker name, connection) of every broker group of the topic's route (the one broker: name "")."""
        route = self._route(topic)
        return [(name, self.router.broker_connection(topic, name, write=False)) for name in route.broker_names]

    def _brokers(self) -> list[tuple[str, Connection]]:
        """(broker name, connection) of every live master (the one broker: name "")."""
        if not self.cluster_mode:
            return [(DIRECT_BROKER, self.conn)]
        return [(b.broker_name, self._connection(b)) for b in self.cluster_info().masters()]

    def _row_broker(self, name: str) -> str | None:
        """The broker name rows carry: None (plain rows) with one broker."""
        return name if self.cluster_mode else None

    # ------------------------------------------------------------------------------------------ topics
    def create_topic(
        self, topic: str, queues: int = 8, *, if_not_exists: bool = False, cluster: str | None = None,
        broker: str | None = None,
    ) -> TopicInfo:
        """Create ``topic`` with ``queues`` read and write queues on each broker it goes to.

        One broker (``endpoint=``): on it. A cluster: on every master of ``cluster`` (of the only cluster when
        neither is named), or on the one master ``broker``; the answer is then a ``ClusterTopicInfo`` whose
        ``brokers`` are the brokers it was created on, which ``sluice topic create --cluster/--broker`` shows one
        line each. ``if_not_exists``: a broker that holds the topic already counts as done."""
        if queues < 1:  # on the wire 0 means "the broker's default": a 0 here is a mistake, not a request for 8
            raise InvalidArgumentError(f"queues={queues}: a topic needs at least one queue")
        request = pb.CreateTopicRequest(topic=topic, queue_nums=queues, if_not_exists=if_not_exists)
        if not self.cluster_mode:
            if cluster is not None or broker is not None:
                raise InvalidArgumentError(
                    "cluster= and broker= name brokers of a cluster; this admin talks to the single "
                    f"{self.router.describe()} (give namesrv=)"
                )
            return topic_info(self.conn.call(self.stub.CreateTopic, request))
        validate_topic(topic)
        targets = self._targets(cluster, broker)
        held = [b.broker_name for b in targets if self._probe(b, topic) is not None]  # every target answers first
        if held and not if_not_exists:
            raise TopicExistsError(
                f"topic {topic!r} already exists on {', '.join(held)}; nothing was created (if_not_exists=True "
                "creates it where it is missing)"
            )
        created: list[BrokerTopicInfo] = []
        for b in targets:
            conn = self._connection(b)
            try:
                answer = conn.call(conn.stub.CreateTopic, request)
            except BrokerError as e:
                done = [c.broker_name for c in created]
                raise _on_broker(e, b.broker_name, done, f"topic {topic!r} was created") from None
            created.append(broker_topic_info(answer, b.broker_name, b.cluster))
        self.router.refresh(topic)
        return ClusterTopicInfo.of(topic, created) if broker is None else created[0]

    def delete_topic(self, topic: str, *, broker: str | None = None) -> list[str]:
        """Delete ``topic``; the names of the brokers it was deleted on (``[""]`` with one broker).

        A cluster: on every live master that holds it (or on ``broker`` only). TopicNotExistError when none does."""
        if not self.cluster_mode:
            if broker is not None:
                raise InvalidArgumentError(f"broker= names a broker of a cluster; this admin talks to the single "
                                           f"{self.router.describe()}")
            self.conn.call(self.stub.DeleteTopic, pb.DeleteTopicRequest(topic=topic))
            return [DIRECT_BROKER]
        validate_topic(topic)
        masters = self._targets(None, broker) if broker is not None else self.cluster_info().masters()
        try:
            routed = set(self._route(topic).broker_names)
        except TopicNotExistError:
            routed = set()
        holders: list[BrokerInfo] = []
        for b in masters:
            try:
                if self._probe(b, topic) is not None:
                    holders.append(b)
            except ServiceNotAvailableError as e:
                if b.broker_name in routed:  # it holds the topic and cannot delete it now: delete nothing
                    raise type(e)(f"{e.message}; it holds topic {topic!r}, so nothing was deleted (delete again "
                                  "once it is back, or once the name servers have dropped it)", e.code) from None
        if not holders:
            where = f"broker {broker}" if broker is not None else f"any live master of {self.router.describe()}"
            raise TopicNotExistError(f"topic {topic!r} does not exist on {where}")
        deleted: list[str] = []
        for b in holders:
            conn = self._connection(b)
            try:
                conn.call(conn.stub.DeleteTopic, pb.DeleteTopicRequest(topic=topic))
            except BrokerError as e:
                raise _on_broker(e, b.broker_name, deleted, f"topic {topic!r} was deleted") from None
            deleted.append(b.broker_name)
        self.router.refresh(topic)
        return deleted

    def list_topics(self) -> list[TopicInfo]:
        """Every topic. A cluster: the name servers' topic list, one ``BrokerTopicInfo`` per topic and broker
        (from the routes, as RocketMQ's ``topicList -c``: no broker is asked)."""
        if not self.cluster_mode:
            return [topic_info(t) for t in self.conn.call(self.stub.ListTopics, pb.ListTopicsRequest()).topics]
        namesrv = self.router.namesrv
        assert namesrv is not None
        out: list[TopicInfo] = []
        for topic in sorted(namesrv.topics()):
            try:
                route = TopicRoute.from_pb(topic, namesrv.route(topic))
            except TopicNotExistError:
                continue  # deleted (or its brokers left) between the two questions
            out += [BrokerTopicInfo(topic, q.read_queue_nums, q.write_queue_nums, q.perm, q.broker_name,
                                    route.groups[q.broker_name].cluster) for q in route.queues]
        return out

    def topic_info(self, topic: str) -> TopicInfo:
        """The topic's queue counts and permission; a cluster: a ``ClusterTopicInfo`` (sums, and each broker's)."""
        if not self.cluster_mode:
            return topic_info(self.conn.call(self.stub.GetTopicRoute, pb.GetTopicRouteRequest(topic=topic)))
        route = self._route(topic)
        return ClusterTopicInfo.of(topic, [
            BrokerTopicInfo(topic, q.read_queue_nums, q.write_queue_nums, q.perm, q.broker_name,
                            route.groups[q.broker_name].cluster) for q in route.queues
        ])

    def describe_topic(self, topic: str) -> TopicDescription:
        """``sluice topic describe T``: per broker of the topic's route, its queue counts, permission and every
        queue's min and max offset; a broker that does not answer is shown with its error."""
        route = self._route(topic)
        brokers: list[BrokerQueues] = []
        for q in route.queues:
            ranges: tuple[QueueRange, ...] = ()
            error = ""
            try:
                conn = self.router.broker_connection(topic, q.broker_name, write=False)
                answer = conn.call(conn.stub.GetQueueOffsets, pb.GetQueueOffsetsRequest(topic=topic))
                ranges = tuple(QueueRange(r.queue_id, r.min_offset, r.max_offset) for r in answer.queues)
            except BrokerError as e:
                if not self.cluster_mode:
                    raise
                error = e.message
            brokers.append(BrokerQueues(q.broker_name, route.groups[q.broker_name].cluster, q.read_queue_nums,
                                        q.write_queue_nums, q.perm, ranges, error))
        return TopicDescription(topic, tuple(brokers))

    def queue_offsets(self, topic: str) -> dict[Any, tuple[int, int]]:
        """(min offset, max offset) of every queue of the topic: ``{queue_id: ...}`` with one broker,
        ``{(broker_name, queue_id): ...}`` in a cluster."""
        return {mq.queue_id if not self.cluster_mode else (mq.broker_name, mq.queue_id): r
                for mq, r in self.queue_ranges(topic).items()}

    def queue_ranges(self, topic: str) -> dict[MessageQueue, tuple[int, int]]:
        """(min offset, max offset) of every queue of the topic on every broker that holds it."""
        if not self.cluster_mode:  # one call, as it always was (no route lookup first)
            response = self.conn.call(self.stub.GetQueueOffsets, pb.GetQueueOffsetsRequest(topic=topic))
            return {MessageQueue(topic, DIRECT_BROKER, q.queue_id): (q.min_offset, q.max_offset)
                    for q in response.queues}
        out: dict[MessageQueue, tuple[int, int]] = {}
        for name, conn in self._topic_brokers(topic):
            response = ask_broker(name, conn, "GetQueueOffsets", pb.GetQueueOffsetsRequest(topic=topic))
            for q in response.queues:
                out[MessageQueue(topic, name, q.queue_id)] = (q.min_offset, q.max_offset)
        return out

    def search_offset_by_timestamp(self, topic: str, queue_id: int, timestamp_ms: int, *, broker: str = "") -> int:
        """The first offset of the queue stored at or after ``timestamp_ms``; in a cluster name the queue's broker."""
        request = pb.SearchOffsetByTimestampRequest(topic=topic, queue_id=queue_id, timestamp_ms=timestamp_ms)
        if self.cluster_mode and not broker:
            raise InvalidArgumentError("a queue id is ambiguous in a cluster: name its broker (broker=)")
        conn = self.router.broker_connection(topic, broker, write=False)
        return conn.call(conn.stub.SearchOffsetByTimestamp, request).offset

    # ------------------------------------------------------------------------------------------ consumers
    def consumer_lag(self, group: str, topic: str = "") -> list[QueueLag]:
        """Per-queue lag of ``group`` (on ``topic``, or every topic it has offsets or consumers for); in a cluster
        ``BrokerQueueLag`` rows of every broker. Raises when a broker does not answer (``group_lag`` shows it)."""
        if not self.cluster_mode:
            request = pb.GetConsumerLagRequest(consumer_group=group, topic=topic)
            return [queue_lag(q, None) for q in self.conn.call(self.stub.GetConsumerLag, request).queues]
        lag = self.group_lag(group, topic)
        for b in lag.brokers:
            if b.error:
                raise ServiceNotAvailableError(f"broker {b.broker_name}: {b.error}")
        return lag.queues()

    def group_lag(self, group: str, topic: str = "") -> GroupLag:
        """``sluice group lag G``: the lag summed over every broker, with each broker's part and queues (from the
        brokers of ``topic``'s route, or every live master). A broker that does not answer is listed with its
        error and left out of the sum; brokers where the group never consumed are left out.
        SubscriptionGroupNotExistError when no broker knows the group."""
        if not self.cluster_mode:
            rows = self.consumer_lag(group, topic)
            return GroupLag(group, sum(q.lag for q in rows), (BrokerLag(DIRECT_BROKER, sum(q.lag for q in rows),
                                                                        tuple(rows)),))
        request = pb.GetConsumerLagRequest(consumer_group=group, topic=topic)
        parts: list[BrokerLag] = []
        unknown: BrokerError | None = None
        for name, conn in self._topic_brokers(topic) if topic else self._brokers():
            try:
                rows = [queue_lag(q, name) for q in conn.call(conn.stub.GetConsumerLag, request).queues]
            except SubscriptionGroupNotExistError as e:
                unknown = e  # the group never consumed here: nothing to count
                continue
            except BrokerError as e:
                parts.append(BrokerLag(name, 0, (), e.message))
                continue
            parts.append(BrokerLag(name, sum(q.lag for q in rows), tuple(rows)))
        if not parts and unknown is not None:
            raise SubscriptionGroupNotExistError(
                f"consumer group {group!r} has no committed offsets and no live consumers on any broker of "
                f"{self.router.describe()}; check the group name"
            )
        return GroupLag(group, sum(b.lag for b in parts), tuple(parts))

    def consumer_list(self, group: str, topic: str = "") -> list[str]:
        """The client ids of the group's live consumers. A cluster: every id any broker of ``topic`` lists (of the
        group's ``%RETRY%`` topic when none is named: every clustering consumer heartbeats its brokers)."""
        request = pb.GetConsumerListRequest(consumer_group=group)
        if not self.cluster_mode:
            return list(self.conn.call(self.stub.GetConsumerList, request).client_ids)
        try:
            brokers = self._topic_brokers(topic or retry_topic(group))
        except TopicNotExistError:
            if topic:
                raise
            return []  # no clustering consumer of the group has reached any broker
        ids: set[str] = set()
        last: BrokerError | None = None
        for name, conn in brokers:
            try:
                ids.update(conn.call(conn.stub.GetConsumerList, request).client_ids)
            except BrokerError as e:
                last = with_broker(e, name)
        if last is not None and not ids:
            raise last
        return sorted(ids)

    def committed_offsets(self, group: str, topic: str) -> dict[Any, int]:
        """``{queue_id: offset}`` with one broker, ``{(broker_name, queue_id): offset}`` in a cluster."""
        request = pb.QueryConsumerOffsetRequest(consumer_group=group, topic=topic, queue_id=-1)
        if not self.cluster_mode:
            return {o.queue_id: o.offset for o in self.conn.call(self.stub.QueryConsumerOffset, request).offsets}
        out: dict[Any, int] = {}
        for name, conn in self._topic_brokers(topic):
            answer = ask_broker(name, conn, "QueryConsumerOffset", request)
            out.update({(name, o.queue_id): o.offset for o in answer.offsets})
        return out

    # ------------------------------------------------------------------------------------------ queries
    def query_by_key(
        self, topic: str, key: str, max_num: int = 64, begin_ms: int = 0, end_ms: int = 0
    ) -> list[ReceivedMessage]:
        """Messages of ``topic`` with ``key`` (at most ``max_num`` per broker), from every broker of its route."""
        request = pb.QueryMessageByKeyRequest(
            topic=topic, key=key, max_num=max_num, begin_timestamp_ms=begin_ms, end_timestamp_ms=end_ms
        )
        brokers = [(DIRECT_BROKER, self.conn)] if not self.cluster_mode else self._topic_brokers(topic)
        out: list[ReceivedMessage] = []
        for name, conn in brokers:
            r = ask_broker(name, conn, "QueryMessageByKey", request)
            out += decode_entries(r.entries, r.entry_positions)
        return out

    def view_message(self, msg_id: str) -> ReceivedMessage:
        """The message with this offset id. A cluster: asked of the broker whose address the id carries first,
        then of every other live master (a broker may advertise another address than its store records)."""
        request = pb.ViewMessageByIdRequest(msg_id=msg_id)
        if not self.cluster_mode:
            r = self.conn.call(self.stub.ViewMessageById, request)
            return decode_entries(r.entries, r.entry_positions)[0]
        parts = parse_msg_id(msg_id)
        stored_at = f"{'.'.join(str(b) for b in parts.store_ip)}:{parts.store_port}"
        masters = sorted(self.cluster_info().masters(), key=lambda b: b.address != stored_at)
        for b in masters:
            conn = self._connection(b)
            try:
                r = conn.call(conn.stub.ViewMessageById, request)
            except (QueryNotFoundError, ServiceNotAvailableError):
                continue
            return decode_entries(r.entries, r.entry_positions)[0]
        raise QueryNotFoundError(f"no live broker of {self.router.describe()} holds message {msg_id} (expired, or "
                                 "its broker is down)")

    # ------------------------------------------------------------------------------------------ transactions
    def list_transactions(self, prefix: str = "", status: str = "") -> list[TransactionInfo]:
        """Transactions whose id starts with ``prefix`` (optionally only one status), sorted by id; in a cluster
        ``BrokerTransactionInfo`` rows of every live master (a transaction with halves on several brokers has a
        row on each)."""
        request = pb.ListTransactionsRequest(prefix=prefix, status=status)
        out: list[TransactionInfo] = []
        for name, conn in self._brokers():
            answer = ask_broker(name, conn, "ListTransactions", request)
            out += [transaction(t, self._row_broker(name)) for t in answer.transactions]
        return sorted(out, key=lambda t: (t.transaction_id, getattr(t, "broker_name", "")))

    def end_transaction(
        self, txn_id: str, commit: bool, committed_attempts: list[str] | None = None, *,
        expected_messages: int | None = None, broker: str | None = None, record_unknown: bool = False,
        producer_group: str = "",
    ) -> str:
        """Commit or roll back every half message of ``txn_id`` atomically; returns the final status
        (COMMITTED / ROLLED_BACK), the first outcome when it had ended already. ``committed_attempts``: commit only
        halves whose TRAN_ATTEMPT property is listed. ``expected_messages``: the commit is refused (nothing
        decided) unless it would make exactly this many messages visible. An id the broker has no record of raises
        QueryNotFoundError and records nothing, unless ``record_unknown``: then the outcome of an empty transaction
        is recorded (under ``producer_group``, which needs Pub on it; an id recorded under another group is then
        refused), and halves sent under the id later are refused. The status returned is the first outcome when
        it had ended already: compare it with the decision asked for (a commit of a rolled-back transaction
        answers ROLLED_BACK).

        A cluster: on ``broker``, or on every live master that holds the transaction (QueryNotFoundError when
        none does); ``expected_messages`` counts one broker's messages, so it needs ``broker`` when several hold
        halves. Brokers that end it differently (one had ended it already) raise, naming each outcome."""
        request = pb.EndTransactionRequest(
            transaction_id=txn_id, commit=commit, committed_attempts=committed_attempts or [],
            restrict_attempts=committed_attempts is not None, expected_messages=expected_messages,
            record_unknown=record_unknown, producer_group=producer_group,
        )
        if not self.cluster_mode:
            return self.conn.call(self.stub.EndTransaction, request).status
        if broker is not None:
            holders = [(b.broker_name, self._connection(b)) for b in self._targets(None, broker)]
        else:
            named = {t.broker_name for t in self.list_transactions(txn_id) if t.transaction_id == txn_id
                     and isinstance(t, BrokerTransactionInfo)}
            holders = [(name, conn) for name, conn in self._brokers() if name in named]
        if not holders:
            raise QueryNotFoundError(f"no live broker of {self.router.describe()} holds transaction {txn_id!r}")
        if expected_messages is not None and len(holders) > 1:
            raise InvalidArgumentError(
                f"transaction {txn_id!r} has halves on {len(holders)} brokers and expected_messages counts one "
                "broker's: end it on each with broker= and that broker's count"
            )
        outcomes: dict[str, str] = {}
        for name, conn in holders:
            try:
                outcomes[name] = conn.call(conn.stub.EndTransaction, request).status
            except BrokerError as e:
                raise _on_broker(e, name, sorted(outcomes), f"transaction {txn_id!r} was ended") from None
        if len(set(outcomes.values())) > 1:
            raise BrokerError(
                f"transaction {txn_id!r} ended differently on its brokers: "
                + ", ".join(f"{n}={s}" for n, s in sorted(outcomes.items())),
                ResponseCode.TRANSACTION_FAILED,
            )
        return next(iter(outcomes.values()))

    def end_transactions(self, prefix: str, commit: bool) -> dict[str, str]:
        """End every open transaction whose id starts with ``prefix``; transaction id -> final status (a
        cluster: of every live master; an id whose brokers report different outcomes maps to each, as
        ``broker-a=COMMITTED,broker-b=ROLLED_BACK``)."""
        request = pb.EndTransactionsRequest(prefix=prefix, commit=commit)
        outcomes: dict[str, dict[str, str]] = {}
        for name, conn in self._brokers():
            answer = ask_broker(name, conn, "EndTransactions", request)
            for r in answer.results:
                outcomes.setdefault(r.transaction_id, {})[name] = r.status
        return {
            txn: next(iter(by.values())) if len(set(by.values())) == 1
            else ",".join(f"{n}={s}" for n, s in sorted(by.items()))
            for txn, by in sorted(outcomes.items())
        }

    # ------------------------------------------------------------------------------------------ groups
    def list_groups(self) -> list[GroupInfo]:
        """Every consumer group the broker knows (committed offsets, live consumers or settings), by name; a
        cluster: of every live master, a group's topics united and its live consumers counted on the broker that
        sees most of them (a consumer heartbeats to every broker of its topics)."""
        found: dict[str, GroupInfo] = {}
        for name, conn in self._brokers():
            for g in ask_broker(name, conn, "ListGroups", pb.ListGroupsRequest()).groups:
                known = found.get(g.consumer_group)
                topics = sorted(set(g.topics) | set(known.topics if known else ()))
                online = max(g.online_consumers, known.online_consumers if known else 0)
                found[g.consumer_group] = GroupInfo(g.consumer_group, online, topics)
        return [found[g] for g in sorted(found)]

    def set_consumer_offsets(
        self, group: str, offsets: Mapping[tuple[str, int], int] | Mapping[MessageQueue, int]
    ) -> dict[Any, int]:
        """Store these committed offsets of ``group`` (any direction), each broker's all or nothing; refused while
        the group has live consumers (broker/client/offset_reset.py). Keys are (topic, queue id) with one broker,
        MessageQueues in a cluster. Returns the offsets replaced, keyed alike (-1: none was committed)."""
        by_broker: dict[str, list[tuple[Any, str, int, int]]] = {}
        for key, offset in offsets.items():
            if isinstance(key, MessageQueue):
                topic, broker_name, queue_id = key
            elif self.cluster_mode:
                raise InvalidArgumentError("in a cluster, name each queue as MessageQueue(topic, broker, queue_id)")
            else:
                (topic, queue_id), broker_name = key, DIRECT_BROKER
            by_broker.setdefault(broker_name, []).append((key, topic, queue_id, offset))
        previous: dict[Any, int] = {}
        for broker_name, items in by_broker.items():
            request = pb.ResetConsumerOffsetsRequest(
                consumer_group=group, offsets=[pb.QueueOffset(topic=t, queue_id=q, offset=o) for _, t, q, o in items]
            )
            conn = self.router.broker_connection(items[0][1], broker_name, write=True)
            answer = ask_broker(broker_name, conn, "ResetConsumerOffsets", request)
            for (key, _, _, _), p in zip(items, answer.previous, strict=True):
                previous[key] = p.offset
        return previous

    def reset_offsets(
        self, group: str, topic: str, to: ResetTo, *, queue_id: int | None = None, dry_run: bool = False,
        broker: str | None = None,
    ) -> list[OffsetReset]:
        """Move ``group``'s committed offsets on ``topic`` (every queue, or ``queue_id``; in a cluster, on every
        broker of the topic or on ``broker``) to ``to``: earliest, latest, an offset or a time
        (broker/client/offset_reset.py). Refused while the group has live consumers. ``dry_run``: only say what
        would be set."""
        if not self.cluster_mode:
            return self._reset_on(self, group, topic, to, queue_id, dry_run, DIRECT_BROKER)
        out: list[OffsetReset] = []
        for name in self._route(topic).broker_names:
            if broker is not None and name != broker:
                continue
            address = self.router.broker_connection(topic, name, write=True).endpoint
            # the broker's own admin, with this one's TLS and credentials (an --auth broker refuses anyone else)
            router = Router(address, timeout_s=self.router.timeout_s, tls=self.router.tls,
                            credentials=self.router.credentials)
            try:
                one = Admin(router=router)
                out += one._reset_on(one, group, topic, to, queue_id, dry_run, name)
            finally:
                router.close()
        if broker is not None and not out:
            raise InvalidArgumentError(f"broker {broker!r} holds no queue of topic {topic!r}")
        return out

    @staticmethod
    def _reset_on(admin: Admin, group: str, topic: str, to: ResetTo, queue_id: int | None, dry_run: bool,
                  broker_name: str) -> list[OffsetReset]:
        plan = plan_reset(admin, topic, to, queue_id)
        if dry_run:
            committed = admin.committed_offsets(group, topic)
            previous = {(topic, q): committed.get(q, -1) for q in plan}
        else:
            previous = admin.set_consumer_offsets(group, {(topic, q): target for q, (target, _, _) in plan.items()})
        return [OffsetReset(topic, q, previous[(topic, q)], target, lo, hi, broker_name)
                for q, (target, lo, hi) in plan.items()]

    def subscription_group(self, group_name: str, *, broker: str | None = None) -> SubscriptionGroup:
        """A group's settings; a cluster: as ``broker`` (or the first live master, by name, that answers) holds
        them."""
        request = pb.GetSubscriptionGroupRequest(consumer_group=group_name)
        if not self.cluster_mode:
            return group(self.conn.call(self.stub.GetSubscriptionGroup, request))
        masters = self._targets(None, broker) if broker is not None else self.cluster_info().masters()
        last: BrokerError | None = None
        for b in masters:
            conn = self._connection(b)
            try:
                return group(conn.call(conn.stub.GetSubscriptionGroup, request))
            except ServiceNotAvailableError as e:
                last = with_broker(e, b.broker_name)
        raise last or ServiceNotAvailableError(f"no live master in {self.router.describe()}")

    def update_subscription_group(
        self, group_name: str, *, consume_enable: bool | None = None, consume_from_min_enable: bool | None = None,
        consume_broadcast_enable: bool | None = None, retry_queue_nums: int | None = None,
        retry_max_times: int | None = None, consume_message_orderly: bool | None = None, cluster: str | None = None,
        broker: str | None = None,
    ) -> SubscriptionGroup:
        """Change the given settings of a group (kept in each broker's config/subscriptionGroup.json); a cluster:
        on every master of ``cluster`` (of the only one when neither is named) or on ``broker``."""
        changes: dict[str, Any] = {
            "consume_enable": consume_enable, "consume_from_min_enable": consume_from_min_enable,
            "consume_broadcast_enable": consume_broadcast_enable, "retry_queue_nums": retry_queue_nums,
            "retry_max_times": retry_max_times, "consume_message_orderly": consume_message_orderly,
        }
        request = pb.UpdateSubscriptionGroupRequest(
            consumer_group=group_name, **{k: v for k, v in changes.items() if v is not None}
        )
        if not self.cluster_mode:
            return group(self.conn.call(self.stub.UpdateSubscriptionGroup, request))
        done: list[str] = []
        result: SubscriptionGroup | None = None
        for b in self._targets(cluster, broker):
            conn = self._connection(b)
            try:
                result = group(conn.call(conn.stub.UpdateSubscriptionGroup, request))
            except BrokerError as e:
                raise _on_broker(e, b.broker_name, done, f"group {group_name!r} was updated") from None
            done.append(b.broker_name)
        assert result is not None
        return result

    # ------------------------------------------------------------------------------------------ stats
    def stats(self, broker: str | None = None) -> dict[str, int | float]:
        """The broker's counters (``sluice stats``; counts are ints: the wire carries every value as a double); in a
        cluster those of the master ``broker``."""
        if not self.cluster_mode:
            if broker:
                raise InvalidArgumentError(f"broker= names a broker of a cluster; this admin talks to the single "
                                           f"{self.router.describe()}")
            return _numbers(self.conn.call(self.stub.GetBrokerStats, pb.GetBrokerStatsRequest()).values)
        if broker is None:
            raise InvalidArgumentError("in a cluster, name the broker (stats(broker=...)) or use stats_by_broker()")
        (b,) = self._targets(None, broker)
        conn = self._connection(b)
        return _numbers(ask_broker(b.broker_name, conn, "GetBrokerStats", pb.GetBrokerStatsRequest()).values)

    def stats_by_broker(self) -> dict[str, dict[str, int | float]]:
        """Every live master's counters, by broker name (``""`` for the one broker of ``endpoint=``)."""
        out: dict[str, dict[str, int | float]] = {}
        for name, conn in self._brokers():
            out[name] = _numbers(ask_broker(name, conn, "GetBrokerStats", pb.GetBrokerStatsRequest()).values)
        return out


def _on_broker(e: BrokerError, broker_name: str, done: list[str], what: str) -> BrokerError:
    """A change made on several brokers failed at ``broker_name`` after ``done``: say where it was done."""
    failed = with_broker(e, broker_name)
    if not done:
        return failed
    return BrokerError(f"{what} on {', '.join(done)}, but not on {broker_name}: {e.message}", e.code)


def _numbers(values: Mapping[str, float]) -> dict[str, int | float]:
    return {k: int(v) if v.is_integer() else v for k, v in values.items()}
