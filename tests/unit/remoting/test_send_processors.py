"""SEND_MESSAGE, SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE through the remoting processors of an in-process broker:
read back by Sluice's own client, answered with RocketMQ's fields and codes, refused with nothing stored."""

from __future__ import annotations

import zlib
from collections.abc import Callable

from message_wire_helpers import (
    PULL_MESSAGE,
    SEND_BATCH_MESSAGE,
    SEND_MESSAGE,
    answered,
    auth_broker,
    call,
    pull_header,
    remoting,
    send,
    v2_header,
)

from broker.client import Message, Producer, PullConsumer, PullStatus
from broker.errors import ResponseCode
from broker.format.compression import compressed_body, inflated_body
from broker.format.message import decode_entry
from broker.remoting.message_batch import BatchItem, encode_batch
from broker.remoting.message_entry import iter_stored, parse_offset_msg_id
from broker.remoting.message_processors import MessageProcessors, message_processors
from broker.server.broker_controller import BrokerController

__all__ = ["remoting"]  # the fixture


def test_a_v2_send_is_read_back_by_sluices_pull(broker: BrokerController, endpoint: str,
                                               remoting: MessageProcessors) -> None:
    r = send(remoting, "RS", b"hello", {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "U1"})
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert (r.ext_fields["queueId"], r.ext_fields["queueOffset"], r.ext_fields["MSG_REGION"]) == ("0", "0",
                                                                                                  "DefaultRegion")
    host, offset = parse_offset_msg_id(r.ext_fields["msgId"])  # the offset id a 4.x client decodes
    assert broker.store is not None and broker.store.wait_dispatched()
    with PullConsumer(endpoint, "g") as c:
        got = c.pull("RS", 0, 0)
    assert got.status is PullStatus.FOUND and len(got.messages) == 1
    m = got.messages[0]
    assert (m.body, m.tags, m.keys, m.properties["UNIQ_KEY"]) == (b"hello", "TagA", ["k1", "k2"], "U1")
    assert m.msg_id == r.ext_fields["msgId"] and m.commitlog_offset == offset and host.endswith(f":{broker.port}")


def test_send_message_v1_long_names(broker: BrokerController, endpoint: str, remoting: MessageProcessors) -> None:
    header = {"producerGroup": "pg", "topic": "RS1", "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
              "queueId": "0", "sysFlag": "0", "bornTimestamp": "1700000000000", "flag": "3",
              "properties": "TAGS\x01T1\x02UNIQ_KEY\x01U9\x02", "reconsumeTimes": "0", "unitMode": "false"}
    r = answered(call(remoting, SEND_MESSAGE, header, b"v1"))
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert broker.store is not None and broker.store.wait_dispatched()
    with PullConsumer(endpoint, "g") as c:
        m = c.pull("RS1", 0, 0).messages[0]
    assert (m.body, m.flag, m.tags, m.born_timestamp) == (b"v1", 3, "T1", 1700000000000)


def test_a_batch_is_stored_whole_and_answered_with_every_offset_id(
    broker: BrokerController, endpoint: str, remoting: MessageProcessors
) -> None:
    items = [BatchItem(f"b{i}".encode(), 0, {"UNIQ_KEY": f"U{i}", "TAGS": "B"}) for i in range(3)]
    r = answered(call(remoting, SEND_BATCH_MESSAGE, {**v2_header("RB"), "m": "true"}, encode_batch(items)))
    assert r.code == ResponseCode.SUCCESS, r.remark
    ids = r.ext_fields["msgId"].split(",")
    assert len(ids) == 3 and r.ext_fields["queueOffset"] == "0"
    assert broker.store is not None and broker.store.wait_dispatched()
    with PullConsumer(endpoint, "g") as c:
        got = c.pull("RB", 0, 0).messages
    assert [(m.body, m.properties["UNIQ_KEY"], m.msg_id) for m in got] == [
        (b"b0", "U0", ids[0]), (b"b1", "U1", ids[1]), (b"b2", "U2", ids[2])]


def test_refused_sends_answer_their_code_and_store_nothing(broker: BrokerController, remoting: MessageProcessors
                                                           ) -> None:
    assert broker.store is not None
    before = broker.store.max_phys_offset()
    ILLEGAL = ResponseCode.MESSAGE_ILLEGAL
    cases: list[tuple[int, dict[str, str], bytes, ResponseCode, str]] = [
        (SEND_BATCH_MESSAGE, v2_header("RX"), b"\x00\x00\x00\x40" + bytes(18), ILLEGAL, "TOTALSIZE 64"),
        (SEND_BATCH_MESSAGE, v2_header("RX"), b"", ILLEGAL, "no messages"),
        (310, {k: v for k, v in v2_header("RX").items() if k != "b"}, b"x", ILLEGAL, "topic"),
        (310, {**v2_header("RX"), "e": "zero"}, b"x", ILLEGAL, "not an integer"),
        (310, v2_header("RX", sys_flag=0x8), b"x", ILLEGAL, "transaction type"),
        (310, v2_header("bad topic!"), b"x", ILLEGAL, "characters"),
        (310, v2_header("RMQ_SYS_TRANS_HALF_TOPIC"), b"x", ILLEGAL, "system topic"),
    ]
    for code, header, body, expected, says in cases:
        r = answered(call(remoting, code, header, body))
        assert (r.code, says in (r.remark or "")) == (expected, True), (header, r.remark)
    assert broker.store.max_phys_offset() == before
    assert broker.topics.get("RX") is None


def test_sluices_send_is_read_by_a_remoting_pull(broker: BrokerController, endpoint: str,
                                                remoting: MessageProcessors) -> None:
    with Producer(endpoint) as p:
        p.send_batch([Message("SR", f"m{i}".encode(), tags="T", keys=[f"k{i}"]) for i in range(3)], queue_id=0)
    assert broker.store is not None and broker.store.wait_dispatched()
    r = answered(call(remoting, PULL_MESSAGE, pull_header("g", "SR", 0, 0)))
    assert r.code == ResponseCode.SUCCESS
    assert (r.ext_fields["nextBeginOffset"], r.ext_fields["minOffset"], r.ext_fields["maxOffset"],
            r.ext_fields["suggestWhichBrokerId"]) == ("3", "0", "3", "0")
    got = list(iter_stored(r.body))  # as a 4.x client's MessageDecoder reads the body
    assert [(m.topic, m.body, m.properties["TAGS"], m.properties["KEYS"], m.queue_offset) for m in got] == [
        ("SR", f"m{i}".encode(), "T", f"k{i}", i) for i in range(3)]
    assert got[0] == decode_entry(r.body)  # the stored bytes, unchanged


def test_a_compressed_body_is_stored_as_sent_and_given_inflated_to_sluice_clients(
    broker: BrokerController, endpoint: str, remoting: MessageProcessors
) -> None:
    body = b"compress me " * 1000
    packed, bits = compressed_body(body)
    assert send(remoting, "RC", packed, {"UNIQ_KEY": "UC"}, sys_flag=bits).code == ResponseCode.SUCCESS
    assert broker.store is not None and broker.store.wait_dispatched()
    r = answered(call(remoting, PULL_MESSAGE, pull_header("g", "RC", 0, 0)))
    [m] = iter_stored(r.body)
    assert (m.body, m.sys_flag) == (packed, bits)
    assert inflated_body(m.sys_flag, m.body) == body == zlib.decompress(m.body)
    with PullConsumer(endpoint, "g") as c:  # Sluice's own client is given it inflated
        sluice = c.pull("RC", 0, 0).messages[0]
    assert (sluice.body, sluice.sys_flag, sluice.properties["UNIQ_KEY"]) == (body, 0, "UC")


def test_a_half_message_is_a_transaction_of_its_producer_group(broker: BrokerController,
                                                              remoting: MessageProcessors) -> None:
    r = send(remoting, "RT", b"half", {"UNIQ_KEY": "UH", "TRAN_MSG": "true", "PGROUP": "tpg"}, sys_flag=0x4,
             group="tpg")
    assert r.code == ResponseCode.SUCCESS, r.remark
    assert r.ext_fields["transactionId"]
    assert broker.store is not None and broker.store.wait_dispatched()
    assert broker.store.max_offset("RT", 0) == 0  # not visible until committed


def test_sends_need_pub_on_the_topic_with_auth(broker_factory: Callable[..., BrokerController]) -> None:
    broker = auth_broker(broker_factory)
    table = message_processors(broker)
    try:
        for user in (None, "u", "nobody"):
            r = send(table, "RA", b"x", user=user)
            assert r.code == ResponseCode.NO_PERMISSION, (user, r.remark)
        r = answered(call(table, SEND_BATCH_MESSAGE, v2_header("RA"), encode_batch([BatchItem(b"x")]), user="u"))
        assert r.code == ResponseCode.NO_PERMISSION
        broker.accounts.grant("u", "Topic:RA", ["Pub"])
        assert send(table, "RA", b"x", user="u").code == ResponseCode.SUCCESS
        assert send(table, "RA", b"y", user="root").code == ResponseCode.SUCCESS
        assert send(table, "RA2", b"y", user="u").code == ResponseCode.NO_PERMISSION
    finally:
        table.shutdown()


class ReplicationStandIn:
    """The replication manager as the broker's gate asks it (broker/ha/gate.py GateTarget): master or slave, and
    whether the in-sync replicas confirm a write."""

    def __init__(self, master: bool, confirms: bool = True) -> None:
        self.master, self.confirms = master, confirms
        self.waited: list[int] = []

    def is_master(self) -> bool:
        return self.master

    def identity_text(self) -> str:
        return "broker b (slave)"

    def admit_write(self) -> None:
        return None

    def log_end(self) -> int:
        return 0

    def entry_end(self, commitlog_offset: int) -> int:
        return commitlog_offset + 1

    def wrote(self, end_offset: int) -> bool:
        self.waited.append(end_offset)
        return self.confirms

    def metadata_changed(self) -> bool:
        return True


def test_replication_rules_apply_to_remoting_sends(broker: BrokerController, remoting: MessageProcessors) -> None:
    assert broker.store is not None
    broker.gate.target = slave = ReplicationStandIn(master=False)
    try:
        r = send(remoting, "RR", b"x")
        assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE and "master" in (r.remark or "")
        assert broker.store.max_phys_offset() == 0
        broker.gate.target = master = ReplicationStandIn(master=True, confirms=False)
        r = send(remoting, "RR", b"x")
        assert r.code == ResponseCode.FLUSH_SLAVE_TIMEOUT and r.ext_fields["msgId"]  # stored on the master
        assert master.waited == [parse_offset_msg_id(r.ext_fields["msgId"])[1] + 1]
        assert slave.waited == []
    finally:
        broker.gate.target = None
