"""Admin: topics, queue offsets, consumer lag and groups, message queries, broker stats."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.client.connection import Connection
from broker.client.message import decode_entries
from broker.client.offset_reset import OffsetReset, ResetTo, plan_reset
from broker.client.results import ReceivedMessage
from broker.errors import InvalidArgumentError
from broker.proto import sluice_pb2 as pb


@dataclass(frozen=True)
class TopicInfo:
    topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int


@dataclass(frozen=True)
class QueueLag:
    topic: str
    queue_id: int
    broker_offset: int
    consumer_offset: int  # -1: nothing committed
    lag: int


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


def _transaction(t: pb.TransactionInfo) -> TransactionInfo:
    return TransactionInfo(t.transaction_id, t.producer_group, t.status, t.half_count, t.first_store_ms,
                           t.last_activity_ms, t.check_times, t.ended_ms, t.complete)  # fmt: skip


def _group(g: pb.SubscriptionGroup) -> SubscriptionGroup:
    return SubscriptionGroup(g.group_name, g.consume_enable, g.consume_from_min_enable, g.consume_broadcast_enable,
                             g.retry_queue_nums, g.retry_max_times)  # fmt: skip


def _topic(t: pb.TopicInfo) -> TopicInfo:
    return TopicInfo(t.topic, t.read_queue_nums, t.write_queue_nums, t.perm)


class Admin:
    def __init__(self, endpoint: str | None = None, *, timeout_s: float = 30.0) -> None:
        self.conn = Connection(endpoint, timeout_s)
        self.stub = self.conn.stub

    def create_topic(self, topic: str, queues: int = 8, *, if_not_exists: bool = False) -> TopicInfo:
        if queues < 1:  # on the wire 0 means "the broker's default": a 0 here is a mistake, not a request for 8
            raise InvalidArgumentError(f"queues={queues}: a topic needs at least one queue")
        request = pb.CreateTopicRequest(topic=topic, queue_nums=queues, if_not_exists=if_not_exists)
        return _topic(self.conn.call(self.stub.CreateTopic, request))

    def delete_topic(self, topic: str) -> None:
        self.conn.call(self.stub.DeleteTopic, pb.DeleteTopicRequest(topic=topic))

    def list_topics(self) -> list[TopicInfo]:
        return [_topic(t) for t in self.conn.call(self.stub.ListTopics, pb.ListTopicsRequest()).topics]

    def topic_info(self, topic: str) -> TopicInfo:
        return _topic(self.conn.call(self.stub.GetTopicRoute, pb.GetTopicRouteRequest(topic=topic)))

    def queue_offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """Queue id -> (min offset, max offset) for every queue of the topic, in one call."""
        response = self.conn.call(self.stub.GetQueueOffsets, pb.GetQueueOffsetsRequest(topic=topic))
        return {q.queue_id: (q.min_offset, q.max_offset) for q in response.queues}

    def search_offset_by_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        request = pb.SearchOffsetByTimestampRequest(topic=topic, queue_id=queue_id, timestamp_ms=timestamp_ms)
        return self.conn.call(self.stub.SearchOffsetByTimestamp, request).offset

    def consumer_lag(self, group: str, topic: str = "") -> list[QueueLag]:
        response = self.conn.call(self.stub.GetConsumerLag, pb.GetConsumerLagRequest(consumer_group=group, topic=topic))
        return [QueueLag(q.topic, q.queue_id, q.broker_offset, q.consumer_offset, q.lag) for q in response.queues]

    def consumer_list(self, group: str) -> list[str]:
        return list(
            self.conn.call(self.stub.GetConsumerList, pb.GetConsumerListRequest(consumer_group=group)).client_ids
        )

    def committed_offsets(self, group: str, topic: str) -> dict[int, int]:
        request = pb.QueryConsumerOffsetRequest(consumer_group=group, topic=topic, queue_id=-1)
        return {o.queue_id: o.offset for o in self.conn.call(self.stub.QueryConsumerOffset, request).offsets}

    def query_by_key(
        self, topic: str, key: str, max_num: int = 64, begin_ms: int = 0, end_ms: int = 0
    ) -> list[ReceivedMessage]:
        request = pb.QueryMessageByKeyRequest(
            topic=topic, key=key, max_num=max_num, begin_timestamp_ms=begin_ms, end_timestamp_ms=end_ms
        )
        r = self.conn.call(self.stub.QueryMessageByKey, request)
        return decode_entries(r.entries, r.entry_positions)

    def view_message(self, msg_id: str) -> ReceivedMessage:
        r = self.conn.call(self.stub.ViewMessageById, pb.ViewMessageByIdRequest(msg_id=msg_id))
        return decode_entries(r.entries, r.entry_positions)[0]

    # ------------------------------------------------------------------------------------------ transactions
    def list_transactions(self, prefix: str = "", status: str = "") -> list[TransactionInfo]:
        """Transactions whose id starts with ``prefix`` (optionally only one status), sorted by id."""
        request = pb.ListTransactionsRequest(prefix=prefix, status=status)
        return [_transaction(t) for t in self.conn.call(self.stub.ListTransactions, request).transactions]

    def end_transaction(
        self, txn_id: str, commit: bool, committed_attempts: list[str] | None = None, *,
        expected_messages: int | None = None, record_unknown: bool = False,
    ) -> str:  # fmt: skip
        """Commit or roll back every half message of ``txn_id`` atomically; returns the final status
        (COMMITTED / ROLLED_BACK), the first outcome when it had ended already (compare it with the decision asked
        for: a commit of a rolled-back transaction answers ROLLED_BACK). ``committed_attempts``: commit only
        halves whose TRAN_ATTEMPT property is listed. ``expected_messages``: the commit is refused (nothing
        decided) unless it would make exactly this many messages visible. An id the broker has no record of raises
        QueryNotFoundError and records nothing, unless ``record_unknown``: then the outcome of an empty transaction
        is recorded, and halves sent under the id later are refused."""
        request = pb.EndTransactionRequest(
            transaction_id=txn_id, commit=commit, committed_attempts=committed_attempts or [],
            restrict_attempts=committed_attempts is not None, expected_messages=expected_messages,
            record_unknown=record_unknown,
        )  # fmt: skip
        return self.conn.call(self.stub.EndTransaction, request).status

    def end_transactions(self, prefix: str, commit: bool) -> dict[str, str]:
        """End every open transaction whose id starts with ``prefix``; transaction id -> final status."""
        request = pb.EndTransactionsRequest(prefix=prefix, commit=commit)
        return {r.transaction_id: r.status for r in self.conn.call(self.stub.EndTransactions, request).results}

    # ------------------------------------------------------------------------------------------ groups
    def subscription_group(self, group: str) -> SubscriptionGroup:
        request = pb.GetSubscriptionGroupRequest(consumer_group=group)
        return _group(self.conn.call(self.stub.GetSubscriptionGroup, request))

    def update_subscription_group(
        self, group: str, *, consume_enable: bool | None = None, consume_from_min_enable: bool | None = None,
        consume_broadcast_enable: bool | None = None, retry_queue_nums: int | None = None,
        retry_max_times: int | None = None,
    ) -> SubscriptionGroup:  # fmt: skip
        """Change the given settings of a group (kept in the broker's config/subscriptionGroup.json)."""
        changes: dict[str, Any] = {
            "consume_enable": consume_enable, "consume_from_min_enable": consume_from_min_enable,
            "consume_broadcast_enable": consume_broadcast_enable, "retry_queue_nums": retry_queue_nums,
            "retry_max_times": retry_max_times,
        }  # fmt: skip
        request = pb.UpdateSubscriptionGroupRequest(
            consumer_group=group, **{k: v for k, v in changes.items() if v is not None}
        )
        return _group(self.conn.call(self.stub.UpdateSubscriptionGroup, request))

    def list_groups(self) -> list[GroupInfo]:
        """Every consumer group the broker knows (committed offsets, live consumers or settings), by name."""
        response = self.conn.call(self.stub.ListGroups, pb.ListGroupsRequest())
        return [GroupInfo(g.consumer_group, g.online_consumers, list(g.topics)) for g in response.groups]

    def set_consumer_offsets(self, group: str, offsets: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """Store these committed offsets of ``group`` (any direction), all or nothing; refused while the group has
        live consumers (broker/client/offset_reset.py). Returns the offsets replaced (-1: none was committed)."""
        keys = list(offsets)
        request = pb.ResetConsumerOffsetsRequest(
            consumer_group=group, offsets=[pb.QueueOffset(topic=t, queue_id=q, offset=offsets[(t, q)]) for t, q in keys]
        )
        previous = self.conn.call(self.stub.ResetConsumerOffsets, request).previous
        return {(p.topic, p.queue_id): p.offset for p in previous}

    def reset_offsets(
        self, group: str, topic: str, to: ResetTo, *, queue_id: int | None = None, dry_run: bool = False
    ) -> list[OffsetReset]:
        """Move ``group``'s committed offsets on ``topic`` (every queue, or ``queue_id``) to ``to``: earliest,
        latest, an offset or a time (broker/client/offset_reset.py). Refused while the group has live consumers.
        ``dry_run``: only say what would be set."""
        plan = plan_reset(self, topic, to, queue_id)
        if dry_run:
            committed = self.committed_offsets(group, topic)
            previous = {(topic, q): committed.get(q, -1) for q in plan}
        else:
            previous = self.set_consumer_offsets(group, {(topic, q): target for q, (target, _, _) in plan.items()})
        return [OffsetReset(topic, q, previous[(topic, q)], target, lo, hi) for q, (target, lo, hi) in plan.items()]

    def stats(self) -> dict[str, int | float]:
        """Broker statistics by name; counts are ints (the wire carries every value as a double)."""
        values = self.conn.call(self.stub.GetBrokerStats, pb.GetBrokerStatsRequest()).values
        return {k: int(v) if v.is_integer() else v for k, v in values.items()}

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
