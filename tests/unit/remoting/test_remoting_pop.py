"""POP_MESSAGE, ACK_MESSAGE and CHANGE_MESSAGE_INVISIBLETIME over the broker's remoting port: the broker's one set of
pop records, shared with the gRPC pop consumers (a message acked over remoting is not delivered again over gRPC),
answered with RocketMQ 5's PopMessageResponseHeader and each message's POP_CK set to Sluice's receipt handle."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from message_wire_helpers import ROOT_SECRET, Slave, answered, auth_broker, call

from broker.client import Admin, Message, PopConsumer, Producer
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, WireCode
from broker.remoting.command import RemotingCommand
from broker.remoting.message_entry import iter_stored
from broker.remoting.message_processors import message_processors
from broker.server.broker_controller import BrokerController

GROUP, TOPIC = "pop-g", "PopT"


@pytest.fixture
def remoting_broker(broker_factory: Callable[..., BrokerController]) -> BrokerController:
    broker = broker_factory(remoting_listen="127.0.0.1:0")
    with Admin(broker.address) as admin:
        admin.create_topic(TOPIC, 1)
    with Producer(broker.address) as producer:
        for body in (b"m1", b"m2"):
            producer.send(Message(TOPIC, body, tags="T"))
    assert broker.store is not None and broker.store.wait_dispatched()
    return broker


@pytest.fixture
def client(remoting_broker: BrokerController) -> Iterator[RemotingClient]:
    with RemotingClient(remoting_broker.config.remoting_listen) as c:
        yield c


def pop(client: RemotingClient, *, poll_ms: int = 0, invisible_ms: int = 60_000, exp: str = "*") -> RemotingCommand:
    header = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "-1", "maxMsgNums": "32",
              "invisibleTime": str(invisible_ms), "pollTime": str(poll_ms), "bornTime": str(int(time.time() * 1000)),
              "initMode": "0", "expType": "TAG", "exp": exp, "order": "false"}
    return client.invoke(RemotingCommand(RequestCode.POP_MESSAGE, ext_fields=header), timeout_s=5)


def receipt(client: RemotingClient, code: int, extra_info: str, **more: str) -> RemotingCommand:
    header = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "0", "offset": "0", "extraInfo": extra_info, **more}
    return client.invoke(RemotingCommand(code, ext_fields=header))


def test_pop_ack_and_change_invisible_time_round_trip(remoting_broker: BrokerController,
                                                      client: RemotingClient) -> None:
    r = pop(client)
    assert r.code == WireCode.SUCCESS, r.remark
    ext = r.ext_fields
    assert (ext["invisibleTime"], ext["reviveQid"], ext["startOffsetInfo"], ext["msgOffsetInfo"]) == (
        "60000", "0", "0 0 0", "0 0 0,1")
    assert abs(int(ext["popTime"]) - time.time() * 1000) < 10_000
    m1, m2 = iter_stored(r.body)
    assert (m1.body, m2.body, m1.topic, m1.tags, m1.queue_offset, m2.queue_offset) == (b"m1", b"m2", TOPIC, "T", 0, 1)
    assert pop(client).code == WireCode.PULL_NOT_FOUND  # both are out

    acked = receipt(client, RequestCode.ACK_MESSAGE, m1.properties["POP_CK"])
    assert acked.code == WireCode.SUCCESS, acked.remark
    twice = receipt(client, RequestCode.ACK_MESSAGE, m1.properties["POP_CK"])
    assert twice.code == WireCode.INVALID_PARAMETER  # the delivery is over

    changed = receipt(client, RequestCode.CHANGE_MESSAGE_INVISIBLETIME, m2.properties["POP_CK"], invisibleTime="0")
    assert changed.code == WireCode.SUCCESS, changed.remark
    assert changed.ext_fields["invisibleTime"] == "0" and changed.ext_fields["reviveQid"] == "0"
    new_handle = changed.ext_fields["extraInfo"]
    assert new_handle != m2.properties["POP_CK"]
    stale = receipt(client, RequestCode.ACK_MESSAGE, m2.properties["POP_CK"])
    assert stale.code == WireCode.INVALID_PARAMETER  # superseded by the change

    # visible again at once: a gRPC pop consumer of the group gets m2 (its second delivery), never the acked m1
    with PopConsumer(remoting_broker.address, GROUP) as grpc_consumer:
        got = grpc_consumer.receive(TOPIC, invisible_ms=60_000, wait_ms=2_000)
        assert [(p.message.body, p.delivery_attempt) for p in got] == [(b"m2", 2)]
        grpc_consumer.ack(got[0])
        assert grpc_consumer.receive(TOPIC, invisible_ms=60_000) == []


def test_a_held_pop_answers_when_a_message_arrives(remoting_broker: BrokerController, client: RemotingClient) -> None:
    assert pop(client).code == WireCode.SUCCESS  # takes m1 and m2
    started = time.monotonic()
    empty = pop(client, poll_ms=300)
    assert empty.code == WireCode.PULL_NOT_FOUND and time.monotonic() - started >= 0.25
    pending = client.invoke_async(RemotingCommand(RequestCode.POP_MESSAGE, ext_fields={
        "consumerGroup": GROUP, "topic": TOPIC, "queueId": "-1", "maxMsgNums": "32", "invisibleTime": "60000",
        "pollTime": "4000", "bornTime": "0", "initMode": "0"}))
    with Producer(remoting_broker.address) as producer:
        producer.send(Message(TOPIC, b"m3"))
    answer = pending.result_or_raise(5, client)
    assert answer.code == WireCode.SUCCESS, answer.remark
    assert [m.body for m in iter_stored(answer.body)] == [b"m3"]


@pytest.mark.parametrize(
    ("code", "extra_info", "more"),
    [
        # RocketMQ's own receipt form names a revive checkpoint Sluice does not keep: refused
        (RequestCode.ACK_MESSAGE, "0 1700000000000 60000 0 0 broker-a 0 0", {}),
        (RequestCode.ACK_MESSAGE, "", {}),
        (RequestCode.CHANGE_MESSAGE_INVISIBLETIME, "not-a-handle", {"invisibleTime": "1000"}),
    ],
)
def test_receipts_that_are_not_sluices_are_refused(
    remoting_broker: BrokerController, client: RemotingClient, code: int, extra_info: str, more: dict[str, str]
) -> None:
    assert receipt(client, code, extra_info, **more).code == WireCode.INVALID_PARAMETER
    r = pop(client)  # nothing was acked or changed: both messages are still there
    assert r.code == WireCode.SUCCESS and len(list(iter_stored(r.body))) == 2


def test_pop_refusals(remoting_broker: BrokerController, client: RemotingClient) -> None:
    assert pop(client, invisible_ms=5).code == WireCode.INVALID_PARAMETER  # under the broker's minimum
    missing = client.invoke(RemotingCommand(RequestCode.POP_MESSAGE, ext_fields={"consumerGroup": GROUP}))
    assert missing.code == WireCode.INVALID_PARAMETER
    assert pop(client).code == WireCode.SUCCESS  # refused pops took nothing


def test_a_slave_pops_nothing(remoting_broker: BrokerController, client: RemotingClient) -> None:
    remoting_broker.gate.target = Slave()  # type: ignore[assignment]
    try:
        on_slave = pop(client)
    finally:
        remoting_broker.gate.target = None
    assert on_slave.code == WireCode.SERVICE_NOT_AVAILABLE and "master" in (on_slave.remark or "")
    r = pop(client)  # it took nothing
    assert r.code == WireCode.SUCCESS and len(list(iter_stored(r.body))) == 2


def test_pop_needs_sub_on_the_group_and_topic_with_auth(broker_factory: Callable[..., BrokerController]) -> None:
    broker = auth_broker(broker_factory)
    with Admin(broker.address, access_key="root", secret_key=ROOT_SECRET) as admin:
        admin.create_topic(TOPIC, 1)
    table = message_processors(broker)
    header = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "-1", "maxMsgNums": "32", "invisibleTime": "60000",
              "pollTime": "0"}
    try:
        assert answered(call(table, RequestCode.POP_MESSAGE, header, user="u")).code == WireCode.NO_PERMISSION
        ack = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "0", "offset": "0", "extraInfo": "x"}
        assert answered(call(table, RequestCode.ACK_MESSAGE, ack, user="u")).code == WireCode.NO_PERMISSION
        assert answered(call(table, RequestCode.POP_MESSAGE, header, user="root")).code == WireCode.PULL_NOT_FOUND
    finally:
        table.shutdown()
