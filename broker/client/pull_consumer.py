"""PullConsumer: the application chooses queues and offsets; the broker that owns a queue keeps the group's
committed offset for it.

A queue is ``MessageQueue(topic, broker_name, queue_id)`` (``fetch_queues`` lists a topic's readable queues over
every broker); with one broker (``endpoint=``) the broker name is ``""`` and the older forms that take a topic and
a queue id work as well: ``pull(topic, queue_id, offset)``, ``committed_offsets(topic) -> {queue_id: offset}``.
In a cluster (``namesrv=``) ``committed_offsets`` and ``queue_offsets`` are keyed by ``(broker_name, queue_id)``,
and a commit of queues on several brokers is stored by each broker all or nothing, broker by broker.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from broker.client.connection import Connection
from broker.client.outgoing_message import decode_entries
from broker.client.results import PullResult, PullStatus, RawPullResult, ReceivedMessage
from broker.client.route import DIRECT_BROKER, MessageQueue
from broker.client.router import Router, RouterClient
from broker.errors import InvalidArgumentError, TopicNotExistError
from broker.format.subscription import parse_tags, tag_matches
from broker.proto import sluice_pb2 as pb

# A held pull's gRPC deadline is its suspend timeout plus this much, so the broker answers first.
PULL_DEADLINE_MARGIN_S = 10.0
BrokerQueue = tuple[str, int]  # (broker name, queue id)


class PullConsumer(RouterClient):
    def __init__(
        self, endpoint: str | None = None, group: str = "DEFAULT_CONSUMER", *, namesrv: str | None = None,
        timeout_s: float = 30.0, router: Router | None = None,
        tls_ca: str | None = None, tls_cert: str | None = None, tls_key: str | None = None,
        access_key: str | None = None, secret_key: str | None = None,
    ) -> None:
        super().__init__(endpoint, namesrv, timeout_s, router, tls_ca, tls_cert, tls_key, access_key, secret_key)
        self.group = group

    @property
    def conn(self) -> Connection:
        """The broker's connection, for a consumer of one broker (``endpoint=``)."""
        return self.router.direct

    def _queue(self, target: MessageQueue | str, args: tuple[Any, ...]) -> tuple[MessageQueue, tuple[Any, ...]]:
        """``pull(mq, offset, ...)`` or ``pull(topic, queue_id, offset, ...)`` -> (queue, the rest)."""
        if isinstance(target, MessageQueue):
            return target, args
        if not args:
            raise InvalidArgumentError(
                "name the queue: pull(MessageQueue(...), offset) or pull(topic, queue_id, offset)"
            )
        if self.router.cluster_mode:
            raise InvalidArgumentError(
                "a topic and a bare queue id are ambiguous in a cluster: pull(MessageQueue(topic, broker, id), offset)"
                " (fetch_queues(topic) lists them)"
            )
        return MessageQueue(target, DIRECT_BROKER, int(args[0])), args[1:]

    def fetch_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues over every broker, in route order."""
        return self.router.route(topic).read_queues()

    def _request(
        self, mq: MessageQueue, offset: int, max_msgs: int, timeout_ms: int, tags: str, max_bytes: int | None,
        commit_offset: int | None, sql: str | None = None,
    ) -> pb.PullResponse:
        request = pb.PullRequest(
            consumer_group=self.group, topic=mq.topic, queue_id=mq.queue_id, queue_offset=offset, max_msgs=max_msgs,
            max_bytes=max_bytes or 0, suspend_timeout_ms=timeout_ms, tag_expression=tags if sql is None else sql,
            commit_offset=-1 if commit_offset is None else commit_offset, expression_type="TAG" if sql is None else
            "SQL92",
        )
        deadline_s = timeout_ms / 1000 + PULL_DEADLINE_MARGIN_S
        conn = self.router.queue_connection(mq)
        try:
            response: pb.PullResponse = conn.call(conn.stub.PullMessage, request, timeout_s=deadline_s)
        except TopicNotExistError:
            self.router.refresh(mq.topic)
            raise
        return response

    def pull_raw(self, target: MessageQueue | str, *args: Any, max_msgs: int = 32, timeout_ms: int = 0,
                 tags: str = "*", max_bytes: int | None = None, commit_offset: int | None = None) -> RawPullResult:
        """Entries exactly as stored (broker tag-hash filter only; no exact tag check). ``pull_raw(mq, offset)`` or
        ``pull_raw(topic, queue_id, offset)``; further positional arguments: max_msgs, timeout_ms."""
        mq, rest = self._queue(target, args)
        offset, max_msgs, timeout_ms = _positional(rest, max_msgs, timeout_ms)
        r = self._request(mq, offset, max_msgs, timeout_ms, tags, max_bytes, commit_offset)
        return RawPullResult(
            PullStatus[pb.PullStatus.Name(r.status)], r.entries, list(r.entry_positions), r.next_begin_offset,
            r.min_offset, r.max_offset,
        )

    def pull(self, target: MessageQueue | str, *args: Any, max_msgs: int = 32, timeout_ms: int = 0, tags: str = "*",
             max_bytes: int | None = None, commit_offset: int | None = None, sql: str | None = None) -> PullResult:
        """Decoded messages; messages whose tag only collided with the filter's hash are dropped here.
        ``pull(mq, offset)`` or ``pull(topic, queue_id, offset)``; further positional arguments: max_msgs,
        timeout_ms.

        ``sql``: an SQL92 selector over the properties instead of ``tags``, evaluated on the broker (a bad one
        raises SubscriptionParseError naming the column of the error)."""
        mq, rest = self._queue(target, args)
        offset, max_msgs, timeout_ms = _positional(rest, max_msgs, timeout_ms)
        wanted = parse_tags(tags) if sql is None else None
        r = self._request(mq, offset, max_msgs, timeout_ms, tags, max_bytes, commit_offset, sql)
        entries = r.entries  # one copy of the answer out of the response, not one a read
        messages = decode_entries(entries, r.entry_positions) if entries else []
        status = PullStatus[pb.PullStatus.Name(r.status)]
        if wanted is not None:  # "*" needs no check, and no message's properties decoded for it
            # in place: the list decode_entries returns is how its messages decode a group of fields all at once
            messages[:] = [m for m in messages if tag_matches(wanted, m.tags)]
            if status is PullStatus.FOUND and not messages:  # only hash collisions came back, as RocketMQ
                status = PullStatus.NO_MATCHED_MSG
        return PullResult(status, messages, r.next_begin_offset, r.min_offset, r.max_offset)

    def send_back(
        self, msg: ReceivedMessage, delay_level: int = 0, max_reconsume_times: int = -1, *, broker_name: str = ""
    ) -> pb.ConsumerSendMsgBackResponse:
        """Hand a message this group failed to process back to the broker that holds it (``broker_name``, in a
        cluster): it comes again later through ``%RETRY%{group}`` (delay level 3 + reconsume times when 0), or goes
        to ``%DLQ%{group}`` once reconsumed ``max_reconsume_times`` times (< 0: the group's retryMaxTimes, 16 by
        default)."""
        conn = self.router.broker_connection(msg.topic, broker_name, write=True)
        return send_back(conn, self.group, msg, delay_level, max_reconsume_times)

    # ------------------------------------------------------------------------------------------------ offsets
    def commit_offsets(self, offsets: Mapping[MessageQueue, int] | Mapping[tuple[str, int], int]) -> None:
        """Store each queue's next offset to consume. Queues are MessageQueues (or, with one broker, (topic, queue
        id) pairs); each broker stores its queues' offsets all or nothing."""
        by_broker: dict[str, list[tuple[MessageQueue, int]]] = defaultdict(list)
        for key, offset in offsets.items():
            mq = key if isinstance(key, MessageQueue) else self._queue(key[0], (key[1],))[0]
            by_broker[mq.broker_name].append((mq, offset))
        for broker_name, items in by_broker.items():
            request = pb.UpdateConsumerOffsetsRequest(
                consumer_group=self.group,
                offsets=[pb.QueueOffset(topic=mq.topic, queue_id=mq.queue_id, offset=o) for mq, o in items],
            )
            conn = self.router.broker_connection(items[0][0].topic, broker_name, write=True)
            conn.call(conn.stub.UpdateConsumerOffsets, request)

    def committed_offsets(self, topic: str, *, by_queue: bool = False) -> dict[Any, int]:
        """The group's committed offsets of ``topic``, only for queues it has committed: ``{queue_id: offset}`` with
        one broker, ``{(broker_name, queue_id): offset}`` in a cluster, ``{MessageQueue: offset}`` with
        ``by_queue=True``."""
        found = self.committed_by_queue(topic)
        return found if by_queue else {self._short_key(mq): offset for mq, offset in found.items()}

    def _short_key(self, mq: MessageQueue) -> Any:
        """The queue id with one broker; (broker name, queue id) in a cluster."""
        return (mq.broker_name, mq.queue_id) if self.router.cluster_mode else mq.queue_id

    def committed_by_queue(self, topic: str) -> dict[MessageQueue, int]:
        out: dict[MessageQueue, int] = {}
        request = pb.QueryConsumerOffsetRequest(consumer_group=self.group, topic=topic, queue_id=-1)
        for broker_name in self.router.route(topic).broker_names:
            conn = self.router.broker_connection(topic, broker_name, write=False)
            for o in conn.call(conn.stub.QueryConsumerOffset, request).offsets:
                out[MessageQueue(topic, broker_name, o.queue_id)] = o.offset
        return out

    def queue_offsets(self, topic: str) -> dict[Any, tuple[int, int]]:
        """(min, max) offset of each queue: ``{queue_id: ...}`` with one broker, ``{(broker_name, queue_id): ...}``
        in a cluster."""
        return {self._short_key(mq): r for mq, r in self.queue_ranges(topic).items()}

    def queue_ranges(self, topic: str) -> dict[MessageQueue, tuple[int, int]]:
        """(min, max) offset of every queue of ``topic`` on every broker that holds it."""
        out: dict[MessageQueue, tuple[int, int]] = {}
        for broker_name in self.router.route(topic).broker_names:
            conn = self.router.broker_connection(topic, broker_name, write=False)
            response = conn.call(conn.stub.GetQueueOffsets, pb.GetQueueOffsetsRequest(topic=topic))
            for q in response.queues:
                out[MessageQueue(topic, broker_name, q.queue_id)] = (q.min_offset, q.max_offset)
        return out


def _positional(rest: tuple[Any, ...], max_msgs: int, timeout_ms: int) -> tuple[int, int, int]:
    """(offset, max_msgs, timeout_ms) from the positional arguments after the queue (offset required)."""
    if not rest:
        raise InvalidArgumentError("pull needs an offset")
    if len(rest) > 3:
        raise InvalidArgumentError("pull takes at most offset, max_msgs, timeout_ms positionally")
    offset = int(rest[0])
    if len(rest) > 1:
        max_msgs = int(rest[1])
    if len(rest) > 2:
        timeout_ms = int(rest[2])
    return offset, max_msgs, timeout_ms


def send_back(
    conn: Connection, group: str, msg: ReceivedMessage, delay_level: int = 0, max_reconsume_times: int = -1
) -> pb.ConsumerSendMsgBackResponse:
    """ConsumerSendMsgBack by commit-log offset, keeping the first message's id as ORIGIN_MESSAGE_ID."""
    origin = msg.properties.get("ORIGIN_MESSAGE_ID") or msg.msg_id
    request = pb.ConsumerSendMsgBackRequest(
        consumer_group=group, commitlog_offset=msg.commitlog_offset, delay_level=delay_level,
        max_reconsume_times=max_reconsume_times, origin_msg_id=origin,
    )
    return conn.call(conn.stub.ConsumerSendMsgBack, request)
