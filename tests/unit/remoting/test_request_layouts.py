"""Every request code the name server and the broker serve, sent as bytes written out by hand the way RocketMQ's Java
client 4.9.4 (version 401) puts them on the wire, and the answer's bytes read back by hand.

A request frame here is built from the documented layout (research notes §1-§3, §5-§6), never by Sluice's encoder:
the JSON header as fastjson writes ``RemotingCommand`` (bean keys sorted, ``extFields`` in the iteration order of
Java's ``HashMap``, which is what fastjson walks; values are the header fields' ``toString()``), and for the codes a
4.x client sends in binary when ``rocketmq.serialize.type=ROCKETMQ`` (sends, pulls, heartbeats, offsets) also the
21-byte ROCKETMQ header. It goes to the real remoting port of an in-process broker and name server; the answer is
checked byte by byte where RocketMQ fixes it (length prefix, serialization byte, header length) and by the header
fields the Java client reads for that code, with the response flag set and the request's opaque echoed.

``CASES`` is keyed by (server, code) and must cover the processor tables exactly: a newly served code fails
``test_every_served_code_has_a_layout_case`` until it has a case here.
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from broker.client import Admin
from broker.config import BrokerConfig
from broker.namesrv.name_server import NameServer
from broker.namesrv.remoting_processor import NameServerRemoting
from broker.namesrv.route_table import RouteTable
from broker.remoting import fastjson
from broker.remoting.admin_table import ADMIN_CODES
from broker.remoting.broker_table import broker_processors
from broker.remoting.client import RemotingClient
from broker.remoting.command import RemotingCommand
from broker.remoting.message_entry import iter_stored, parse_offset_msg_id
from broker.remoting.message_processors import MESSAGE_CODES
from broker.remoting.message_properties import format_properties
from broker.server.broker_controller import BrokerController
from tests.support.remoting_wire import send_v2
from tests.support.waiting import wait_until
from tests.unit.conftest import SMALL_STORE

JAVA, VERSION = 0, 401  # LanguageCode.JAVA; MQVersion.Version.V4_9_4.ordinal()
JSON_TYPE, ROCKETMQ_TYPE = 0, 1
FLAG_ONEWAY = 0b10  # RemotingCommand's RPC_ONEWAY bit
BROKER_NAME, TOPIC, GROUP = "broker-l", "LayoutT", "LayoutG"
SENT = 3  # messages in TOPIC's queue 0 before the cases run
NOW_MS = 1_700_000_000_000
LONG_MAX = str((1 << 63) - 1)


# -- what the Java client writes ---------------------------------------------------------------------------------


def java_string_hash(text: str) -> int:
    """String.hashCode() (the keys here are ASCII: one UTF-16 unit a character)."""
    h = 0
    for ch in text:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h


def hashmap_order(keys: list[str]) -> list[str]:
    """java.util.HashMap's iteration order for these keys put in this order: buckets ascending (the hash's high half
    folded in, table of 16 doubling past 3/4 full), insertion order within a bucket."""
    size = 16
    while len(keys) > size * 3 // 4:
        size *= 2

    def bucket(key: str) -> int:
        h = java_string_hash(key)
        return (h ^ (h >> 16)) & (size - 1)

    return sorted(keys, key=lambda k: (bucket(k), keys.index(k)))


# java.util.HashMap's iteration order for keys put in the order shown, as OpenJDK 17 printed it (keySet()): the
# pull header's fields, and 17 keys (a table grown to 32 buckets).
JAVA_ORDERS = {
    "consumerGroup,topic,queueId,queueOffset,maxMsgNums,sysFlag,commitOffset,suspendTimeoutMillis,subscription,"
    "subVersion,expressionType": "queueId,maxMsgNums,sysFlag,suspendTimeoutMillis,commitOffset,topic,queueOffset,"
    "expressionType,subscription,subVersion,consumerGroup",
    "k0,k1,k2,k3,k4,k5,k6,k7,k8,k9,k10,k11,k12,k13,k14,topic,queueId": "queueId,k0,k1,k2,k3,k4,k5,k11,k6,k10,k7,k13,"
    "k8,k12,k9,k14,topic",
}


def test_ext_fields_are_written_in_javas_hashmap_order() -> None:
    for put, iterated in JAVA_ORDERS.items():
        assert ",".join(hashmap_order(put.split(","))) == iterated


def json_string(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)  # fastjson escapes control characters as \uXXXX, as json does


def json_request(
    code: int, opaque: int, ext: dict[str, str], body: bytes = b"", flag: int = 0, version: int = VERSION
) -> bytes:
    keys = hashmap_order(list(ext))
    ext_text = "" if not ext else ('"extFields":{' + ",".join(f"{json_string(k)}:{json_string(ext[k])}"
                                                                for k in keys) + "},")
    header = (f'{{"code":{code},{ext_text}"flag":{flag},"language":"JAVA","opaque":{opaque},'
              f'"serializeTypeCurrentRPC":"JSON","version":{version}}}').encode()
    return struct.pack(">iI", 4 + len(header) + len(body), (JSON_TYPE << 24) | len(header)) + header + body


def binary_request(
    code: int, opaque: int, ext: dict[str, str], body: bytes = b"", flag: int = 0, version: int = VERSION
) -> bytes:
    block = b"".join(struct.pack(">h", len(k)) + k.encode() + struct.pack(">i", len(ext[k].encode())) + ext[k].encode()
                     for k in hashmap_order(list(ext)))
    header = struct.pack(">hBhii", code, JAVA, version, opaque, flag) + struct.pack(">i", 0)  # no remark
    header += struct.pack(">i", len(block)) + block
    return struct.pack(">iI", 4 + len(header) + len(body), (ROCKETMQ_TYPE << 24) | len(header)) + header + body


# -- what the Java client reads back -----------------------------------------------------------------------------


# RemotingCommand's JSON fields, and LanguageCode by ordinal (research §2)
HEADER_KEYS = {"code", "extFields", "flag", "language", "opaque", "remark", "serializeTypeCurrentRPC", "version"}
LANGUAGES = ("JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP", "OMS")


@dataclass
class Answer:
    kind: int
    code: int
    flag: int
    opaque: int
    remark: str | None
    ext: dict[str, str]
    body: bytes


def read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the server closed the connection"
        data += chunk
    return data


def read_answer(sock: socket.socket) -> Answer:
    (length,) = struct.unpack(">i", read_exactly(sock, 4))
    rest = read_exactly(sock, length)
    (word,) = struct.unpack(">I", rest[:4])
    kind, header_len = word >> 24, word & 0xFFFFFF
    header, body = rest[4 : 4 + header_len], rest[4 + header_len :]
    assert 4 + header_len <= length
    if kind == JSON_TYPE:
        h = json.loads(header)
        assert set(h) <= HEADER_KEYS, set(h) - HEADER_KEYS  # RemotingCommand's fields, which fastjson maps back
        assert h["language"] in LANGUAGES and all(isinstance(v, str) for v in h.get("extFields", {}).values())
        return Answer(kind, h["code"], h["flag"], h["opaque"], h.get("remark"), h.get("extFields", {}), body)
    assert kind == ROCKETMQ_TYPE, kind
    code, language, _version, opaque, flag = struct.unpack(">hBhii", header[:13])
    assert language < len(LANGUAGES), language
    (remark_len,) = struct.unpack(">i", header[13:17])
    remark = header[17 : 17 + remark_len].decode() if remark_len else None
    at = 17 + remark_len
    (ext_len,) = struct.unpack(">i", header[at : at + 4])
    at += 4
    end, ext = at + ext_len, {}
    assert end == len(header), "nothing follows the ext block"
    while at < end:
        (klen,) = struct.unpack(">h", header[at : at + 2])
        key = header[at + 2 : at + 2 + klen].decode()
        at += 2 + klen
        (vlen,) = struct.unpack(">i", header[at : at + 4])
        ext[key] = header[at + 4 : at + 4 + vlen].decode()
        at += 4 + vlen
    return Answer(kind, code, flag, opaque, remark, ext, body)


# -- the servers -------------------------------------------------------------------------------------------------


@dataclass
class World:
    broker: BrokerController
    ns: NameServer
    client: RemotingClient  # requests the cases need done before theirs (a heartbeat, a pop, a half message)
    sockets: dict[str, socket.socket] = field(default_factory=dict)
    opaques: Iterator[int] = field(default_factory=lambda: itertools.count(100))
    first_offset: int = 0  # commit-log offset of TOPIC's first message

    @property
    def port(self) -> int:
        assert self.broker.remoting is not None
        return self.broker.remoting.port

    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def msg_id(self, offset: int) -> str:
        return f"7F000001{self.port:08X}{offset:016X}"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root: Path = tmp_path_factory.mktemp("layouts")
    ns = NameServer("127.0.0.1", 0, allow_anonymous_registration=True, remoting_listen=("127.0.0.1", 0))
    ns.start()
    config = BrokerConfig(store={**SMALL_STORE}, listen="127.0.0.1:0", store_path=str(root / "store"),
                          remoting_listen="127.0.0.1:0", broker_name=BROKER_NAME, namesrv_addr=ns.address,
                          register_interval_ms=200)
    broker = BrokerController(config)
    broker.start()
    try:
        with Admin(f"127.0.0.1:{broker.port}") as admin:
            for topic in (TOPIC, "LayoutSend", "LayoutPop", "LayoutGone"):
                admin.create_topic(topic, 2)
        with RemotingClient(broker.remoting_address()) as client:
            w = World(broker, ns, client)
            sent = [send_v2(client, TOPIC, b"body-%d" % i, keys=[f"key{i}"], tags="TagA") for i in range(SENT)]
            w.first_offset = parse_offset_msg_id(sent[0].ext_fields["msgId"])[1]
            assert broker.store is not None and broker.store.wait_dispatched()
            wait_until(lambda: ns.table.route(TOPIC, int(time.time() * 1000)).remoting, "the broker's registration",
                       timeout_s=10)
            assert ns.remoting is not None
            for name, port in (("ns", ns.remoting.port), ("broker", w.port)):
                w.sockets[name] = socket.create_connection(("127.0.0.1", port), timeout=10)
            yield w
            for s in w.sockets.values():
                s.close()
    finally:
        problems = broker.store.check() if broker.store is not None else []
        broker.shutdown()
        ns.shutdown()
        assert problems == [], problems


def exchange(w: World, server: str, frame_of: Callable[[int], bytes]) -> tuple[int, Answer]:
    opaque = next(w.opaques)
    w.sockets[server].sendall(frame_of(opaque))
    while True:  # the broker's own one-way requests (NOTIFY_CONSUMER_IDS_CHANGED after a heartbeat) come between
        answer = read_answer(w.sockets[server])
        if answer.flag & 1:
            return opaque, answer
        assert (answer.code, answer.flag, set(answer.ext)) == (40, 2, {"consumerGroup"}), answer


# -- what each case needs done first (with Sluice's own remoting client: not what is under test) -------------------


def heartbeat_body(group: str, client_id: str) -> bytes:
    """HeartbeatData as fastjson writes it: fields sorted, enums by name, sets as arrays."""
    return (f'{{"clientID":"{client_id}","consumerDataSet":[{{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",'
            f'"consumeType":"CONSUME_PASSIVELY","groupName":"{group}","messageModel":"CLUSTERING",'
            f'"subscriptionDataSet":[{{"classFilterMode":false,"codeSet":[2598919],"expressionType":"TAG",'
            f'"subString":"TagA","subVersion":{NOW_MS},"tagsSet":["TagA"],"topic":"{TOPIC}"}}],"unitMode":false}}],'
            f'"producerDataSet":[{{"groupName":"CLIENT_INNER_PRODUCER"}}]}}').encode()


def joined(group: str) -> Callable[[World], dict[str, str]]:
    def prepare(w: World) -> dict[str, str]:
        answer = w.client.invoke(RemotingCommand(34, body=heartbeat_body(group, f"127.0.0.1@{group}")))
        assert answer.code == 0, answer.remark
        return {}

    return prepare


def committed(group: str, offset: int) -> Callable[[World], dict[str, str]]:
    def prepare(w: World) -> dict[str, str]:
        ext = {"consumerGroup": group, "topic": TOPIC, "queueId": "0", "commitOffset": str(offset)}
        assert w.client.invoke(RemotingCommand(15, ext_fields=ext)).code == 0
        return {}

    return prepare


def sent_message(w: World) -> dict[str, str]:
    answer = send_v2(w.client, "LayoutSend", b"back")
    return {"offset": str(parse_offset_msg_id(answer.ext_fields["msgId"])[1])}


def half_message(w: World) -> dict[str, str]:
    props = format_properties({"UNIQ_KEY": "LAYOUTHALF", "TRAN_MSG": "true", "PGROUP": "LayoutPG"}).rstrip("\x02")
    header = {"a": "LayoutPG", "b": "LayoutSend", "c": "TBW102", "d": "4", "e": "0", "f": "4", "g": str(NOW_MS),
              "h": "0", "i": props, "j": "0", "k": "false", "m": "false"}
    answer = w.client.invoke(RemotingCommand(310, ext_fields=header, body=b"half"))
    assert answer.code == 0, answer.remark
    return {"commitLogOffset": str(parse_offset_msg_id(answer.ext_fields["msgId"])[1]),
            "tranStateTableOffset": answer.ext_fields["queueOffset"],
            "transactionId": answer.ext_fields["transactionId"]}


def pop_ext(group: str) -> dict[str, str]:
    return {"consumerGroup": group, "topic": "LayoutPop", "queueId": "-1", "maxMsgNums": "1", "invisibleTime": "60000",
            "pollTime": "0", "bornTime": str(NOW_MS), "initMode": "0", "expType": "TAG", "exp": "*",
            "order": "false"}


def popped(group: str) -> Callable[[World], dict[str, str]]:
    def prepare(w: World) -> dict[str, str]:
        send_v2(w.client, "LayoutPop", b"pop-" + group.encode())
        answer = w.client.invoke(RemotingCommand(200050, ext_fields=pop_ext(group)))
        assert answer.code == 0, answer.remark
        [message] = list(iter_stored(answer.body))
        return {"extraInfo": message.properties["POP_CK"], "offset": str(message.queue_offset),
                "queueId": str(message.queue_id)}

    return prepare


def pop_ready(w: World) -> dict[str, str]:
    send_v2(w.client, "LayoutPop", b"pop-me")
    return {}


# -- the cases ---------------------------------------------------------------------------------------------------

DIGITS = re.compile(r"-?\d+")
Expected = str | re.Pattern[str]


@dataclass
class Case:
    ext: dict[str, str] = field(default_factory=dict)  # "{name}" values filled from what ``prepare`` returned
    answer: dict[str, Expected] = field(default_factory=dict)  # ext fields the client reads, and their values
    code: int = 0
    body: bytes = b""
    binary: bool = False  # a 4.x client sends this code in the ROCKETMQ header too when configured so
    prepare: Callable[[World], dict[str, str]] | None = None
    check_body: Callable[[World, bytes], bool] | None = None
    sent_to_queue: str | None = None  # a send: the queue its answer (what SendResult is built from) names
    version: int = VERSION  # the client's MQVersion ordinal


def v2(topic: str, queue_id: str, props: str, batch: bool = False) -> dict[str, str]:
    """SendMessageRequestHeaderV2 as a 4.9 producer fills it: l (maxReconsumeTimes) only on retries, k and m always
    (primitive booleans)."""
    return {"a": "LayoutPG", "b": topic, "c": "TBW102", "d": "4", "e": queue_id, "f": "0", "g": str(NOW_MS),
            "h": "0", "i": props, "j": "0", "k": "false", "m": str(batch).lower()}


PROPS = "UNIQ_KEY\x01AC11000100002A9F0000000000000001\x02WAIT\x01true\x02TAGS\x01TagA"


def batch_body() -> bytes:
    """Two messages in RocketMQ's batch encoding (research §6): size, magic 0, CRC 0, flag, body, properties."""
    out = b""
    for i in range(2):
        body = b"batch-%d" % i
        props = f"UNIQ_KEY\x01AC11000100002A9F00000000000000B{i}\x02WAIT\x01true".encode()
        entry = struct.pack(">iiii", 0, 0, 0, 0) + struct.pack(">i", len(body)) + body
        entry += struct.pack(">h", len(props)) + props
        out += struct.pack(">i", len(entry)) + entry[4:]
    return out


def sent_answer(w: World, queue_id: str) -> dict[str, Expected]:
    return {"msgId": re.compile(f"7F000001{w.port:08X}[0-9A-F]{{16}}"), "queueId": queue_id, "queueOffset": DIGITS,
            "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}


def pull_ext(sys_flag: int, group: str) -> dict[str, str]:
    return {"consumerGroup": group, "topic": TOPIC, "queueId": "0", "queueOffset": "0", "maxMsgNums": "32",
            "sysFlag": str(sys_flag), "commitOffset": "0", "suspendTimeoutMillis": "15000", "subscription": "TagA",
            "subVersion": str(NOW_MS), "expressionType": "TAG"}


def entries_at(w: World, body: bytes) -> list[tuple[int, int, int, bytes]]:
    """(queue offset, commit-log offset, store port, body) of each stored entry, read by the documented layout."""
    found, at = [], 0
    while at < len(body):
        (size,) = struct.unpack(">i", body[at : at + 4])
        entry = body[at : at + size]
        queue_offset, phys = struct.unpack(">qq", entry[20:36])
        store_ip, store_port = entry[64:68], struct.unpack(">i", entry[68:72])[0]
        assert store_ip == b"\x7f\x00\x00\x01"
        (body_len,) = struct.unpack(">i", entry[84:88])
        found.append((queue_offset, phys, store_port, entry[88 : 88 + body_len]))
        at += size
    return found


def mq_key(topic: str, queue_id: int) -> str:
    return f'{{"brokerName":"{BROKER_NAME}","queueId":{queue_id},"topic":"{topic}"}}'


LOCK_BODY = (f'{{"clientId":"127.0.0.1@lock","consumerGroup":"LayoutLock","mqSet":[{mq_key(TOPIC, 0)}]}}').encode()
SUB_GROUP_BODY = (b'{"brokerId":0,"consumeBroadcastEnable":true,"consumeEnable":true,"consumeFromMinEnable":true,'
                  b'"groupName":"LayoutSub","notifyConsumerIdsChangedEnable":true,"retryMaxTimes":16,'
                  b'"retryQueueNums":1,"whichBrokerWhenConsumeSlowly":1}')

CASES: dict[tuple[str, int], Case] = {
    # name server
    # a client before 4.9.4 (version 399) is given fastjson's bare integer keys (research §5, §9.1)
    ("ns", 105): Case(
        {"topic": TOPIC},
        version=399,
        check_body=lambda w, b: (
            f'"brokerAddrs":{{0:"{w.address()}"}}'.encode() in b
            and fastjson.loads(b)["brokerDatas"]
            == [{"brokerAddrs": {"0": w.address()}, "brokerName": BROKER_NAME, "cluster": "DefaultCluster"}]
        ),
    ),
    ("ns", 106): Case(
        check_body=lambda w, b: fastjson.loads(b)["clusterAddrTable"] == {"DefaultCluster": [BROKER_NAME]}
    ),
    ("ns", 206): Case(check_body=lambda w, b: TOPIC in json.loads(b)["topicList"]),
    ("ns", 101): Case({"namespace": "ORDER_TOPIC_CONFIG", "key": TOPIC}, code=22),
    ("ns", 216): Case({"topic": "LayoutNoSuch"}),
    # broker: sends
    ("broker", 10): Case(
        {
            "producerGroup": "LayoutPG",
            "topic": "LayoutSend",
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": "4",
            "queueId": "1",
            "sysFlag": "0",
            "bornTimestamp": str(NOW_MS),
            "flag": "0",
            "properties": PROPS,
            "reconsumeTimes": "0",
            "unitMode": "false",
            "batch": "false",
        },
        body=b"v1",
        sent_to_queue="1",
    ),
    ("broker", 310): Case(v2("LayoutSend", "0", PROPS), body=b"v2", binary=True, sent_to_queue="0"),
    ("broker", 320): Case(
        v2("LayoutSend", "1", "WAIT\x01true", batch=True),
        body=batch_body(),
        sent_to_queue="1",
        answer={"msgId": re.compile(r"[0-9A-F]{32},[0-9A-F]{32}")},
    ),
    # pulls and offsets
    ("broker", 11): Case(
        pull_ext(0x4 | 0x2, "LayoutPull"),
        binary=True,
        answer={"nextBeginOffset": str(SENT), "minOffset": "0", "maxOffset": str(SENT), "suggestWhichBrokerId": "0"},
        check_body=lambda w, b: (
            [(q, p - w.first_offset >= 0, port, data) for q, p, port, data in entries_at(w, b)]
            == [(i, True, w.port, b"body-%d" % i) for i in range(SENT)]
        ),
    ),
    ("broker", 14): Case(
        {"consumerGroup": "LayoutQ", "topic": TOPIC, "queueId": "0"},
        binary=True,
        prepare=committed("LayoutQ", 2),
        answer={"offset": "2"},
    ),
    ("broker", 15): Case(
        {"consumerGroup": "LayoutU", "topic": TOPIC, "queueId": "0", "commitOffset": "1"}, binary=True
    ),
    ("broker", 30): Case({"topic": TOPIC, "queueId": "0"}, binary=True, answer={"offset": str(SENT)}),
    ("broker", 31): Case({"topic": TOPIC, "queueId": "0"}, binary=True, answer={"offset": "0"}),
    ("broker", 32): Case({"topic": TOPIC, "queueId": "0"}, answer={"timestamp": re.compile(r"\d{13}")}),
    ("broker", 29): Case({"topic": TOPIC, "queueId": "0", "timestamp": "0"}, answer={"offset": "0"}),
    # membership
    ("broker", 34): Case(body=heartbeat_body("LayoutHB", "127.0.0.1@hb"), binary=True),
    ("broker", 35): Case({"clientID": "127.0.0.1@hb", "consumerGroup": "LayoutHB"}),
    ("broker", 38): Case(
        {"consumerGroup": "LayoutList"},
        prepare=joined("LayoutList"),
        check_body=lambda w, b: json.loads(b) == {"consumerIdList": ["127.0.0.1@LayoutList"]},
    ),
    ("broker", 36): Case(
        {
            "offset": "{offset}",
            "group": "LayoutBack",
            "delayLevel": "0",
            "originMsgId": "ORIGIN",
            "originTopic": "LayoutSend",
            "unitMode": "false",
            "maxReconsumeTimes": "16",
        },
        prepare=sent_message,
    ),
    ("broker", 37): Case(
        {
            "producerGroup": "LayoutPG",
            "tranStateTableOffset": "{tranStateTableOffset}",
            "commitLogOffset": "{commitLogOffset}",
            "commitOrRollback": "8",
            "fromTransactionCheck": "false",
            "msgId": "LAYOUTHALF",
            "transactionId": "{transactionId}",
        },
        prepare=half_message,
    ),
    ("broker", 41): Case(
        body=LOCK_BODY, check_body=lambda w, b: json.loads(b) == {"lockOKMQSet": [json.loads(mq_key(TOPIC, 0))]}
    ),
    ("broker", 42): Case(body=LOCK_BODY),
    # pops (JSON headers only: the codes do not fit the binary header's int16)
    ("broker", 200050): Case(
        pop_ext("LayoutPop1"),
        prepare=pop_ready,
        answer={
            "popTime": re.compile(r"\d{13}"),
            "invisibleTime": "60000",
            "reviveQid": "0",
            "restNum": DIGITS,
            "startOffsetInfo": re.compile(r"0 [01] \d+"),
            "msgOffsetInfo": re.compile(r"0 [01] \d+"),
            "orderCountInfo": re.compile(".*"),
        },
    ),
    ("broker", 200051): Case(
        {
            "consumerGroup": "LayoutAck",
            "topic": "LayoutPop",
            "queueId": "{queueId}",
            "extraInfo": "{extraInfo}",
            "offset": "{offset}",
        },
        prepare=popped("LayoutAck"),
    ),
    ("broker", 200053): Case(
        {
            "consumerGroup": "LayoutChg",
            "topic": "LayoutPop",
            "queueId": "{queueId}",
            "extraInfo": "{extraInfo}",
            "offset": "{offset}",
            "invisibleTime": "30000",
        },
        prepare=popped("LayoutChg"),
        answer={"popTime": re.compile(r"\d{13}"), "invisibleTime": "30000", "reviveQid": "0"},
    ),
    # lookups
    ("broker", 33): Case(
        {"offset": "{offset}"},
        prepare=lambda w: {"offset": str(w.first_offset)},
        check_body=lambda w, b: entries_at(w, b) == [(0, w.first_offset, w.port, b"body-0")],
    ),
    ("broker", 12): Case(
        {
            "topic": TOPIC,
            "key": "key1",
            "maxNum": "32",
            "beginTimestamp": "0",
            "endTimestamp": LONG_MAX,
            "_UNIQUE_KEY_QUERY": "false",
        },
        answer={"indexLastUpdateTimestamp": DIGITS, "indexLastUpdatePhyoffset": DIGITS},
        check_body=lambda w, b: [e[3] for e in entries_at(w, b)] == [b"body-1"],
    ),
    ("broker", 105): Case(
        {"topic": TOPIC},
        check_body=lambda w, b: (
            json.loads(b)["queueDatas"]
            == [{"brokerName": BROKER_NAME, "perm": 6, "readQueueNums": 2, "topicSysFlag": 0, "writeQueueNums": 2}]
        ),
    ),
    # mqadmin
    ("broker", 17): Case(
        {
            "topic": "LayoutMade",
            "defaultTopic": "TBW102",
            "readQueueNums": "4",
            "writeQueueNums": "4",
            "perm": "6",
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": "0",
            "order": "false",
        }
    ),
    ("broker", 215): Case({"topic": "LayoutGone"}),
    ("broker", 202): Case(
        {"topic": TOPIC},
        check_body=lambda w, b: (
            (mq_key(TOPIC, 0) + f':{{"lastUpdateTimestamp":0,"maxOffset":{SENT},"minOffset":0}}').encode() in b
        ),
    ),
    ("broker", 28): Case(
        check_body=lambda w, b: {"putTps", "getTransferedTps", "commitLogMaxOffset"} <= set(json.loads(b)["table"])
    ),
    ("broker", 200): Case(body=SUB_GROUP_BODY),
    ("broker", 203): Case(
        {"consumerGroup": "LayoutConn"},
        prepare=joined("LayoutConn"),
        check_body=lambda w, b: [c["clientId"] for c in fastjson.loads(b)["connectionSet"]] == ["127.0.0.1@LayoutConn"],
    ),
    ("broker", 208): Case(
        {"consumerGroup": "LayoutStats", "topic": TOPIC},
        prepare=committed("LayoutStats", 1),
        check_body=lambda w, b: (mq_key(TOPIC, 0) + f':{{"brokerOffset":{SENT},"consumerOffset":1').encode() in b,
    ),
    ("broker", 222): Case(
        {"topic": TOPIC, "group": "LayoutReset", "timestamp": "0", "isForce": "true"},
        prepare=committed("LayoutReset", 3),
        check_body=lambda w, b: (mq_key(TOPIC, 0) + ":0").encode() in b,
    ),
}


def served() -> set[tuple[str, int]]:
    namesrv = NameServerRemoting(RouteTable(), lambda: 0).processors()
    broker = broker_processors(SimpleNamespace(admin=None))  # type: ignore[arg-type]  # building needs no broker
    return {("ns", int(c)) for c in namesrv} | {("broker", int(c)) for c in [*broker, *MESSAGE_CODES, *ADMIN_CODES]}


def test_every_served_code_has_a_layout_case() -> None:
    assert set(CASES) == served()


RUNS = [(server, code, kind) for (server, code), case in CASES.items()
        for kind in ([JSON_TYPE, ROCKETMQ_TYPE] if case.binary else [JSON_TYPE])]


def fill(template: dict[str, str], values: dict[str, str]) -> dict[str, str]:
    return {k: v.format(**values) if v.startswith("{") and v.endswith("}") else v for k, v in template.items()}


RUN_IDS = [f"{server}-{code}-{'binary' if kind else 'json'}" for server, code, kind in RUNS]


@pytest.mark.parametrize(("server", "code", "kind"), RUNS, ids=RUN_IDS)
def test_request_as_the_java_client_writes_it_is_answered_as_it_reads_it(
    world: World, server: str, code: int, kind: int
) -> None:
    case = CASES[(server, code)]
    values = case.prepare(world) if case.prepare is not None else {}
    ext = fill(case.ext, values)
    build = binary_request if kind == ROCKETMQ_TYPE else json_request
    opaque, answer = exchange(world, server, lambda o: build(code, o, ext, case.body, version=case.version))
    assert (answer.kind, answer.flag & 1, answer.opaque) == (kind, 1, opaque)
    assert answer.code == case.code, answer.remark
    expected = dict(case.answer)
    if case.sent_to_queue is not None:
        expected = {**sent_answer(world, case.sent_to_queue), **expected}
    for key, want in expected.items():
        assert key in answer.ext, (key, answer.ext)
        got = answer.ext[key]
        if isinstance(want, re.Pattern):
            assert want.fullmatch(got), (key, got)
        else:
            assert got == want, (key, got)
    if case.check_body is not None:
        assert case.check_body(world, answer.body), answer.body[:400]


def test_one_way_requests_get_no_answer_and_still_apply(world: World) -> None:
    """The consumer's periodic offset persist (UPDATE_CONSUMER_OFFSET) is sent one-way (flag bit 1), in either
    header: nothing comes back, and the next answer on the connection is the next request's."""
    for group, build in (("LayoutOneWayJ", json_request), ("LayoutOneWayB", binary_request)):
        ext = {"consumerGroup": group, "topic": TOPIC, "queueId": "0", "commitOffset": "2"}
        world.sockets["broker"].sendall(build(15, next(world.opaques), ext, flag=FLAG_ONEWAY))
        query = {"consumerGroup": group, "topic": TOPIC, "queueId": "0"}

        def stored(q: dict[str, str] = query) -> bool:
            """The one-way request runs on a worker of its own, so the query may overtake it: asked again until
            it reads the commit. Any answer to the one-way one would come first, under another opaque."""
            opaque, answer = exchange(world, "broker", lambda o: json_request(14, o, q))
            assert answer.opaque == opaque and answer.code in (0, 22), answer
            return answer.ext == {"offset": "2"}

        wait_until(stored, "the one-way commit applied", timeout_s=5, interval_s=0.02)
