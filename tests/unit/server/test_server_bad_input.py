"""Bad input gets a clear error (gRPC status + RocketMQ response code + what to do) and changes nothing stored."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from broker.client import Admin, Message, Producer, PullConsumer
from broker.client.message import encode_message
from broker.errors import (
    BrokerError,
    InvalidArgumentError,
    MessageIllegalError,
    ResponseCode,
    SubscriptionGroupNotExistError,
    SubscriptionParseError,
    TopicNotExistError,
)
from broker.proto import sluice_pb2 as pb
from broker.proto import sluice_pb2_grpc as pb_grpc
from broker.proto.status import RESPONSE_CODE_KEY
from broker.server.broker_controller import BrokerController

TOPIC = "Kept"


def snapshot(endpoint: str) -> list[tuple[int, int, bytes, str | None]]:
    """Every stored message of TOPIC: (queue, offset, body, tags)."""
    out = []
    with PullConsumer(endpoint, "snap") as c:
        for qid in range(8):
            r = c.pull(TOPIC, qid, 0, max_msgs=1000)
            out += [(m.queue_id, m.queue_offset, m.body, m.tags) for m in r.messages]
    return out


@pytest.fixture
def stored(broker: BrokerController, endpoint: str) -> list[tuple[int, int, bytes, str | None]]:
    with Producer(endpoint) as p:
        p.send_batch([Message(TOPIC, f"keep{i}".encode(), tags="T") for i in range(40)])
    assert broker.store is not None and broker.store.wait_dispatched()
    before = snapshot(endpoint)
    assert len(before) == 40
    return before


def check_refused(
    endpoint: str, before: list[tuple[int, int, bytes, str | None]], action: Callable[[], object],
    error: type[BrokerError], *needles: str,
) -> None:  # fmt: skip
    with pytest.raises(error) as info:
        action()
    for needle in needles:
        assert needle in info.value.message, info.value.message
    assert snapshot(endpoint) == before


def test_oversize_body(stored, endpoint: str) -> None:  # type: ignore[no-untyped-def]
    big = Message(TOPIC, b"x" * (4 * 1024 * 1024 + 1))
    with Producer(endpoint) as p:
        check_refused(endpoint, stored, lambda: p.send(big, queue_id=0), MessageIllegalError, "maxMessageSize")
        check_refused(endpoint, stored, lambda: p.send_batch([big]), MessageIllegalError, "maxMessageSize")


def test_bad_topic_names(stored, endpoint: str) -> None:  # type: ignore[no-untyped-def]
    with Producer(endpoint) as p, Admin(endpoint) as admin:
        check_refused(endpoint, stored, lambda: p.send(Message("bad topic", b"x"), queue_id=0), MessageIllegalError,
                      "^[%|a-zA-Z0-9_-]+$")  # fmt: skip
        check_refused(endpoint, stored, lambda: admin.create_topic("x" * 200), MessageIllegalError, "limit is 127")
        check_refused(endpoint, stored, lambda: admin.queue_offsets("NoSuchTopic"), TopicNotExistError,
                      "sluice topic create")  # fmt: skip


def test_bad_offsets(stored, endpoint: str) -> None:  # type: ignore[no-untyped-def]
    with PullConsumer(endpoint, "g") as c:
        check_refused(endpoint, stored, lambda: c.pull(TOPIC, 0, -1), InvalidArgumentError, "negative")
        check_refused(endpoint, stored, lambda: c.pull(TOPIC, 99, 0), InvalidArgumentError, "queues 0..7")
        check_refused(endpoint, stored, lambda: c.commit_offsets({(TOPIC, 0): -5}), InvalidArgumentError, "negative")
        far = {(TOPIC, 0): 0, (TOPIC, 1): 10**12}  # one good, one far-future: neither is stored
        check_refused(endpoint, stored, lambda: c.commit_offsets(far), InvalidArgumentError, "past the queue's max")
        assert c.committed_offsets(TOPIC) == {}
        check_refused(endpoint, stored, lambda: c.pull(TOPIC, 0, 0, tags="A || "), SubscriptionParseError, "empty tag")


def test_unknown_group(stored, endpoint: str) -> None:  # type: ignore[no-untyped-def]
    with Admin(endpoint) as admin:
        check_refused(endpoint, stored, lambda: admin.consumer_lag("NeverSeen"), SubscriptionGroupNotExistError,
                      "no committed offsets and no live consumers")  # fmt: skip
        check_refused(endpoint, stored, lambda: admin.consumer_lag("bad group!"), InvalidArgumentError, "group")
        assert admin.committed_offsets("NeverSeen", TOPIC) == {}


def test_garbage_in_a_send_batch_buffer(stored, endpoint: str) -> None:  # type: ignore[no-untyped-def]
    good = b"".join(encode_message(Message(TOPIC, b"new"), 0) for _ in range(3))
    flipped = bytearray(good)
    flipped[len(good) // 2 + 100 - len(good) // 2] ^= 0xFF  # a body byte of the second entry? no: inside entry 0
    cases = {
        "random bytes": b"\x00garbage" * 50,
        "truncated": good[:-5],
        "trailing junk": good + b"\x01\x02\x03",
        "count mismatch": good,
    }
    with Producer(endpoint) as p:
        for name, buf in cases.items():
            count = 7 if name == "count mismatch" else 3
            check_refused(endpoint, stored, lambda b=buf, n=count: p.send_encoded(b, n), MessageIllegalError, "")  # type: ignore[misc]
        entry = encode_message(Message(TOPIC, b"abcdef" * 10), 0)
        bad_crc = bytearray(entry)
        bad_crc[-20] ^= 0x01  # inside the body
        check_refused(endpoint, stored, lambda: p.send_encoded(good + bytes(bad_crc), 4), MessageIllegalError, "CRC")
        wrong_queue = encode_message(Message(TOPIC, b"q"), 8)  # topic has queues 0..7
        check_refused(endpoint, stored, lambda: p.send_encoded(good + wrong_queue, 4), MessageIllegalError,
                      "queues 0..7")  # fmt: skip


def test_errors_carry_grpc_status_and_response_code(broker: BrokerController, endpoint: str) -> None:
    channel = grpc.insecure_channel(endpoint)
    stub = pb_grpc.BrokerStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.SendBatch(pb.SendBatchRequest(entries=b"junk", count=1), timeout=10)
    e = info.value
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert dict(e.trailing_metadata())[RESPONSE_CODE_KEY] == str(int(ResponseCode.MESSAGE_ILLEGAL))  # type: ignore[attr-defined]
    assert "encode_entry" in e.details()  # type: ignore[attr-defined]
    channel.close()
