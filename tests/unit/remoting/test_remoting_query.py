"""VIEW_MESSAGE_BY_ID and QUERY_MESSAGE on a broker's remoting port: what ``mqadmin queryMsgById`` and
``queryMsgByKey`` send, finding messages sent over remoting and over gRPC; the offset id a remoting send answers
names the remoting address, so a 4.x client that connects to the address in the id reaches this port."""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable

from admin_wire_helpers import Remoting, remoting_broker
from message_wire_helpers import pull_header

from broker.client import Admin, Message, Producer
from broker.format.message import POS_STORE_HOST
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, WireCode
from broker.remoting.command import RemotingCommand
from broker.remoting.message_entry import iter_stored, parse_offset_msg_id
from broker.server.broker_controller import BrokerController

__all__ = ["remoting_broker"]  # the fixture

VIEW, QUERY = RequestCode.VIEW_MESSAGE_BY_ID, RequestCode.QUERY_MESSAGE


def _dispatched(r: Remoting) -> None:
    assert r.broker.store is not None and r.broker.store.wait_dispatched()


def test_an_id_a_remoting_send_returned_finds_its_message_at_the_address_it_names(remoting_broker: Remoting) -> None:
    r = remoting_broker
    sent = r.send("QT", b"by-id", {"KEYS": "k1", "UNIQ_KEY": "U-1"})
    assert sent.code == WireCode.SUCCESS, sent.remark
    host, offset = parse_offset_msg_id(sent.ext_fields["msgId"])
    assert host == r.broker.remoting_address()  # not the gRPC port, which does not speak remoting
    _dispatched(r)
    with RemotingClient(host) as client:  # as a 4.x client does: to the address the id names
        answer = client.invoke(RemotingCommand(VIEW, ext_fields={"offset": str(offset)}))
    assert answer.code == WireCode.SUCCESS, answer.remark
    # the stored entry, its STOREHOST naming the remoting address (hand-built: IPv4 then the int32 port)
    assert r.broker.store is not None
    stored = r.broker.store.lookup_entry(offset)
    assert stored is not None and struct.unpack_from(">i", answer.body)[0] == len(answer.body) == len(stored)
    port = int(host.rpartition(":")[2])
    assert answer.body[POS_STORE_HOST : POS_STORE_HOST + 8] == socket.inet_aton("127.0.0.1") + struct.pack(">i", port)
    assert answer.body[:POS_STORE_HOST] == stored[:POS_STORE_HOST]
    assert answer.body[POS_STORE_HOST + 8 :] == stored[POS_STORE_HOST + 8 :]
    (m,) = iter_stored(answer.body)
    assert (m.body, m.topic, m.msg_id, m.properties["UNIQ_KEY"]) == (b"by-id", "QT", sent.ext_fields["msgId"], "U-1")


def test_a_grpc_sent_message_is_viewed_by_its_commit_log_offset(remoting_broker: Remoting) -> None:
    r = remoting_broker
    with Producer(r.endpoint) as producer:
        result = producer.send(Message("QT", b"over-grpc", keys=["order-9"]))
    _, offset = parse_offset_msg_id(result.msg_id)
    _dispatched(r)
    (m,) = iter_stored(r.call(VIEW, offset=str(offset)).body)
    assert (m.body, m.commitlog_offset) == (b"over-grpc", offset)
    assert m.store_host == r.broker.remoting_address()


def test_view_refusals(remoting_broker: Remoting) -> None:
    r = remoting_broker
    r.send("QT", b"x")
    _dispatched(r)
    nothing_there = r.call(VIEW, offset="7")  # inside the first entry: no entry starts there
    assert nothing_there.code == WireCode.QUERY_NOT_FOUND and nothing_there.body == b""
    assert r.call(VIEW, offset="-1").code == WireCode.INVALID_PARAMETER
    assert r.call(VIEW).code == WireCode.INVALID_PARAMETER  # offset is required


def test_query_by_key_finds_messages_of_both_protocols(remoting_broker: Remoting) -> None:
    r = remoting_broker
    over_remoting = r.send("QK", b"from-remoting", {"KEYS": "order-1 other", "UNIQ_KEY": "UNIQ-R"})
    with Producer(r.endpoint) as producer:
        over_grpc = producer.send(Message("QK", b"from-grpc", keys=["order-1"]))
        producer.send(Message("QK", b"unrelated", keys=["order-2"]))
    _dispatched(r)
    ext = {"topic": "QK", "key": "order-1", "maxNum": "32", "beginTimestamp": "0", "endTimestamp": str(2**62)}
    answer = r.call(QUERY, **ext)
    assert answer.code == WireCode.SUCCESS, answer.remark
    assert int(answer.ext_fields["indexLastUpdatePhyoffset"]) > 0 and int(answer.ext_fields["indexLastUpdateTimestamp"])
    found = {m.body: m for m in iter_stored(answer.body)}
    assert set(found) == {b"from-remoting", b"from-grpc"}
    assert found[b"from-remoting"].msg_id == over_remoting.ext_fields["msgId"]  # ids lead back to this port
    assert found[b"from-grpc"].commitlog_offset == parse_offset_msg_id(over_grpc.msg_id)[1]
    unique = r.call(QUERY, **{**ext, "key": "UNIQ-R", "_UNIQUE_KEY_QUERY": "true"})
    assert [m.body for m in iter_stored(unique.body)] == [b"from-remoting"]
    one = r.call(QUERY, **{**ext, "maxNum": "1"})
    assert len(list(iter_stored(one.body))) == 1
    missing = r.call(QUERY, **{**ext, "key": "no-such-key"})
    assert missing.code == WireCode.QUERY_NOT_FOUND and missing.body == b""
    assert "indexLastUpdatePhyoffset" in missing.ext_fields
    assert r.call(QUERY, **{**ext, "topic": "NoSuchTopic"}).code == WireCode.TOPIC_NOT_EXIST
    assert r.call(QUERY, **{**ext, "maxNum": "x"}).code == WireCode.INVALID_PARAMETER


def test_with_a_set_remoting_port_stored_entries_name_it_so_pulled_ids_lead_there_too(
    broker_factory: Callable[..., BrokerController],
) -> None:
    with socket.socket() as s:  # a free port to set (a port of 0 is only known once bound, after the store starts)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    broker = broker_factory(remoting_listen=f"127.0.0.1:{port}")
    endpoint, address = f"127.0.0.1:{broker.port}", f"127.0.0.1:{port}"
    with Producer(endpoint) as producer:
        result = producer.send(Message("PT", b"pulled"), queue_id=0)
    assert parse_offset_msg_id(result.msg_id)[0] == address  # the gRPC send's id names the remoting port too
    assert broker.store is not None and broker.store.wait_dispatched()
    with RemotingClient(address) as client:
        pulled = client.invoke(RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields=pull_header("pg", "PT", 0, 0)))
        assert pulled.code == WireCode.SUCCESS, pulled.remark
        (m,) = iter_stored(pulled.body)  # as stored: the offset id a 4.x consumer decodes
        assert (m.store_host, m.msg_id) == (address, result.msg_id)
        viewed = client.invoke(RemotingCommand(VIEW, ext_fields={"offset": str(m.commitlog_offset)}))
        assert viewed.body == broker.store.lookup_entry(m.commitlog_offset)
    with Admin(endpoint) as admin:  # Sluice's own lookup by id is not bound to the address in it
        assert admin.view_message(result.msg_id).body == b"pulled"
