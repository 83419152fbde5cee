"""The apache.rocketmq.v2 service spoken to directly (raw stubs): statuses, refusals and answers the official
clients rely on, and the bad requests they never send."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2, timestamp_pb2
from rmqv2_helpers import name, new_topic
from rocketmq.grpc_protocol import definition_pb2 as v2
from rocketmq.grpc_protocol import service_pb2 as v2s
from rocketmq.grpc_protocol import service_pb2_grpc as v2g

from broker.client import Admin, Message, Producer

HEADERS = (("x-mq-client-id", "raw-test-client"),)


@pytest.fixture
def stub(endpoint: str) -> Iterator[Any]:
    with grpc.insecure_channel(endpoint) as channel:
        yield v2g.MessagingServiceStub(channel)


def resource(text: str) -> v2.Resource:
    return v2.Resource(name=text)


def receive(stub: Any, group: str, topic: str, invisible_ms: int | None = 5000, poll_ms: int = 0) -> list[Any]:
    req = v2s.ReceiveMessageRequest(group=resource(group), message_queue=v2.MessageQueue(topic=resource(topic), id=-1),
                                    filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"), batch_size=32,
                                    long_polling_timeout=duration_pb2.Duration(seconds=max(poll_ms // 1000, 0)))
    if invisible_ms is not None:
        req.invisible_duration.FromMilliseconds(invisible_ms)
    return list(stub.ReceiveMessage(req, metadata=HEADERS, timeout=30))


def test_every_call_needs_a_client_id(stub: Any, endpoint: str) -> None:
    topic = new_topic(endpoint)
    r = stub.QueryRoute(v2s.QueryRouteRequest(topic=resource(topic)), timeout=10)
    assert r.status.code == v2.CLIENT_ID_REQUIRED and r.status.message
    replies = list(stub.ReceiveMessage(v2s.ReceiveMessageRequest(group=resource("g"), message_queue=v2.MessageQueue(
        topic=resource(topic))), timeout=10))
    assert replies[0].status.code == v2.CLIENT_ID_REQUIRED and replies[-1].HasField("delivery_timestamp")


def test_query_route_lists_readable_writable_queues_that_accept_every_type(stub: Any, endpoint: str) -> None:
    topic = new_topic(endpoint, queues=3)
    host, port = endpoint.split(":")
    r = stub.QueryRoute(v2s.QueryRouteRequest(topic=resource(topic), endpoints=v2.Endpoints(
        scheme=v2.IPv4, addresses=[v2.Address(host=host, port=int(port))])), metadata=HEADERS, timeout=10)
    assert r.status.code == v2.OK
    assert [q.id for q in r.message_queues] == [0, 1, 2]
    for q in r.message_queues:
        assert q.permission == v2.READ_WRITE and set(q.accept_message_types) == {v2.NORMAL, v2.FIFO, v2.DELAY,
                                                                                  v2.TRANSACTION}
        assert (q.broker.endpoints.addresses[0].host, q.broker.endpoints.addresses[0].port) == (host, int(port))
    bad = stub.QueryRoute(v2s.QueryRouteRequest(topic=resource("SCHEDULE_TOPIC_XXXX")), metadata=HEADERS, timeout=10)
    assert bad.status.code == v2.ILLEGAL_TOPIC


def test_telemetry_answers_settings_with_the_brokers_limits(stub: Any, endpoint: str) -> None:
    topic, group = new_topic(endpoint), name("g")
    producer_settings = v2.Settings(client_type=v2.PRODUCER, publishing=v2.Publishing(topics=[resource(topic)]))
    consumer_settings = v2.Settings(client_type=v2.SIMPLE_CONSUMER, subscription=v2.Subscription(
        group=resource(group), subscriptions=[v2.SubscriptionEntry(topic=resource(topic))]))
    commands = iter([v2s.TelemetryCommand(settings=producer_settings),
                     v2s.TelemetryCommand(settings=consumer_settings)])
    stream = stub.Telemetry(commands, metadata=HEADERS, timeout=10)
    pub, sub = next(stream), next(stream)
    stream.cancel()
    assert pub.status.code == v2.OK and pub.settings.publishing.max_body_size == 4 * 1024 * 1024
    assert pub.settings.publishing.validate_message_type and pub.settings.backoff_policy.max_attempts == 3
    assert sub.status.code == v2.OK and sub.settings.subscription.receive_batch_size == 32
    assert sub.settings.subscription.long_polling_timeout.seconds == 20 and not sub.settings.subscription.fifo
    assert sub.settings.backoff_policy.max_attempts == 17 and len(sub.settings.backoff_policy.customized_backoff.next)
    assert not pub.settings.metric.on and not sub.settings.metric.on


def test_receipt_handles_are_refused_when_altered_for_another_group_expired_or_acked(
    stub: Any, endpoint: str
) -> None:
    topic, group = new_topic(endpoint), name("g")
    with Producer(endpoint) as p:
        p.send(Message(topic, b"x"))
    replies = receive(stub, group, topic, invisible_ms=1500, poll_ms=2000)  # no settings sent: defaults apply
    assert replies[0].status.code == v2.OK
    m = replies[1].message
    handle = m.system_properties.receipt_handle

    def ack(h: str, g: str = group) -> int:
        r = stub.AckMessage(v2s.AckMessageRequest(group=resource(g), topic=resource(topic), entries=[
            v2s.AckMessageEntry(message_id=m.system_properties.message_id, receipt_handle=h)]), metadata=HEADERS,
            timeout=10)
        return int(r.status.code)

    tampered = handle[:-3] + ("AAA" if not handle.endswith("AAA") else "BBB")
    assert ack(tampered) == v2.INVALID_RECEIPT_HANDLE
    assert ack(handle, name("other")) == v2.INVALID_RECEIPT_HANDLE
    assert ack("not-a-handle") == v2.INVALID_RECEIPT_HANDLE
    time.sleep(1.7)
    assert ack(handle) == v2.INVALID_RECEIPT_HANDLE  # expired: the message is visible again
    again = receive(stub, group, topic, invisible_ms=5000)
    assert again[1].message.system_properties.delivery_attempt == 2
    second = again[1].message.system_properties.receipt_handle
    assert ack(second) == v2.OK
    assert ack(second) == v2.INVALID_RECEIPT_HANDLE  # already acked


def test_invisible_time_and_delivery_time_limits_are_refused_without_storing(stub: Any, endpoint: str) -> None:
    topic, group = new_topic(endpoint), name("g")
    replies = receive(stub, group, topic, invisible_ms=500)  # below the broker's 1 s minimum
    assert replies[0].status.code == v2.ILLEGAL_INVISIBLE_TIME
    too_late = timestamp_pb2.Timestamp(seconds=int(time.time()) + 4 * 86_400)  # past the 3-day maximum
    msg = v2.Message(topic=resource(topic), body=b"never", system_properties=v2.SystemProperties(
        message_id="01AAAA", message_type=v2.DELAY, delivery_timestamp=too_late))
    r = stub.SendMessage(v2s.SendMessageRequest(messages=[msg]), metadata=HEADERS, timeout=10)
    assert r.status.code == v2.ILLEGAL_DELIVERY_TIME and "maximum delay" in r.status.message
    no_id = v2.Message(topic=resource(topic), body=b"x", system_properties=v2.SystemProperties(message_type=v2.NORMAL))
    assert stub.SendMessage(v2s.SendMessageRequest(messages=[no_id]), metadata=HEADERS,
                            timeout=10).status.code == v2.ILLEGAL_MESSAGE_ID
    with Admin(endpoint) as admin:
        assert all(hi == 0 for _, hi in admin.queue_offsets(topic).values())


def test_pull_and_offset_calls(stub: Any, endpoint: str) -> None:
    topic, group = new_topic(endpoint, queues=1), name("g")
    with Producer(endpoint) as p:
        for i in range(5):
            p.send(Message(topic, f"p{i}".encode()))
    mq = v2.MessageQueue(topic=resource(topic), id=0)
    replies = list(stub.PullMessage(v2s.PullMessageRequest(group=resource(group), message_queue=mq, offset=1,
                                                           batch_size=10), metadata=HEADERS, timeout=10))
    assert replies[0].status.code == v2.OK
    assert [r.message.body for r in replies[1:-1]] == [b"p1", b"p2", b"p3", b"p4"] and replies[-1].next_offset == 5
    got = stub.GetOffset(v2s.GetOffsetRequest(group=resource(group), message_queue=mq), metadata=HEADERS, timeout=10)
    assert got.status.code == v2.OFFSET_NOT_FOUND
    assert stub.UpdateOffset(v2s.UpdateOffsetRequest(group=resource(group), message_queue=mq, offset=3),
                             metadata=HEADERS, timeout=10).status.code == v2.OK
    got = stub.GetOffset(v2s.GetOffsetRequest(group=resource(group), message_queue=mq), metadata=HEADERS, timeout=10)
    assert (got.status.code, got.offset) == (v2.OK, 3)
    end = stub.QueryOffset(v2s.QueryOffsetRequest(message_queue=mq, query_offset_policy=v2.END), metadata=HEADERS,
                           timeout=10)
    assert (end.status.code, end.offset) == (v2.OK, 5)


def test_a_receive_repeated_with_its_attempt_id_gets_the_same_messages(stub: Any, endpoint: str) -> None:
    topic, group = new_topic(endpoint), name("g")
    with Producer(endpoint) as p:
        for i in range(3):
            p.send(Message(topic, f"a{i}".encode()))

    def receive_attempt(attempt_id: str) -> list[tuple[str, str]]:
        req = v2s.ReceiveMessageRequest(group=resource(group), message_queue=v2.MessageQueue(topic=resource(topic)),
                                        batch_size=32, auto_renew=True, attempt_id=attempt_id,
                                        long_polling_timeout=duration_pb2.Duration(seconds=5))
        replies = list(stub.ReceiveMessage(req, metadata=HEADERS, timeout=30))
        return sorted((r.message.system_properties.message_id, r.message.system_properties.receipt_handle)
                      for r in replies if r.HasField("message"))

    first = receive_attempt("attempt-1")
    assert len(first) == 3
    assert receive_attempt("attempt-1") == first  # the answer was lost: the same deliveries, the same handles
    assert receive_attempt("attempt-2") == []  # a new receive: they are all out
