"""Transactions over the broker's remoting port, as a 4.x transactional producer runs them: a half message sent with
sysFlag PREPARED is invisible until END_TRANSACTION commits it (then Sluice's gRPC pull reads it) or rolls it back
(nothing); a producer that does not decide is asked with CHECK_TRANSACTION_STATE over the connection its heartbeat
came on, and its END_TRANSACTION (fromTransactionCheck) decides."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator

import pytest
from message_wire_helpers import FakePeer, Slave, answered, auth_broker, call, v2_header

from broker.client import PullConsumer, PullStatus
from broker.format.message import SysFlag
from broker.remoting import fastjson
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, WireCode
from broker.remoting.command import RemotingCommand
from broker.remoting.message_entry import iter_stored, parse_offset_msg_id
from broker.remoting.message_processors import message_processors
from broker.remoting.message_properties import format_properties
from broker.remoting.processor import RequestContext
from broker.server.broker_controller import BrokerController
from tests.support.waiting import wait_until

GROUP = "txn-pg"
COMMIT, ROLLBACK, UNKNOWN = "8", "12", "0"
ProducerLink = tuple[RemotingClient, "queue.Queue[RemotingCommand]"]  # a connection, and the checks it was sent


@pytest.fixture
def remoting_broker(broker_factory: Callable[..., BrokerController]) -> BrokerController:
    # Idle at once (1 ms), and the check loop left to the test (one pass a minute on its own).
    return broker_factory(remoting_listen="127.0.0.1:0", transaction_timeout_ms=1)


@pytest.fixture
def producer(remoting_broker: BrokerController) -> Iterator[ProducerLink]:
    checks: queue.Queue[RemotingCommand] = queue.Queue()
    with RemotingClient(remoting_broker.config.remoting_listen, on_request=checks.put) as client:
        yield client, checks


def send_half(client: RemotingClient, topic: str, body: bytes, uniq: str) -> RemotingCommand:
    props = format_properties({"UNIQ_KEY": uniq, "TRAN_MSG": "true", "PGROUP": GROUP}).rstrip("\x02")
    header = v2_header(topic, props, sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE, group=GROUP)
    r = client.invoke(RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=header, body=body))
    assert r.code == WireCode.SUCCESS, r.remark
    return r


def end(client: RemotingClient, sent: RemotingCommand, kind: str, *, from_check: bool = False,
        oneway: bool = True) -> RemotingCommand | None:
    """END_TRANSACTION as the Java producer builds it from its send result (the offset from the offset id)."""
    _, offset = parse_offset_msg_id(sent.ext_fields["msgId"])
    header = {"producerGroup": GROUP, "tranStateTableOffset": sent.ext_fields["queueOffset"],
              "commitLogOffset": str(offset), "commitOrRollback": kind, "fromTransactionCheck": str(from_check).lower(),
              "msgId": "U", "transactionId": sent.ext_fields["transactionId"]}
    command = RemotingCommand(RequestCode.END_TRANSACTION, ext_fields=header)
    if oneway:
        client.invoke_oneway(command)
        return None
    return client.invoke(command)


def visible(broker: BrokerController, topic: str) -> list[bytes]:
    with PullConsumer(broker.address, "reader") as c:
        got = c.pull(topic, 0, 0)
    return [m.body for m in got.messages] if got.status is PullStatus.FOUND else []


def test_a_half_is_invisible_until_end_transaction_commits_it(
    remoting_broker: BrokerController, producer: ProducerLink
) -> None:
    client, _ = producer
    sent = send_half(client, "TxC", b"order-1", "U1")
    assert remoting_broker.store is not None and remoting_broker.store.wait_dispatched()
    assert visible(remoting_broker, "TxC") == []
    end(client, sent, COMMIT)  # one-way, as the producer sends it
    wait_until(lambda: visible(remoting_broker, "TxC") == [b"order-1"], "the committed message", timeout_s=5)
    # a late duplicate of the same decision (answered when asked) changes nothing
    again = end(client, sent, COMMIT, oneway=False)
    assert again is not None and again.code == WireCode.SUCCESS, again.remark
    assert visible(remoting_broker, "TxC") == [b"order-1"]


def test_rollback_leaves_nothing_and_unknown_keeps_it_open(
    remoting_broker: BrokerController, producer: ProducerLink
) -> None:
    client, _ = producer
    sent = send_half(client, "TxR", b"gone", "U2")
    r = end(client, sent, UNKNOWN, oneway=False)  # "not known yet": stays open
    assert r is not None and r.code == WireCode.SUCCESS
    assert remoting_broker.transactions is not None
    [open_txn] = remoting_broker.transactions.list_transactions(sent.ext_fields["transactionId"])
    assert open_txn.status.value == "OPEN"
    r = end(client, sent, ROLLBACK, oneway=False)
    assert r is not None and r.code == WireCode.SUCCESS, r.remark
    assert remoting_broker.store is not None and remoting_broker.store.wait_dispatched()
    assert visible(remoting_broker, "TxR") == []
    [ended] = remoting_broker.transactions.list_transactions(sent.ext_fields["transactionId"])
    assert ended.status.value == "ROLLED_BACK"


def test_refusals_are_answered_with_their_codes(remoting_broker: BrokerController, producer: ProducerLink) -> None:
    client, _ = producer
    sent = send_half(client, "TxX", b"x", "U3")
    bad_kind = end(client, sent, "5", oneway=False)
    assert bad_kind is not None and bad_kind.code == WireCode.INVALID_PARAMETER
    nothing_there = RemotingCommand(RequestCode.END_TRANSACTION, ext_fields={
        "producerGroup": GROUP, "commitLogOffset": "999999", "commitOrRollback": COMMIT, "tranStateTableOffset": "0",
        "msgId": "U"})
    assert client.invoke(nothing_there).code == WireCode.QUERY_NOT_FOUND
    missing = client.invoke(RemotingCommand(RequestCode.END_TRANSACTION, ext_fields={"producerGroup": GROUP}))
    assert missing.code == WireCode.INVALID_PARAMETER
    assert visible(remoting_broker, "TxX") == []  # still open, still invisible


def heartbeat(client: RemotingClient, *groups: str) -> None:
    body = {"clientID": "127.0.0.1@txn", "producerDataSet": [{"groupName": g} for g in groups],
            "consumerDataSet": []}
    r = client.invoke(RemotingCommand(RequestCode.HEART_BEAT, body=fastjson.dumps(body, standard=True)))
    assert r.code == WireCode.SUCCESS, r.remark


def test_an_undecided_producer_is_checked_back_and_its_answer_decides(
    remoting_broker: BrokerController, producer: ProducerLink
) -> None:
    client, checks = producer
    heartbeat(client, GROUP, "CLIENT_INNER_PRODUCER")
    sent = send_half(client, "TxK", b"checked", "U4")
    assert remoting_broker.transactions is not None
    assert remoting_broker.transactions.check_once() == 1
    check = checks.get(timeout=5)
    assert check.code == RequestCode.CHECK_TRANSACTION_STATE and check.is_oneway
    _, offset = parse_offset_msg_id(sent.ext_fields["msgId"])
    ext = check.ext_fields
    assert (ext["transactionId"], ext["commitLogOffset"], ext["msgId"]) == (
        sent.ext_fields["transactionId"],
        str(offset),
        "U4",
    )
    assert ext["offsetMsgId"] == sent.ext_fields["msgId"] and ext["tranStateTableOffset"].isdigit()
    [half] = iter_stored(check.body)  # the half as sent: its real topic, its group for the client to pick
    assert (half.topic, half.queue_id, half.body, half.properties["PGROUP"]) == ("TxK", 0, b"checked", GROUP)
    # the producer's answer, as the Java client sends it: one-way, the check's offsets echoed
    client.invoke_oneway(RemotingCommand(RequestCode.END_TRANSACTION, ext_fields={
        "producerGroup": GROUP, "tranStateTableOffset": ext["tranStateTableOffset"],
        "commitLogOffset": ext["commitLogOffset"], "commitOrRollback": COMMIT, "fromTransactionCheck": "true",
        "msgId": "U4", "transactionId": ext["transactionId"]}))
    wait_until(lambda: visible(remoting_broker, "TxK") == [b"checked"], "the message the check committed",
               timeout_s=5)


def test_checks_go_only_to_the_groups_live_connections(
    remoting_broker: BrokerController, producer: ProducerLink
) -> None:
    client, checks = producer
    heartbeat(client, "another-group")
    send_half(client, "TxN", b"n", "U5")
    assert remoting_broker.transactions is not None and remoting_broker.remoting_messages is not None
    assert remoting_broker.transactions.check_once() == 1
    with pytest.raises(queue.Empty):
        checks.get(timeout=0.3)  # this connection produces for another group only
    producers = remoting_broker.remoting_messages.producers
    assert producers is not None
    heartbeat(client, GROUP)
    assert producers.live(GROUP) == 1
    client.invoke(RemotingCommand(RequestCode.UNREGISTER_CLIENT, ext_fields={"clientID": "127.0.0.1@txn",
                                                                           "producerGroup": GROUP}))
    assert producers.live(GROUP) == 0
    heartbeat(client, GROUP)
    client.close()
    wait_until(lambda: producers.live(GROUP) == 0, "the closed connection dropped", timeout_s=5)


def test_a_slave_refuses_end_transaction(remoting_broker: BrokerController, producer: ProducerLink) -> None:
    client, _ = producer
    sent = send_half(client, "TxS", b"s", "U6")
    remoting_broker.gate.target = Slave()  # type: ignore[assignment]
    try:
        r = end(client, sent, COMMIT, oneway=False)
        assert r is not None and r.code == WireCode.SERVICE_NOT_AVAILABLE, r.remark
    finally:
        remoting_broker.gate.target = None
    assert remoting_broker.transactions is not None
    [still] = remoting_broker.transactions.list_transactions(sent.ext_fields["transactionId"])
    assert still.status.value == "OPEN"


def test_with_auth_ends_and_checks_need_the_groups_rights(broker_factory: Callable[..., BrokerController]) -> None:
    broker = auth_broker(broker_factory, transaction_timeout_ms=1)
    assert broker.transactions is not None
    table = message_processors(broker)
    broker.remoting_messages = table  # as _start_remoting wires it (the port itself is not served with auth yet)
    try:
        props = format_properties({"UNIQ_KEY": "UA", "TRAN_MSG": "true", "PGROUP": GROUP}).rstrip("\x02")
        header = v2_header("TxA", props, sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE, group=GROUP)
        sent = answered(call(table, RequestCode.SEND_MESSAGE_V2, header, b"a", user="root"))
        assert sent.code == WireCode.SUCCESS, sent.remark
        _, offset = parse_offset_msg_id(sent.ext_fields["msgId"])
        ending = {"producerGroup": GROUP, "commitLogOffset": str(offset), "commitOrRollback": COMMIT,
                  "tranStateTableOffset": "0", "msgId": "UA"}
        refused = answered(call(table, RequestCode.END_TRANSACTION, ending, user="u"))
        assert refused.code == WireCode.NO_PERMISSION
        [still] = broker.transactions.list_transactions(sent.ext_fields["transactionId"])
        assert still.status.value == "OPEN"
        # a check goes only to a connection whose user may end the group's transactions and publish to the topic
        producers = table.producers
        assert producers is not None
        no_rights, root = FakePeer("127.0.0.1:1"), FakePeer("127.0.0.1:2")
        beat = fastjson.dumps({"clientID": "c", "producerDataSet": [{"groupName": GROUP}]}, standard=True)
        for peer, user in ((no_rights, "u"), (root, "root")):
            heard = table.table[RequestCode.HEART_BEAT].process(RemotingCommand(RequestCode.HEART_BEAT, body=beat),
                                                                RequestContext(peer, user))
            assert isinstance(heard, RemotingCommand) and heard.code == WireCode.SUCCESS
        assert broker.transactions.check_once() == 1
        assert no_rights.sent == [] and [c.code for c in root.sent] == [RequestCode.CHECK_TRANSACTION_STATE]
        ok = answered(call(table, RequestCode.END_TRANSACTION, ending, user="root"))
        assert ok.code == WireCode.SUCCESS, ok.remark
    finally:
        broker.remoting_messages = None
        table.shutdown()
