"""System topics hold what the broker still owes (pending delayed messages, open and rolled-back transaction halves,
decisions): a client may not read them in any way, nor commit offsets on them; the broker's own services still
deliver and commit through them."""

from __future__ import annotations

import grpc
import pytest

from broker.client import Admin, Message, Producer, PullConsumer
from broker.errors import ResponseCode
from broker.format.system_topics import SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from broker.proto import sluice_pb2 as pb
from broker.server.broker_controller import BrokerController
from tests.unit.server.hardening_rpc import Answer, answer, stub

SYSTEM = [SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, "rmq_sys_wheel_timer", "SELF_TEST_TOPIC"]


def denied(a: Answer) -> bool:
    return a.refused_with(grpc.StatusCode.PERMISSION_DENIED, ResponseCode.NO_PERMISSION)


@pytest.fixture
def owed(broker: BrokerController, endpoint: str) -> dict[str, str]:
    """An open half (with a key), a rolled-back one and a pending delayed message: msgIds by what they are."""
    with stub(endpoint) as s:
        ids = {}
        for txn in ("tx-open", "tx-rolled-back"):
            sent = answer(s.SendMessage, pb.SendMessageRequest(
                topic="Orders", queue_id=0, body=txn.encode(), properties={"KEYS": "secret"}, transactional=True,
                producer_group="pg", transaction_id=txn,
            ))
            assert sent.ok, sent
            ids[txn] = f"{sent.response.msg_id_prefix}{sent.response.commitlog_offsets[0]:016X}"
        assert answer(s.EndTransaction, pb.EndTransactionRequest(transaction_id="tx-rolled-back", commit=False)).ok
    with Producer(endpoint) as p:
        delayed = Message("Orders", b"later", keys=["secret"], properties={"DELAY": "5"})
        ids["delayed"] = p.send(delayed, queue_id=0).msg_id
    assert broker.store is not None and broker.store.wait_dispatched()
    return ids


def test_pulls_queries_views_and_commits_of_system_topics_are_denied(
    broker: BrokerController, endpoint: str, owed: dict[str, str]
) -> None:
    """Pulls of RMQ_SYS_TRANS_HALF_TOPIC returned open and rolled-back halves, a key query found open halves, pulls
    of SCHEDULE_TOPIC_XXXX returned pending delayed messages, and offsets committed there were stored."""
    with stub(endpoint) as s:
        for topic in SYSTEM:
            for queue_id in (0, 4):
                pull = answer(s.PullMessage, pb.PullRequest(consumer_group="snoop", topic=topic, queue_id=queue_id,
                                                            queue_offset=0, max_msgs=32))
                assert denied(pull), (topic, pull)
                commit = answer(s.PullMessage, pb.PullRequest(consumer_group="snoop", topic=topic, queue_id=queue_id,
                                                              commit_offset=0))
                assert denied(commit), (topic, commit)
            offsets = pb.UpdateConsumerOffsetsRequest(
                consumer_group="snoop", offsets=[pb.QueueOffset(topic=topic, queue_id=0, offset=0)]
            )
            assert denied(answer(s.UpdateConsumerOffsets, offsets)), topic
            key = answer(s.QueryMessageByKey, pb.QueryMessageByKeyRequest(topic=topic, key="secret"))
            assert denied(key), (topic, key)
            queues = [pb.MessageQueue(topic=topic, queue_id=0)]
            lock = answer(s.LockBatchMQ, pb.LockBatchRequest(consumer_group="snoop", client_id="c", queues=queues))
            assert denied(lock), (topic, lock)
            beat = answer(s.Heartbeat, pb.HeartbeatRequest(consumer_group="snoop", client_id="c",
                                                          subscriptions={topic: "*"}))
            assert denied(beat), (topic, beat)
        for what, msg_id in owed.items():
            view = answer(s.ViewMessageById, pb.ViewMessageByIdRequest(msg_id=msg_id))
            assert denied(view), (what, view)
        found = answer(s.QueryMessageByKey, pb.QueryMessageByKeyRequest(topic="Orders", key="secret"))
        assert found.ok and found.response.entries == b"", "nothing of Orders is visible yet"
        query = pb.QueryConsumerOffsetRequest(consumer_group="snoop", topic=TRANS_HALF_TOPIC, queue_id=-1)
        assert answer(s.QueryConsumerOffset, query).response.offsets == []
    assert broker.offsets.groups() == []


def test_the_broker_still_delivers_and_commits_through_them(
    broker: BrokerController, endpoint: str, owed: dict[str, str]
) -> None:
    with Admin(endpoint) as admin:
        assert admin.end_transaction("tx-open", commit=True) == "COMMITTED"
        assert admin.queue_offsets(SCHEDULE_TOPIC)[4] == (0, 1)  # metadata stays readable (topic describe)
    with PullConsumer(endpoint, "readers") as c:
        assert [m.body for m in c.pull("Orders", 0, 0).messages] == [b"tx-open"]


def test_reserved_names_cannot_be_created_or_sent_to(endpoint: str) -> None:
    with stub(endpoint) as s:
        for topic in ("rmq_sys_custom", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT"):
            created = answer(s.CreateTopic, pb.CreateTopicRequest(topic=topic, queue_nums=1))
            assert created.status == grpc.StatusCode.INVALID_ARGUMENT and created.code is not None, created
            sent = answer(s.SendMessage, pb.SendMessageRequest(topic=topic, queue_id=0, body=b"x"))
            assert sent.status == grpc.StatusCode.INVALID_ARGUMENT and sent.code is not None, sent
