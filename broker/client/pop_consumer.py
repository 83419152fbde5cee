"""PopConsumer: the third way to consume, beside PullConsumer and PushConsumer (RocketMQ 5's pop model).

The broker decides what each consumer gets: ``receive`` returns messages of a topic that no other consumer of the
group holds now, each invisible to the group for ``invisible_ms``; ``ack`` ends one, ``change_invisible`` gives one
more (or less) time, and a message neither acked nor renewed in time is delivered again, with its delivery
attempt + 1, until the group's retryMaxTimes + 1 attempts, after which it goes to ``%DLQ%{group}``. No offsets, no
queue assignment: any number of consumers of a group share a topic (broker/semantics/pop.py has the details).

    with PopConsumer("127.0.0.1:10911", "orders") as consumer:
        for m in consumer.receive("Orders", max_msgs=32, invisible_ms=30_000, wait_ms=5_000):
            handle(m.message)
            consumer.ack(m)

One broker per consumer (``endpoint=``); receipt handles are only valid at the broker that issued them (in a
replicated group: at its group's master, also one promoted since).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.client.connection import Connection
from broker.client.credentials import Credentials
from broker.client.outgoing_message import decode_entries
from broker.client.results import ReceivedMessage
from broker.client.tls import TlsSettings
from broker.errors import InvalidArgumentError, InvalidReceiptHandleError
from broker.proto import sluice_pb2 as pb

DEADLINE_MARGIN_S = 10.0  # a held receive's gRPC deadline is its wait plus this, so the broker answers first


@dataclass
class PoppedMessage:
    message: ReceivedMessage
    receipt_handle: str  # what ack / change_invisible take; replaced by change_invisible
    delivery_attempt: int  # from 1
    invisible_until_ms: int  # the broker's clock: delivered again after this unless acked

    @property
    def topic(self) -> str:
        return self.message.topic


class PopConsumer:
    def __init__(
        self, endpoint: str | None = None, group: str = "DEFAULT_CONSUMER", *, timeout_s: float = 30.0,
        tls_ca: str | None = None, tls_cert: str | None = None, tls_key: str | None = None,
        access_key: str | None = None, secret_key: str | None = None,
    ) -> None:
        self.conn = Connection(endpoint, timeout_s, TlsSettings.of(tls_ca, tls_cert, tls_key),
                               Credentials.of(access_key, secret_key))
        self.group = group

    def receive(
        self, topic: str, max_msgs: int = 32, invisible_ms: int = 30_000, wait_ms: int = 0, *, tags: str = "*",
        sql: str | None = None, queue_id: int = -1,
    ) -> list[PoppedMessage]:
        """Up to ``max_msgs`` messages (any queue of the topic unless ``queue_id``); waits up to ``wait_ms`` when
        none is there. ``sql``: an SQL92 selector over properties instead of ``tags``."""
        if max_msgs <= 0 or invisible_ms <= 0 or wait_ms < 0:
            raise InvalidArgumentError("max_msgs and invisible_ms must be > 0, wait_ms >= 0")
        request = pb.PopRequest(
            consumer_group=self.group, topic=topic, queue_id=queue_id, max_msgs=max_msgs,
            invisible_time_ms=invisible_ms, poll_time_ms=wait_ms, expression=tags if sql is None else sql,
            expression_type="TAG" if sql is None else "SQL92",
        )
        r = self.conn.call(self.conn.stub.PopMessage, request, timeout_s=wait_ms / 1000 + DEADLINE_MARGIN_S)
        messages = decode_entries(r.entries, r.entry_positions) if r.entries else []
        return [PoppedMessage(m, h, a, u) for m, h, a, u in
                zip(messages, r.receipt_handles, r.delivery_attempts, r.invisible_until_ms, strict=True)]

    def ack(self, popped: PoppedMessage) -> None:
        """InvalidReceiptHandleError when the delivery is over (expired, acked, superseded)."""
        self.ack_all([popped])

    def ack_all(self, popped: list[PoppedMessage]) -> None:
        """Ack each; InvalidReceiptHandleError naming the first refused one (the others are acked)."""
        if not popped:
            return
        by_topic: dict[str, list[PoppedMessage]] = {}
        for p in popped:
            by_topic.setdefault(p.topic, []).append(p)
        failures = []
        for topic, items in by_topic.items():
            request = pb.AckMessageRequest(consumer_group=self.group, topic=topic,
                                           receipt_handles=[p.receipt_handle for p in items])
            errors = self.conn.call(self.conn.stub.AckMessage, request).errors
            failures += [f"{p.message.msg_id}: {e}" for p, e in zip(items, errors, strict=True) if e]
        if failures:
            raise InvalidReceiptHandleError(f"{len(failures)} of {len(popped)} not acked; first: {failures[0]}")

    def change_invisible(self, popped: PoppedMessage, invisible_ms: int) -> PoppedMessage:
        """Invisible for ``invisible_ms`` from now; updates ``popped`` with its new handle and returns it."""
        request = pb.ChangeInvisibleTimeRequest(consumer_group=self.group, topic=popped.topic,
                                                receipt_handle=popped.receipt_handle, invisible_time_ms=invisible_ms)
        r = self.conn.call(self.conn.stub.ChangeInvisibleTime, request)
        popped.receipt_handle, popped.invisible_until_ms = r.receipt_handle, r.invisible_until_ms
        return popped

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> PopConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
