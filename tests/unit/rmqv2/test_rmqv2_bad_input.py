"""Bad input to the apache.rocketmq.v2 service is refused with the protocol's code and stores nothing, never answered
INTERNAL_SERVER_ERROR nor a stream broken off: bytes that are no request (unary, server-streaming and Telemetry
calls), and timestamps outside protobuf's Timestamp range (year 1 to 9999), which protobuf refuses to convert. A
message stored through sluice.v1 with any born time reads back through RocketMQ 5."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import timestamp_pb2
from rmqv2_helpers import name, new_topic
from rocketmq.grpc_protocol import definition_pb2 as v2
from rocketmq.grpc_protocol import service_pb2 as v2s

from broker.client import Admin
from broker.proto import sluice_pb2 as pb
from broker.proto import sluice_pb2_grpc as pb_grpc

HEADERS = (("x-mq-client-id", "bad-input-client"),)
SERVICE = "/apache.rocketmq.v2.MessagingService"
NOT_A_REQUEST = b"\x0a\x02\xff\xfe"  # field 1, a string or message in every request here, with bytes that are neither
YEAR_10000_S = 253_402_300_800  # one second past Timestamp's range


@pytest.fixture
def channel(endpoint: str) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(endpoint) as ch:
        yield ch


def offsets(endpoint: str, topic: str) -> dict[int, tuple[int, int]]:
    with Admin(endpoint) as admin:
        return admin.queue_offsets(topic)


def _raw(channel: grpc.Channel, method: str, kind: str) -> Any:
    raw: dict[str, Any] = {"request_serializer": lambda b: b}
    return getattr(channel, kind)(f"{SERVICE}/{method}", **raw)


def test_bytes_that_are_no_request_are_bad_request_and_store_nothing(channel: grpc.Channel, endpoint: str) -> None:
    topic = new_topic(endpoint)
    before = offsets(endpoint, topic)
    send = _raw(channel, "SendMessage", "unary_unary")
    r = v2s.SendMessageResponse.FromString(send(NOT_A_REQUEST, metadata=HEADERS, timeout=10))
    assert r.status.code == v2.BAD_REQUEST and "not a valid protobuf message" in r.status.message, r.status
    receive = _raw(channel, "ReceiveMessage", "unary_stream")
    replies = [v2s.ReceiveMessageResponse.FromString(b) for b in receive(NOT_A_REQUEST, metadata=HEADERS, timeout=10)]
    assert replies[0].status.code == v2.BAD_REQUEST, replies
    pull = _raw(channel, "PullMessage", "unary_stream")
    replies = [v2s.PullMessageResponse.FromString(b) for b in pull(NOT_A_REQUEST, metadata=HEADERS, timeout=10)]
    assert [r.status.code for r in replies] == [v2.BAD_REQUEST], replies
    telemetry = _raw(channel, "Telemetry", "stream_stream")
    answers = [v2s.TelemetryCommand.FromString(b)
               for b in telemetry(iter([NOT_A_REQUEST]), metadata=HEADERS, timeout=10)]
    assert [a.status.code for a in answers] == [v2.BAD_REQUEST], answers
    assert offsets(endpoint, topic) == before


def test_timestamps_past_the_year_9999_are_refused_and_store_nothing(channel: grpc.Channel, endpoint: str) -> None:
    topic = new_topic(endpoint)
    send = channel.unary_unary(f"{SERVICE}/SendMessage", request_serializer=v2s.SendMessageRequest.SerializeToString,
                               response_deserializer=v2s.SendMessageResponse.FromString)
    far = timestamp_pb2.Timestamp(seconds=YEAR_10000_S)
    for field, code in (("delivery_timestamp", v2.ILLEGAL_DELIVERY_TIME), ("born_timestamp", v2.MESSAGE_CORRUPTED)):
        sp = v2.SystemProperties(message_id=name("id"), message_type=v2.NORMAL)
        getattr(sp, field).CopyFrom(far)
        msg = v2.Message(topic=v2.Resource(name=topic), body=b"never", system_properties=sp)
        r = send(v2s.SendMessageRequest(messages=[msg]), metadata=HEADERS, timeout=10)
        assert r.status.code == code and "out of range" in r.status.message, (field, r.status)
    query = channel.unary_unary(f"{SERVICE}/QueryOffset", request_serializer=v2s.QueryOffsetRequest.SerializeToString,
                                response_deserializer=v2s.QueryOffsetResponse.FromString)
    at = v2s.QueryOffsetRequest(message_queue=v2.MessageQueue(topic=v2.Resource(name=topic), id=0),
                                query_offset_policy=v2.TIMESTAMP, timestamp=far)
    r = query(at, metadata=HEADERS, timeout=10)
    assert r.status.code == v2.BAD_REQUEST and "out of range" in r.status.message, r.status
    assert all(hi == 0 for _lo, hi in offsets(endpoint, topic).values())


def test_a_message_sent_with_any_born_time_through_sluice_is_pulled(channel: grpc.Channel, endpoint: str) -> None:
    """sluice.v1 takes any born time (milliseconds in an int64); RocketMQ 5 shows it within Timestamp's range."""
    topic = new_topic(endpoint, queues=1)
    far = pb.SendMessageRequest(topic=topic, queue_id=0, body=b"far", born_timestamp=2**62)
    sent = pb_grpc.BrokerStub(channel).SendMessage(far, timeout=10)
    assert list(sent.queue_offsets) == [0]
    pull = channel.unary_stream(f"{SERVICE}/PullMessage", request_serializer=v2s.PullMessageRequest.SerializeToString,
                                response_deserializer=v2s.PullMessageResponse.FromString)
    mq = v2.MessageQueue(topic=v2.Resource(name=topic), id=0)
    replies = list(pull(v2s.PullMessageRequest(group=v2.Resource(name=name("g")), message_queue=mq, batch_size=10),
                        metadata=HEADERS, timeout=10))
    assert replies[0].status.code == v2.OK, replies
    m = replies[1].message
    assert m.body == b"far" and m.system_properties.born_timestamp.seconds == YEAR_10000_S - 1
