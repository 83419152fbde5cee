"""Bad input gets a clear error (gRPC status + RocketMQ response code + what to do) and changes nothing stored."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from broker.client import Admin, Message, PartialSendError, Producer, PullConsumer
from broker.client.outgoing_message import encode_message
from broker.errors import (
    BrokerError,
    InvalidArgumentError,
    MessageIllegalError,
    ResponseCode,
    SubscriptionGroupNotExistError,
    SubscriptionParseError,
    TopicNotExistError,
)
from broker.format.message import SysFlag, encode_entry
from broker.format.system_topics import SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
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
) -> None:
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
                      "^[%|a-zA-Z0-9_-]+$")
        check_refused(endpoint, stored, lambda: admin.create_topic("x" * 200), MessageIllegalError, "limit is 127")
        check_refused(endpoint, stored, lambda: admin.queue_offsets("NoSuchTopic"), TopicNotExistError,
                      "sluice topic create")


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
                      "no committed offsets and no live consumers")
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
                      "queues 0..7")


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


def test_transaction_type_bits_in_plain_sends(stored, endpoint: str) -> None:  # type: ignore[no-untyped-def]
    """A plain send marked PREPARED or ROLLBACK is refused: acknowledged, it would never reach a consume queue."""
    channel = grpc.insecure_channel(endpoint)
    stub = pb_grpc.BrokerStub(channel)
    try:
        for sys_flag in (SysFlag.TRANSACTION_PREPARED_TYPE, SysFlag.TRANSACTION_ROLLBACK_TYPE,
                         SysFlag.TRANSACTION_COMMIT_TYPE):
            request = pb.SendMessageRequest(topic=TOPIC, queue_id=0, body=b"never", sys_flag=sys_flag)
            with pytest.raises(grpc.RpcError) as info:
                stub.SendMessage(request, timeout=10)
            assert "transaction type bits" in info.value.details()  # type: ignore[attr-defined]
            good = encode_message(Message(TOPIC, b"fine"), 1)
            marked = encode_entry(TOPIC.encode(), 0, b"never", b"", sys_flag=sys_flag)
            for entries in (marked, good * 3 + marked, (good * 3 + marked) * 40):  # small and numpy-checked batches
                with pytest.raises(grpc.RpcError) as info:
                    stub.SendBatch(pb.SendBatchRequest(entries=entries), timeout=10)
                assert "transaction type bits" in info.value.details()  # type: ignore[attr-defined]
        assert snapshot(endpoint) == stored
    finally:
        channel.close()


def test_refused_sends_create_no_topic(broker: BrokerController, endpoint: str) -> None:
    """Auto-create happens only for a send that is stored: a refused one leaves no topic behind."""
    good = encode_message(Message("NewB", b"x"), 0)
    with Producer(endpoint) as p, Admin(endpoint) as admin:
        with pytest.raises(InvalidArgumentError, match="queue 99 does not exist"):
            p.send(Message("NewA", b"x"), queue_id=99)
        with pytest.raises(MessageIllegalError, match="maxMessageSize"):
            p.send(Message("NewA2", b"x" * (4 * 1024 * 1024 + 1)), queue_id=0)
        with pytest.raises(MessageIllegalError, match="queue 50 does not exist"):
            p.send_encoded(good + encode_message(Message("NewC", b"x"), 50), 2)
        with pytest.raises(MessageIllegalError, match="queue 50 does not exist"):
            p.send_encoded(good + encode_message(Message("NewD", b"x"), 50), 2, transaction_id="tx:1")
        names = {t.topic for t in admin.list_topics()}
        assert not names & {"NewA", "NewA2", "NewB", "NewC", "NewD"}, names
        p.send(Message("NewA", b"x"), queue_id=7)  # the default queue count: accepted, and created
        p.send_encoded(good, 1)
        assert {"NewA", "NewB"} <= {t.topic for t in admin.list_topics()}
        assert admin.queue_offsets("NewA")[7] == (0, 1)


def test_system_topics_cannot_be_created_or_deleted(broker: BrokerController, endpoint: str) -> None:
    """Deleting SCHEDULE_TOPIC_XXXX dropped every pending delayed message."""
    with Producer(endpoint) as p, Admin(endpoint) as admin:
        p.send(Message("D", b"later", properties={"DELAY": "3"}), queue_id=0)  # 10 s: still pending below
        admin.queue_offsets(SCHEDULE_TOPIC)  # reading it registers it (adopted from the store)
        for topic in (SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC):
            with pytest.raises(InvalidArgumentError, match="system topic"):
                admin.delete_topic(topic)
            with pytest.raises(InvalidArgumentError, match="system topic"):
                admin.create_topic(topic, 2)
        assert admin.queue_offsets(SCHEDULE_TOPIC)[2] == (0, 1)  # level 3's queue still holds the message


def test_a_send_failing_after_stored_parts_says_which_were_stored(stored, endpoint: str) -> None:  # type: ignore[no-untyped-def]
    """send_batch splits into all-or-nothing calls; a later call's failure says which parts were stored."""
    msgs = [Message(TOPIC, b"p" * 500) for _ in range(6)] + [Message(SCHEDULE_TOPIC, b"refused")]
    with Producer(endpoint, batch_limit_bytes=2000) as p:
        with pytest.raises(PartialSendError) as info:
            p.send_batch(msgs, queue_id=0)
        with pytest.raises(MessageIllegalError, match="nothing stored"):  # one call: nothing stored, as it says
            p.send_batch(msgs[-1:], queue_id=0)
    err = info.value
    assert isinstance(err.cause, MessageIllegalError) and err.code == ResponseCode.MESSAGE_ILLEGAL
    assert "resend only the other" in err.message
    after = snapshot(endpoint)
    assert len(err.stored) == len(after) - len(stored) > 0
    new = [m for m in after if m not in stored]
    assert [r.queue_offset for r in err.stored] == [m[1] for m in new]


def test_consumer_calls_name_a_client_and_real_queues(stored, endpoint: str) -> None:  # type: ignore[no-untyped-def]
    """An empty client id registered a phantom consumer that took queues in rebalance; locks took any name."""
    channel = grpc.insecure_channel(endpoint)
    stub = pb_grpc.BrokerStub(channel)
    try:
        with pytest.raises(grpc.RpcError) as info:
            stub.Heartbeat(pb.HeartbeatRequest(consumer_group="g1", client_id="", subscriptions={TOPIC: "*"}))
        assert "client_id" in info.value.details()  # type: ignore[attr-defined]
        assert list(stub.GetConsumerList(pb.GetConsumerListRequest(consumer_group="g1")).client_ids) == []
        for queue in (pb.MessageQueue(topic="NoSuchTopic", queue_id=0), pb.MessageQueue(topic=TOPIC, queue_id=-1),
                      pb.MessageQueue(topic=TOPIC, queue_id=8)):
            with pytest.raises(grpc.RpcError):
                stub.LockBatchMQ(pb.LockBatchRequest(consumer_group="g1", client_id="c1", queues=[queue]))
        ok = stub.LockBatchMQ(pb.LockBatchRequest(consumer_group="g1", client_id="c1",
                                                  queues=[pb.MessageQueue(topic=TOPIC, queue_id=3)]))
        assert [(q.topic, q.queue_id) for q in ok.queues] == [(TOPIC, 3)]
    finally:
        channel.close()
    with Admin(endpoint) as admin, pytest.raises(InvalidArgumentError, match="negative"):
        admin.query_by_key(TOPIC, "k", max_num=-1)
    assert snapshot(endpoint) == stored
