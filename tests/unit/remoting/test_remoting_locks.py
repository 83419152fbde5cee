"""LOCK_BATCH_MQ and UNLOCK_BATCH_MQ over the broker's remoting port: the broker's one queue-lock table, shared with
the gRPC LockBatchMQ (a queue a remoting consumer holds is refused to a gRPC one of the group, and the other way)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import grpc
import pytest
from message_wire_helpers import ROOT_SECRET, Slave, answered, auth_broker, call

from broker.client import Admin
from broker.proto import sluice_pb2 as pb
from broker.proto import sluice_pb2_grpc as pb_grpc
from broker.remoting import fastjson
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, WireCode
from broker.remoting.command import RemotingCommand
from broker.remoting.message_processors import message_processors
from broker.server.broker_controller import BrokerController

GROUP, TOPIC = "orderly", "LockT"
LOCK_BATCH_MQ = RequestCode.LOCK_BATCH_MQ


@pytest.fixture
def remoting_broker(broker_factory: Callable[..., BrokerController]) -> BrokerController:
    broker = broker_factory(remoting_listen="127.0.0.1:0")
    with Admin(broker.address) as admin:
        admin.create_topic(TOPIC, 2)
    return broker


@pytest.fixture
def client(remoting_broker: BrokerController) -> Iterator[RemotingClient]:
    with RemotingClient(remoting_broker.config.remoting_listen) as c:
        yield c


def lock_body(client_id: str, *queue_ids: int, topic: str = TOPIC) -> bytes:
    mqs = [{"topic": topic, "brokerName": "broker-a", "queueId": q} for q in queue_ids]
    return fastjson.dumps({"consumerGroup": GROUP, "clientId": client_id, "mqSet": mqs}, standard=True)


def lock(client: RemotingClient, client_id: str, *queue_ids: int) -> list[int]:
    r = client.invoke(RemotingCommand(RequestCode.LOCK_BATCH_MQ, body=lock_body(client_id, *queue_ids)))
    assert r.code == WireCode.SUCCESS, r.remark
    held = json.loads(r.body)["lockOKMQSet"]
    assert all(q["topic"] == TOPIC and q["brokerName"] == "broker-a" for q in held)  # as the client named them
    return sorted(q["queueId"] for q in held)


def test_a_lock_is_refused_to_another_client_until_unlocked(remoting_broker: BrokerController,
                                                            client: RemotingClient) -> None:
    assert lock(client, "A", 0, 1) == [0, 1]
    assert lock(client, "B", 0, 1) == []  # held by A
    assert lock(client, "A", 0) == [0]  # renewed by its owner
    unlock = RemotingCommand(RequestCode.UNLOCK_BATCH_MQ, body=lock_body("A", 0))
    client.invoke_oneway(unlock)  # as consumers send it
    again = client.invoke(RemotingCommand(RequestCode.UNLOCK_BATCH_MQ, body=lock_body("A", 0)))
    assert again.code == WireCode.SUCCESS and again.body == b""
    assert lock(client, "B", 0, 1) == [0]  # queue 1 is still A's
    assert remoting_broker.locks.owner(GROUP, TOPIC, 0) == "B"


def test_the_lock_table_is_the_grpc_ones(remoting_broker: BrokerController, client: RemotingClient) -> None:
    with grpc.insecure_channel(remoting_broker.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        wire = [pb.MessageQueue(topic=TOPIC, queue_id=q) for q in (0, 1)]
        got = stub.LockBatchMQ(pb.LockBatchRequest(consumer_group=GROUP, client_id="grpc-C", queues=wire[:1]))
        assert [q.queue_id for q in got.queues] == [0]
        assert lock(client, "R", 0, 1) == [1]  # 0 is the gRPC consumer's
        got = stub.LockBatchMQ(pb.LockBatchRequest(consumer_group=GROUP, client_id="grpc-C", queues=wire))
        assert [q.queue_id for q in got.queues] == [0]  # 1 is the remoting consumer's


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"not json", WireCode.INVALID_PARAMETER),
        (b'{"consumerGroup":"orderly","clientId":"A","mqSet":{}}', WireCode.INVALID_PARAMETER),
        (b'{"consumerGroup":"orderly","clientId":"A","mqSet":[{"topic":"LockT","queueId":"x"}]}',
         WireCode.INVALID_PARAMETER),
        (b'{"consumerGroup":"orderly","clientId":"","mqSet":[{"topic":"LockT","queueId":0}]}',
         WireCode.INVALID_PARAMETER),
        (lock_body("A", 0, topic="NoSuchTopic"), WireCode.TOPIC_NOT_EXIST),
        (lock_body("A", 0, 7), WireCode.INVALID_PARAMETER),  # queue 7 of a topic of two: nothing locked
    ],
)
def test_a_refused_lock_locks_nothing(remoting_broker: BrokerController, client: RemotingClient, body: bytes,
                                      code: WireCode) -> None:
    r = client.invoke(RemotingCommand(RequestCode.LOCK_BATCH_MQ, body=body))
    assert r.code == code, r.remark
    assert remoting_broker.locks.locked_queues(GROUP) == {}


def test_a_slave_or_a_caller_without_rights_locks_nothing(broker_factory: Callable[..., BrokerController]) -> None:
    broker = auth_broker(broker_factory)
    with Admin(broker.address, access_key="root", secret_key=ROOT_SECRET) as admin:
        admin.create_topic(TOPIC, 2)
    table = message_processors(broker)
    try:
        refused = answered(call(table, LOCK_BATCH_MQ, {}, lock_body("A", 0), user="u"))
        assert refused.code == WireCode.NO_PERMISSION
        assert broker.locks.locked_queues(GROUP) == {}
        broker.gate.target = Slave()  # type: ignore[assignment]
        try:
            on_slave = answered(call(table, LOCK_BATCH_MQ, {}, lock_body("A", 0), user="root"))
        finally:
            broker.gate.target = None
        assert on_slave.code == WireCode.SERVICE_NOT_AVAILABLE and "master" in (on_slave.remark or "")
        assert broker.locks.locked_queues(GROUP) == {}
        ok = answered(call(table, LOCK_BATCH_MQ, {}, lock_body("A", 0), user="root"))
        assert ok.code == WireCode.SUCCESS and broker.locks.owner(GROUP, TOPIC, 0) == "A"
    finally:
        table.shutdown()
