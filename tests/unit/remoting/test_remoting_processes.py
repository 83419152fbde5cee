"""Remoting against real processes: a ``sluice namesrv`` and a ``sluice broker`` started with ``--remoting-listen``,
the broker registered with the name server. Routes for remoting clients name the broker's remoting address; the
broker answers the offset, heartbeat and consumer-list codes over the same state its gRPC port serves; malformed
frames close only their own connection."""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.client import Admin, Message, Producer
from broker.namesrv.local_cluster import NameServerProcess
from broker.remoting import fastjson
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, WireCode
from broker.remoting.command import RemotingCommand, SerializeType
from broker.server.process import BrokerProcess
from tests.support.cluster import REGISTER_INTERVAL_MS, small_store_config
from tests.support.waiting import wait_until

TOPIC = "RemoTopic"


@dataclass
class Processes:
    namesrv: NameServerProcess
    broker: BrokerProcess


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    root: Path = tmp_path_factory.mktemp("remoting")
    ns = NameServerProcess(extra_args=["--remoting-listen", "127.0.0.1:0"]).start()
    broker = BrokerProcess(root / "store", config=small_store_config(root, register_interval_ms=REGISTER_INTERVAL_MS),
                           extra_args=["--namesrv", ns.address, "--broker-name", "broker-r",
                                       "--remoting-listen", "127.0.0.1:0"])
    try:
        broker.start()
        with Admin(broker.endpoint) as admin:
            admin.create_topic(TOPIC, 2)
        yield Processes(ns, broker)
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.stop()
        ns.stop()


def route(client: RemotingClient, topic: str, **ext: str) -> RemotingCommand:
    return client.invoke(RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": topic, **ext}))


def test_ready_lines_name_the_remoting_addresses(procs: Processes) -> None:
    assert procs.namesrv.remoting_address and procs.namesrv.remoting_address != procs.namesrv.address
    assert procs.broker.remoting_endpoint and procs.broker.remoting_endpoint != procs.broker.endpoint


def test_route_names_the_brokers_remoting_address(procs: Processes) -> None:
    with RemotingClient(procs.namesrv.remoting_address) as ns:
        wait_until(lambda: route(ns, TOPIC).code == WireCode.SUCCESS, "the topic's route", timeout_s=10)
        old = route(ns, TOPIC)  # a client before 4.9.4: bare integer keys, as fastjson writes them
        assert b'"brokerAddrs":{0:"' + procs.broker.remoting_endpoint.encode() + b'"}' in old.body
        standard = route(ns, TOPIC, acceptStandardJsonOnly="true")
        data = json.loads(standard.body)
        assert data == {
            "brokerDatas": [{"brokerAddrs": {"0": procs.broker.remoting_endpoint}, "brokerName": "broker-r",
                             "cluster": "DefaultCluster"}],
            "filterServerTable": {},
            "queueDatas": [{"brokerName": "broker-r", "perm": 6, "readQueueNums": 2, "topicSysFlag": 0,
                            "writeQueueNums": 2}],
        }
        binary = ns.invoke(RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, version=401,
                                           ext_fields={"topic": TOPIC}, serialize_type=SerializeType.ROCKETMQ))
        assert binary.serialize_type == SerializeType.ROCKETMQ and json.loads(binary.body) == data
        missing = route(ns, "NoSuchTopic")
        assert missing.code == WireCode.TOPIC_NOT_EXIST and missing.body == b""


def test_cluster_info_topic_list_and_kv_config(procs: Processes) -> None:
    with RemotingClient(procs.namesrv.remoting_address) as ns:
        wait_until(lambda: route(ns, TOPIC).code == WireCode.SUCCESS, "the topic's route", timeout_s=10)
        info = fastjson.loads(ns.invoke(RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO)).body)
        assert info["clusterAddrTable"] == {"DefaultCluster": ["broker-r"]}
        assert info["brokerAddrTable"]["broker-r"]["brokerAddrs"] == {"0": procs.broker.remoting_endpoint}
        topics = json.loads(ns.invoke(RemotingCommand(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)).body)
        assert TOPIC in topics["topicList"]
        kv = ns.invoke(RemotingCommand(RequestCode.GET_KV_CONFIG, ext_fields={"namespace": "ORDER_TOPIC_CONFIG",
                                                                               "key": TOPIC}))
        assert kv.code == WireCode.QUERY_NOT_FOUND


def test_unknown_codes_are_not_supported(procs: Processes) -> None:
    for address in (procs.namesrv.remoting_address, procs.broker.remoting_endpoint):
        with RemotingClient(address) as client:
            answer = client.invoke(RemotingCommand(RequestCode.REGISTER_BROKER))
            assert answer.code == WireCode.REQUEST_CODE_NOT_SUPPORTED


MALFORMED = {
    "over the frame limit": struct.pack(">i", 0x7FFFFFF0),
    "negative frame length": struct.pack(">i", -8),
    "oversized header length": struct.pack(">iI", 6, 0x00FFFFFF) + b"{}",
    "unknown serialization type": struct.pack(">iI", 6, (9 << 24) | 2) + b"{}",
    "header that does not parse": struct.pack(">iI", 9, 5) + b"{code",
    "truncated frame": struct.pack(">iI", 100, 2) + b"{}",
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_frame_closes_its_connection_and_the_name_server_serves_on(procs: Processes, case: str) -> None:
    with RemotingClient(procs.namesrv.remoting_address) as good:
        with RemotingClient(procs.namesrv.remoting_address) as bad:
            bad.send_raw(MALFORMED[case])
            if case == "truncated frame":  # the rest never comes: the writer gives up and closes
                bad.close()
            else:
                wait_until(lambda: bad.closed, "the name server to close the connection", timeout_s=5)
        assert good.invoke(RemotingCommand(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)).code == 0
    with RemotingClient(procs.namesrv.remoting_address) as another:
        assert another.invoke(RemotingCommand(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)).code == 0
    assert procs.namesrv.running


def offset(client: RemotingClient, code: int, **ext: str) -> RemotingCommand:
    return client.invoke(RemotingCommand(code, ext_fields={"topic": TOPIC, **ext}))


def test_broker_offsets_over_remoting_read_what_grpc_stored(procs: Processes) -> None:
    before = int(time.time() * 1000)
    with Producer(procs.broker.endpoint) as producer:
        sent = [producer.send(Message(TOPIC, b"m%d" % i), queue_id=1) for i in range(3)]
    with RemotingClient(procs.broker.remoting_endpoint) as b:
        wait_until(lambda: offset(b, RequestCode.GET_MAX_OFFSET, queueId="1").ext_fields["offset"] == "3",
                   "the three messages dispatched", timeout_s=5)
        assert offset(b, RequestCode.GET_MIN_OFFSET, queueId="1").ext_fields == {"offset": "0"}
        assert offset(b, RequestCode.GET_MAX_OFFSET, queueId="0").ext_fields == {"offset": "0"}
        stored = int(offset(b, RequestCode.GET_EARLIEST_MSG_STORETIME, queueId="1").ext_fields["timestamp"])
        assert before - 1000 <= stored <= int(time.time() * 1000)
        found = offset(b, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, queueId="1", timestamp=str(stored))
        assert found.ext_fields == {"offset": "0"} and sent[0].queue_offset == 0
        missing = offset(b, RequestCode.GET_MAX_OFFSET, topic="NoSuchTopic", queueId="0")
        assert missing.code == WireCode.TOPIC_NOT_EXIST


def test_consumer_offsets_heartbeats_and_consumer_lists(procs: Processes) -> None:
    group, client_id = "remo-group", "127.0.0.1@4242"
    with RemotingClient(procs.broker.remoting_endpoint) as b, Admin(procs.broker.endpoint) as admin:
        query = {"consumerGroup": group, "queueId": "0"}
        assert offset(b, RequestCode.QUERY_CONSUMER_OFFSET, **query).code == WireCode.QUERY_NOT_FOUND
        b.invoke_oneway(RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET,
                                        ext_fields={"topic": TOPIC, **query, "commitOffset": "0"}))
        wait_until(lambda: offset(b, RequestCode.QUERY_CONSUMER_OFFSET, **query).code == WireCode.SUCCESS,
                   "the one-way commit", timeout_s=5)
        assert offset(b, RequestCode.QUERY_CONSUMER_OFFSET, **query).ext_fields == {"offset": "0"}
        heartbeat = {
            "clientID": client_id, "producerDataSet": [{"groupName": "CLIENT_INNER_PRODUCER"}],
            "consumerDataSet": [{
                "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
                "subscriptionDataSet": [
                    {"topic": TOPIC, "subString": "TagA || TagB", "tagsSet": ["TagA", "TagB"], "codeSet": [],
                     "subVersion": 1, "expressionType": "TAG", "classFilterMode": False},
                    {"topic": f"%RETRY%{group}", "subString": "*", "expressionType": "TAG"},
                ],
            }],
        }
        assert b.invoke(RemotingCommand(RequestCode.HEART_BEAT, body=json.dumps(heartbeat).encode())).code == 0
        listed = b.invoke(RemotingCommand(RequestCode.GET_CONSUMER_LIST_BY_GROUP, ext_fields={"consumerGroup": group}))
        assert json.loads(listed.body) == {"consumerIdList": [client_id]}
        assert admin.consumer_list(group) == [client_id]  # the same consumer table as the gRPC front's
        left = b.invoke(RemotingCommand(RequestCode.UNREGISTER_CLIENT,
                                        ext_fields={"clientID": client_id, "consumerGroup": group}))
        assert left.code == 0
        gone = b.invoke(RemotingCommand(RequestCode.GET_CONSUMER_LIST_BY_GROUP, ext_fields={"consumerGroup": group}))
        assert gone.code == WireCode.SYSTEM_ERROR
        bad = b.invoke(RemotingCommand(RequestCode.HEART_BEAT, body=b"{not json"))
        assert bad.code == WireCode.INVALID_PARAMETER
