"""PullConsumer: the application chooses queues and offsets; the broker keeps committed offsets per group."""

from __future__ import annotations

from collections.abc import Mapping

from broker.client.connection import Connection
from broker.client.message import decode_entries
from broker.client.results import PullResult, PullStatus, RawPullResult, ReceivedMessage
from broker.proto import sluice_pb2 as pb
from broker.proto.subscription import parse_tags, tag_matches

# A held pull's gRPC deadline is its suspend timeout plus this much, so the broker answers first.
PULL_DEADLINE_MARGIN_S = 10.0


class PullConsumer:
    def __init__(
        self, endpoint: str | None = None, group: str = "DEFAULT_CONSUMER", *, timeout_s: float = 30.0
    ) -> None:
        self.conn = Connection(endpoint, timeout_s)
        self.group = group

    def _request(
        self, topic: str, queue_id: int, offset: int, max_msgs: int, timeout_ms: int, tags: str,
        max_bytes: int | None, commit_offset: int | None, sql: str | None = None,
    ) -> pb.PullResponse:  # fmt: skip
        request = pb.PullRequest(
            consumer_group=self.group, topic=topic, queue_id=queue_id, queue_offset=offset, max_msgs=max_msgs,
            max_bytes=max_bytes or 0, suspend_timeout_ms=timeout_ms, tag_expression=tags if sql is None else sql,
            commit_offset=-1 if commit_offset is None else commit_offset, expression_type="TAG" if sql is None else
            "SQL92",
        )  # fmt: skip
        deadline_s = timeout_ms / 1000 + PULL_DEADLINE_MARGIN_S
        return self.conn.call(self.conn.stub.PullMessage, request, timeout_s=deadline_s)

    def pull_raw(
        self, topic: str, queue_id: int, offset: int, max_msgs: int = 32, timeout_ms: int = 0, tags: str = "*",
        max_bytes: int | None = None, commit_offset: int | None = None,
    ) -> RawPullResult:  # fmt: skip
        """Entries exactly as stored (broker tag-hash filter only; no exact tag check)."""
        r = self._request(topic, queue_id, offset, max_msgs, timeout_ms, tags, max_bytes, commit_offset)
        return RawPullResult(
            PullStatus[pb.PullStatus.Name(r.status)], r.entries, list(r.entry_positions), r.next_begin_offset,
            r.min_offset, r.max_offset,
        )  # fmt: skip

    def pull(
        self, topic: str, queue_id: int, offset: int, max_msgs: int = 32, timeout_ms: int = 0, tags: str = "*",
        max_bytes: int | None = None, commit_offset: int | None = None, sql: str | None = None,
    ) -> PullResult:  # fmt: skip
        """Decoded messages; messages whose tag only collided with the filter's hash are dropped here.

        ``sql``: an SQL92 selector over the properties instead of ``tags``, evaluated on the broker (a bad one
        raises SubscriptionParseError naming the column of the error)."""
        wanted = parse_tags(tags) if sql is None else None
        r = self._request(topic, queue_id, offset, max_msgs, timeout_ms, tags, max_bytes, commit_offset, sql)
        messages = decode_entries(r.entries, r.entry_positions) if r.entries else []
        status = PullStatus[pb.PullStatus.Name(r.status)]
        if wanted is not None:
            messages = [m for m in messages if tag_matches(wanted, m.tags)]
            if status is PullStatus.FOUND and not messages:  # only hash collisions came back, as RocketMQ
                status = PullStatus.NO_MATCHED_MSG
        return PullResult(status, messages, r.next_begin_offset, r.min_offset, r.max_offset)

    def send_back(
        self, msg: ReceivedMessage, delay_level: int = 0, max_reconsume_times: int = -1
    ) -> pb.ConsumerSendMsgBackResponse:
        """Hand a message this group failed to process back to the broker: it comes again later through
        ``%RETRY%{group}`` (delay level 3 + reconsume times when 0), or goes to ``%DLQ%{group}`` once reconsumed
        ``max_reconsume_times`` times (< 0: the group's retryMaxTimes, 16 by default)."""
        return send_back(self.conn, self.group, msg, delay_level, max_reconsume_times)

    def commit_offsets(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Store every (topic, queue) -> next offset to consume, all or nothing."""
        request = pb.UpdateConsumerOffsetsRequest(
            consumer_group=self.group,
            offsets=[pb.QueueOffset(topic=t, queue_id=q, offset=o) for (t, q), o in offsets.items()],
        )
        self.conn.call(self.conn.stub.UpdateConsumerOffsets, request)

    def committed_offsets(self, topic: str) -> dict[int, int]:
        """Queue id -> committed offset, only for queues this group has committed."""
        request = pb.QueryConsumerOffsetRequest(consumer_group=self.group, topic=topic, queue_id=-1)
        response = self.conn.call(self.conn.stub.QueryConsumerOffset, request)
        return {o.queue_id: o.offset for o in response.offsets}

    def queue_offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        response = self.conn.call(self.conn.stub.GetQueueOffsets, pb.GetQueueOffsetsRequest(topic=topic))
        return {q.queue_id: (q.min_offset, q.max_offset) for q in response.queues}

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> PullConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def send_back(
    conn: Connection, group: str, msg: ReceivedMessage, delay_level: int = 0, max_reconsume_times: int = -1
) -> pb.ConsumerSendMsgBackResponse:
    """ConsumerSendMsgBack by commit-log offset, keeping the first message's id as ORIGIN_MESSAGE_ID."""
    origin = msg.properties.get("ORIGIN_MESSAGE_ID") or msg.msg_id
    request = pb.ConsumerSendMsgBackRequest(
        consumer_group=group, commitlog_offset=msg.commitlog_offset, delay_level=delay_level,
        max_reconsume_times=max_reconsume_times, origin_msg_id=origin,
    )  # fmt: skip
    return conn.call(conn.stub.ConsumerSendMsgBack, request)
