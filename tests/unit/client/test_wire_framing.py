"""Requests framed by hand (broker/proto/wire.py) parse to exactly the message protobuf would have serialized, for
any field values; and a framed SendBatch is stored by a real broker as the plain one is."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.client import Admin, Message, PullConsumer
from broker.client.producer import Producer
from broker.proto import sluice_pb2 as pb
from broker.proto.wire import Framed, framed, varint
from broker.server.broker_controller import BrokerController

texts = st.text(max_size=40)
counts = st.integers(min_value=0, max_value=2**31 - 1)


@settings(max_examples=300, deadline=None)
@given(group=texts, count=counts, txn=texts, attempt=texts, coordinator=texts, retry=st.booleans(),
       entries=st.binary(max_size=5000))
def test_framed_parses_to_the_message_protobuf_serializes(
    group: str, count: int, txn: str, attempt: str, coordinator: str, retry: bool, entries: bytes
) -> None:
    head = pb.SendBatchRequest(producer_group=group, count=count, transaction_id=txn, attempt=attempt,
                               coordinator=coordinator, retry=retry)
    whole = pb.SendBatchRequest()
    whole.CopyFrom(head)
    whole.entries = entries
    assert pb.SendBatchRequest.FromString(framed(head, "entries", entries)) == whole
    request = Framed(head, "entries", entries)
    assert pb.SendBatchRequest.FromString(request.SerializeToString()) == whole
    assert request.entries == entries and request.producer_group == group


@settings(max_examples=200, deadline=None)
@given(group=texts, parts=st.lists(st.binary(max_size=300), max_size=40))
def test_framed_parts_parse_to_the_message_with_them_joined(group: str, parts: list[bytes]) -> None:
    """A batch's entries framed as parts (no join before the request's own) equal the entries joined."""
    head = pb.SendBatchRequest(producer_group=group, count=len(parts))
    whole = pb.SendBatchRequest(producer_group=group, count=len(parts), entries=b"".join(parts))
    assert pb.SendBatchRequest.FromString(framed(head, "entries", parts)) == whole
    request = Framed(head, "entries", parts)
    assert pb.SendBatchRequest.FromString(request.SerializeToString()) == whole
    assert request.entries == b"".join(parts)


@given(st.integers(min_value=1, max_value=2**63 - 1))
def test_varint_is_protobufs(value: int) -> None:
    # PullRequest has queue_offset = 4 (int64): alone, it serializes as its key byte (4 << 3 | 0) and the varint
    assert pb.PullRequest(queue_offset=value).SerializeToString() == b"\x20" + varint(value)


def test_a_framed_head_must_leave_the_field_empty() -> None:
    with pytest.raises(ValueError, match="must be empty"):
        framed(pb.SendBatchRequest(entries=b"x"), "entries", b"y")
    with pytest.raises(AttributeError):
        Framed(pb.SendBatchRequest(), "entries", b"y").entries = b"z"  # type: ignore[misc]
    with pytest.raises(ValueError):
        varint(-1)


def test_a_framed_send_batch_is_stored_as_sent(broker: BrokerController, endpoint: str) -> None:
    with Admin(endpoint) as admin, Producer(endpoint) as producer, PullConsumer(endpoint, "g") as consumer:
        admin.create_topic("Framed", 1)
        bodies = [bytes([i % 251]) * (i * 37 % 3000) for i in range(500)]
        results = producer.send_batch([Message("Framed", b) for b in bodies], queue_id=0)
        assert [r.queue_offset for r in results] == list(range(500))
        # one call's results are made when read (SendResults), and still behave as the list they stand for
        as_list = list(results)
        assert results == as_list and as_list == results and len(results) == 500
        assert results[-1] == as_list[-1] and results[10:12] == as_list[10:12]
        first, rest = as_list[:1], as_list[1:]
        assert first + results[1:] == as_list and results[:1] + rest == as_list
        assert first + results == [as_list[0], *as_list] and results + rest == [*as_list, *rest]
        collected: list[object] = []
        collected += results
        assert collected == as_list and len({r.msg_id for r in results}) == 500
        got = consumer.pull("Framed", 0, 0, max_msgs=500).messages
        assert [m.body for m in got] == bodies
