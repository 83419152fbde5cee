"""Refusals are clear: a gRPC status that is not INTERNAL, a Sluice response code in the trailing metadata, and
details short enough for any receiver, whatever the request repeats; INTERNAL is a broker bug's alone."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor

from broker.client import Message, Producer
from broker.errors import MessageIllegalError, ResponseCode
from broker.format.message import encode_entry
from broker.proto import sluice_pb2 as pb
from broker.proto.status import MAX_DETAILS_ENCODED_BYTES, grpc_code_for
from broker.server.broker_controller import BrokerController
from tests.unit.server.hardening_rpc import Answer, answer, clear_refusal, raw_method, stub

BROKER = pb.DESCRIPTOR.services_by_name["Broker"]
OVERSIZED = {
    "ascii": "t" * 20_000 + " ",
    "separators": "x\x01" * 3_000,
    "non-ascii": "\u00e9" * 6_000,
}


def fill(message: Any, text: str) -> Any:
    """Every string field of ``message`` (nested messages, maps, repeated fields and oneofs included) set to
    ``text``; the other fields keep a harmless value."""
    for field in message.DESCRIPTOR.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            container = getattr(message, field.name)
            if value_field.type == FieldDescriptor.TYPE_STRING:
                container[text] = text
            elif value_field.type == FieldDescriptor.TYPE_DOUBLE:
                container[text] = 1.0
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.is_repeated:
                fill(getattr(message, field.name).add(), text)
            else:
                fill(getattr(message, field.name), text)
        elif field.type == FieldDescriptor.TYPE_STRING:
            if field.is_repeated:
                getattr(message, field.name).append(text)
            else:
                setattr(message, field.name, text)
    return message


def call(channel: grpc.Channel, method: MethodDescriptor, request: Any, timeout_s: float = 30.0) -> Answer:
    """Any method, unary or server-streaming (its first answer)."""
    path = f"/{BROKER.full_name}/{method.name}"
    response_type = getattr(pb, method.output_type.name)
    if method.server_streaming:
        stream = channel.unary_stream(path, request_serializer=type(request).SerializeToString,
                                      response_deserializer=response_type.FromString)

        def first(req: Any, timeout: float) -> Any:
            return next(iter(stream(req, timeout=timeout)), None)

        return answer(first, request, timeout_s)
    unary = channel.unary_unary(path, request_serializer=type(request).SerializeToString,
                                response_deserializer=response_type.FromString)
    return answer(unary, request, timeout_s)


@pytest.fixture
def channel(endpoint: str) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(endpoint) as ch:
        yield ch


def test_every_rpc_with_oversized_string_fields_gets_a_clear_answer(broker: BrokerController,
                                                                     channel: grpc.Channel) -> None:
    """PullMessage(topic="t"*20000+" ") came back RESOURCE_EXHAUSTED "received metadata size exceeds hard limit"
    without a response code (the echoed topic made the details too big); so did CreateTopic, GetTopicRoute,
    QueryConsumerOffset, ListTransactions(status), ViewMessageById, expression_type, long SQL92 tokens, a
    10k-digit DELAY. Every RPC, every string field oversized: answered, or refused clearly."""
    seen = 0
    for method in BROKER.methods:
        request_type = getattr(pb, method.input_type.name)
        for variant, text in OVERSIZED.items():
            a = call(channel, method, fill(request_type(), text), timeout_s=10.0)
            assert a.ok or clear_refusal(a), f"{method.name} ({variant}): {a}"
            seen += 1
    sql = pb.PullRequest(consumer_group="g", topic="T", expression_type="SQL92", tag_expression="a = " + "9" * 16_000)
    assert clear_refusal(call(channel, BROKER.methods_by_name["PullMessage"], sql))
    assert seen == 3 * len(BROKER.methods)


def test_an_oversized_property_name_through_the_client(endpoint: str) -> None:
    with Producer(endpoint) as p, pytest.raises(MessageIllegalError) as info:
        p.send(Message("T", b"x", properties={"x\x01" * 3000: "v"}), queue_id=0)
    assert "separators" in info.value.message and len(info.value.message) < 1024


def test_every_response_code_has_a_status_and_only_system_error_is_internal() -> None:
    """TRANSACTION_FAILED had no gRPC mapping, so a refused commit (EndTransaction expected_messages) was INTERNAL."""
    for code in ResponseCode:
        status = grpc_code_for(code)
        assert (status == grpc.StatusCode.INTERNAL) == (code is ResponseCode.SYSTEM_ERROR), code


def test_a_commit_of_the_wrong_size_is_a_failed_precondition(endpoint: str) -> None:
    with stub(endpoint) as s:
        sent = answer(s.SendMessage, pb.SendMessageRequest(topic="T", queue_id=0, body=b"x", transactional=True,
                                                           producer_group="pg", transaction_id="tx-5"))
        assert sent.ok, sent
        a = answer(s.EndTransaction, pb.EndTransactionRequest(transaction_id="tx-5", commit=True, expected_messages=5))
        assert a.refused_with(grpc.StatusCode.FAILED_PRECONDITION, ResponseCode.TRANSACTION_FAILED), a
        assert answer(s.EndTransaction, pb.EndTransactionRequest(transaction_id="tx-5", commit=True,
                                                                 expected_messages=1)).ok


def test_a_send_back_with_a_bad_origin_id_is_invalid_argument(endpoint: str) -> None:
    """The origin id became a property with a separator in it: the copy could not be stored and the call answered
    INTERNAL "... the consumer should retry it", for ever."""
    with Producer(endpoint) as p, stub(endpoint) as s:
        sent = p.send(Message("T", b"x"), queue_id=0)
        for origin in ("a\x01b", "b\x02", "x" * 5000):
            request = pb.ConsumerSendMsgBackRequest(consumer_group="g", msg_id=sent.msg_id, origin_msg_id=origin)
            a = answer(s.ConsumerSendMsgBack, request)
            assert a.refused_with(grpc.StatusCode.INVALID_ARGUMENT, ResponseCode.INVALID_ARGUMENT), a
        ok = pb.ConsumerSendMsgBackRequest(consumer_group="g", msg_id=sent.msg_id, origin_msg_id=sent.msg_id)
        assert answer(s.ConsumerSendMsgBack, ok).ok


def test_a_batch_topic_that_is_no_name_is_refused_in_words(endpoint: str) -> None:
    """A non-ASCII batch topic was refused with the codec's own words ("'ascii' codec can't decode byte 0xc3")."""
    with stub(endpoint) as s:
        for entries in (encode_entry("\u00e9t\u00e9".encode(), 0, b"x"),
                        encode_entry(b"T", 0, b"x") * 40 + encode_entry("\u00e9".encode(), 0, b"x"),
                        encode_entry(b"a b", 0, b"x")):
            for txn in ("", "tx-topic"):
                a = answer(s.SendBatch, pb.SendBatchRequest(entries=entries, transaction_id=txn, producer_group="pg"))
                assert a.refused_with(grpc.StatusCode.INVALID_ARGUMENT, ResponseCode.MESSAGE_ILLEGAL), a
                assert "is not a topic name" in a.details and "codec" not in a.details, a


def test_deleting_a_topic_that_is_no_name_is_invalid_argument(endpoint: str) -> None:
    """DeleteTopic("a b") answered NOT_FOUND, as if such a topic could exist."""
    with stub(endpoint) as s:
        for name in ("a b", "", "x" * 300, "../config"):
            a = answer(s.DeleteTopic, pb.DeleteTopicRequest(topic=name))
            assert a.refused_with(grpc.StatusCode.INVALID_ARGUMENT, ResponseCode.MESSAGE_ILLEGAL), (name, a)
        a = answer(s.DeleteTopic, pb.DeleteTopicRequest(topic="NoSuchTopic"))
        assert a.refused_with(grpc.StatusCode.NOT_FOUND, ResponseCode.TOPIC_NOT_EXIST), a


def test_a_heartbeat_is_checked_before_anything_is_recorded(endpoint: str) -> None:
    """Heartbeat accepted subscriptions to topics that cannot exist and model=99 (kept as CLUSTERING)."""

    def beat(**fields: Any) -> pb.HeartbeatRequest:
        return pb.HeartbeatRequest(**{"client_id": "c1", "consumer_group": "hb", **fields})

    with stub(endpoint) as s:
        refused = {
            "model 99": (beat(model=99), grpc.StatusCode.INVALID_ARGUMENT),
            "a topic that is no name": (beat(subscriptions={"a b": "*"}), grpc.StatusCode.INVALID_ARGUMENT),
            "an empty topic": (beat(subscriptions={"": "*"}), grpc.StatusCode.INVALID_ARGUMENT),
            "a system topic": (beat(subscriptions={"RMQ_SYS_TRANS_HALF_TOPIC": "*"}),
                               grpc.StatusCode.PERMISSION_DENIED),
            "a huge expression": (beat(subscriptions={"T": "a" * 20_000}), grpc.StatusCode.INVALID_ARGUMENT),
            "too many topics": (beat(subscriptions={f"T{i}": "*" for i in range(2000)}),
                                grpc.StatusCode.INVALID_ARGUMENT),
        }
        for name, (request, status) in refused.items():
            a = answer(s.Heartbeat, request)
            assert a.status == status and clear_refusal(a), f"{name}: {a}"
        listed = answer(s.GetConsumerList, pb.GetConsumerListRequest(consumer_group="hb"))
        assert listed.ok and list(listed.response.client_ids) == []
        assert answer(s.Heartbeat, beat(subscriptions={"T": "TagA || TagB"}, model=pb.BROADCASTING)).ok


def test_a_request_that_is_no_protobuf_is_invalid_argument_logged_once(
    endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Malformed protobuf and invalid UTF-8 in string fields got INTERNAL "Exception deserializing request!" and a
    traceback in the log: now INVALID_ARGUMENT with a response code and one log line."""
    caplog.set_level(logging.INFO)
    bad = {
        "corrupt wire format": b"\xff\xff\xff\xff",
        "a string field that is not UTF-8": b"\x0a\x02\xff\xfe",  # field 1 (a string in each request below)
        "a length past the end": b"\x12\x7fabc",
    }
    with grpc.insecure_channel(endpoint) as ch:
        stream = ch.unary_stream("/sluice.v1.Broker/TransactionCheckStream", request_serializer=lambda b: b,
                                 response_deserializer=lambda b: b)

        def first_check(request: bytes, timeout: float) -> object:
            return next(iter(stream(request, timeout=timeout)), None)

        for name, data in bad.items():
            for method in ("PullMessage", "SendBatch", "Heartbeat", "TransactionCheckStream"):
                caplog.clear()
                a = answer(first_check if method == "TransactionCheckStream" else raw_method(ch, method), data)
                assert a.refused_with(grpc.StatusCode.INVALID_ARGUMENT, ResponseCode.INVALID_ARGUMENT), (name, a)
                assert "not a valid protobuf message" in a.details
                lines = [r for r in caplog.records if r.name.startswith(("broker", "grpc"))]
                assert len(lines) == 1 and lines[0].exc_info is None, [r.getMessage() for r in lines]
                assert len(lines[0].getMessage().encode()) <= MAX_DETAILS_ENCODED_BYTES + 200


def test_a_check_stream_without_a_producer_group_has_a_response_code(endpoint: str) -> None:
    with grpc.insecure_channel(endpoint) as ch:
        method = BROKER.methods_by_name["TransactionCheckStream"]
        for group in ("", "no group!", "g" * 300):
            a = call(ch, method, pb.TransactionCheckSubscribe(producer_group=group, client_id="c"), timeout_s=10)
            assert a.refused_with(grpc.StatusCode.INVALID_ARGUMENT, ResponseCode.INVALID_ARGUMENT), a
