"""``mqadmin``'s everyday codes on a broker's remoting port (and the name server's route deletion): topics made over
remoting and written over gRPC, deleted; stats, consume progress, connections and runtime figures in the JSON
RocketMQ's classes write (fastjson's object-keyed maps included, checked against hand-written bodies); subscription
groups updated; offsets reset by time."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from admin_wire_helpers import Remoting, remoting_broker
from message_wire_helpers import auth_broker, send

from broker.client import Message, Producer
from broker.namesrv.remoting_processor import NameServerRemoting
from broker.namesrv.route_table import QueueSpec, Registration, RouteTable
from broker.remoting import fastjson
from broker.remoting.admin_table import ADMIN_CODES, admin_processors
from broker.remoting.codes import RequestCode, WireCode
from broker.remoting.command import RemotingCommand
from broker.remoting.message_entry import parse_offset_msg_id
from broker.remoting.message_ids import RemotingIds
from broker.remoting.message_processors import message_processors
from broker.remoting.processor import RequestContext
from broker.server.broker_controller import BrokerController

__all__ = ["remoting_broker"]  # the fixture

TOPIC_ARGS = {"defaultTopic": "TBW102", "perm": "6", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0",
              "order": "false"}


def mq(topic: str, queue_id: int) -> str:
    return f'{{"brokerName":"broker-a","queueId":{queue_id},"topic":"{topic}"}}'


def create(r: Remoting, topic: str, queues: int, **ext: str) -> RemotingCommand:
    args = {**TOPIC_ARGS, "readQueueNums": str(queues), "writeQueueNums": str(queues), **ext}
    return r.call(RequestCode.UPDATE_AND_CREATE_TOPIC, topic=topic, **args)


def send_grpc(r: Remoting, topic: str, count: int, queue_id: int = 0) -> None:
    with Producer(r.endpoint) as producer:
        for i in range(count):
            producer.send(Message(topic, b"m%d" % i), queue_id=queue_id)
    assert r.broker.store is not None and r.broker.store.wait_dispatched()


def commit(r: Remoting, group: str, topic: str, queue_id: int, offset: int) -> None:
    answer = r.call(RequestCode.UPDATE_CONSUMER_OFFSET, consumerGroup=group, topic=topic, queueId=str(queue_id),
                    commitOffset=str(offset))
    assert answer.code == WireCode.SUCCESS, answer.remark


def heartbeat(r: Remoting, group: str, client_id: str, topic: str, expression: str) -> None:
    data = {"clientID": client_id, "consumerDataSet": [{
        "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
        "subscriptionDataSet": [{"topic": topic, "subString": expression, "expressionType": "TAG"}]}]}
    assert r.call(RequestCode.HEART_BEAT, json.dumps(data).encode()).code == WireCode.SUCCESS


def test_update_topic_creates_and_grows_a_topic_that_grpc_writes(remoting_broker: Remoting) -> None:
    r = remoting_broker
    assert create(r, "AT", 4).code == WireCode.SUCCESS
    topic = r.broker.topics.get("AT")
    assert topic is not None and topic.read_queue_nums == topic.write_queue_nums == 4
    send_grpc(r, "AT", 1, queue_id=3)  # the fourth queue exists for a gRPC producer
    assert create(r, "AT", 4).code == WireCode.SUCCESS  # the same again: nothing to do
    assert create(r, "AT", 6, readQueueNums="2").code == WireCode.SUCCESS  # the larger of the two counts
    assert r.broker.topics.get("AT").read_queue_nums == 6  # type: ignore[union-attr]
    lower = create(r, "AT", 2)
    assert lower.code == WireCode.INVALID_PARAMETER and "never lowers" in (lower.remark or "")
    assert create(r, "RO", 4, perm="4").code == WireCode.INVALID_PARAMETER
    assert create(r, "AT", 0).code == WireCode.INVALID_PARAMETER
    assert r.broker.topics.get("AT").read_queue_nums == 6  # type: ignore[union-attr]
    assert r.broker.topics.get("RO") is None  # refused: nothing made
    assert create(r, "RMQ_SYS_TRANS_HALF_TOPIC", 1).code != WireCode.SUCCESS


def test_delete_topic_in_broker(remoting_broker: Remoting) -> None:
    r = remoting_broker
    assert create(r, "DT", 2).code == WireCode.SUCCESS
    send_grpc(r, "DT", 2)
    assert r.call(RequestCode.DELETE_TOPIC_IN_BROKER, topic="DT").code == WireCode.SUCCESS
    assert r.broker.topics.get("DT") is None
    stats = r.call(RequestCode.GET_TOPIC_STATS_INFO, topic="DT")
    assert stats.code == WireCode.TOPIC_NOT_EXIST
    assert r.call(RequestCode.DELETE_TOPIC_IN_BROKER, topic="DT").code == WireCode.SUCCESS  # gone already
    assert r.call(RequestCode.DELETE_TOPIC_IN_BROKER, topic="bad topic!").code == WireCode.MESSAGE_ILLEGAL


def test_topic_stats_after_sends(remoting_broker: Remoting) -> None:
    r = remoting_broker
    create(r, "ST", 2)
    send_grpc(r, "ST", 3, queue_id=1)
    r.send("ST", b"over-remoting", queue_id=1)
    assert r.broker.store is not None and r.broker.store.wait_dispatched()
    stats = r.call(RequestCode.GET_TOPIC_STATS_INFO, topic="ST")
    assert stats.code == WireCode.SUCCESS
    assert stats.body.decode() == (
        '{"offsetTable":{'
        + mq("ST", 0) + ':{"lastUpdateTimestamp":0,"maxOffset":0,"minOffset":0},'
        + mq("ST", 1) + ':{"lastUpdateTimestamp":0,"maxOffset":4,"minOffset":0}}}'
    )


def test_consume_stats_after_a_commit(remoting_broker: Remoting) -> None:
    r = remoting_broker
    create(r, "CT", 2)
    send_grpc(r, "CT", 3)
    commit(r, "cg", "CT", 0, 2)
    stats = r.call(RequestCode.GET_CONSUME_STATS, consumerGroup="cg", topic="CT")
    assert stats.code == WireCode.SUCCESS, stats.remark
    assert stats.body.decode() == (
        '{"consumeTps":0.0,"offsetTable":{'
        + mq("CT", 0) + ':{"brokerOffset":3,"consumerOffset":2,"lastTimestamp":0},'
        + mq("CT", 1) + ':{"brokerOffset":0,"consumerOffset":0,"lastTimestamp":0}}}'
    )
    every_topic = r.call(RequestCode.GET_CONSUME_STATS, consumerGroup="cg")  # mqadmin consumerProgress -g cg
    assert every_topic.body == stats.body
    unknown = r.call(RequestCode.GET_CONSUME_STATS, consumerGroup="nobody")
    assert unknown.code == WireCode.SUBSCRIPTION_GROUP_NOT_EXIST


def test_consumer_connection_list(remoting_broker: Remoting) -> None:
    r = remoting_broker
    create(r, "CC", 1)
    assert r.call(RequestCode.GET_CONSUMER_CONNECTION_LIST, consumerGroup="cc").code == WireCode.CONSUMER_NOT_ONLINE
    heartbeat(r, "cc", "10.1.2.3@4242", "CC", "TagA || TagB")
    answer = r.call(RequestCode.GET_CONSUMER_CONNECTION_LIST, consumerGroup="cc")
    assert answer.code == WireCode.SUCCESS
    # "TagA".hashCode() = 2598919, "TagB".hashCode() = 2598920 (Java's String.hashCode)
    assert answer.body.decode() == (
        '{"connectionSet":[{"clientAddr":"10.1.2.3","clientId":"10.1.2.3@4242","language":"OTHER","version":0}],'
        '"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","consumeType":"CONSUME_PASSIVELY","messageModel":"CLUSTERING",'
        '"subscriptionTable":{"CC":{"classFilterMode":false,"codeSet":[2598919,2598920],"expressionType":"TAG",'
        '"subString":"TagA || TagB","subVersion":0,"tagsSet":["TagA","TagB"],"topic":"CC"}}}'
    )


def test_update_subscription_group(remoting_broker: Remoting) -> None:
    r = remoting_broker
    config = {"groupName": "sg", "consumeEnable": False, "consumeFromMinEnable": True, "consumeBroadcastEnable": True,
              "retryQueueNums": 1, "retryMaxTimes": 5, "brokerId": 0, "whichBrokerWhenConsumeSlowly": 1,
              "notifyConsumerIdsChangedEnable": True}  # (as mqadmin updateSubGroup sends it)
    answer = r.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, json.dumps(config).encode())
    assert answer.code == WireCode.SUCCESS, answer.remark
    assert r.broker.service is not None and r.broker.service.retries is not None
    group = r.broker.service.retries.groups.get("sg")
    assert (group.consume_enable, group.retry_max_times, group.consume_broadcast_enable) == (False, 5, True)
    for bad in (b"{not json", b'{"consumeEnable":true}', b'{"groupName":"sg","retryMaxTimes":"many"}'):
        assert r.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, bad).code == WireCode.INVALID_PARAMETER
    assert r.broker.service.retries.groups.get("sg").retry_max_times == 5  # refused: unchanged


def test_reset_offset_by_time_moves_the_groups_offsets(remoting_broker: Remoting) -> None:
    r = remoting_broker
    create(r, "RT", 1)
    send_grpc(r, "RT", 3)
    time.sleep(0.02)  # store times are in ms: the reset time falls between the two sends
    middle = int(time.time() * 1000)
    time.sleep(0.02)
    send_grpc(r, "RT", 2)
    commit(r, "rg", "RT", 0, 5)
    reset = {"topic": "RT", "group": "rg", "timestamp": str(middle), "isForce": "true"}
    answer = r.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, **reset)
    assert answer.code == WireCode.SUCCESS, answer.remark
    assert answer.body.decode() == '{"offsetTable":{' + mq("RT", 0) + ":3}}"
    query = {"consumerGroup": "rg", "topic": "RT", "queueId": "0"}
    assert r.call(RequestCode.QUERY_CONSUMER_OFFSET, **query).ext_fields["offset"] == "3"
    # not forced: a reset never moves a group forward past where it is
    kept = r.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, **{**reset, "timestamp": "-1", "isForce": "false"})
    assert kept.code == WireCode.SUCCESS
    assert r.call(RequestCode.QUERY_CONSUMER_OFFSET, **query).ext_fields["offset"] == "3"
    assert r.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, **{**reset, "timestamp": "-1"}).code == 0  # to the end
    assert r.call(RequestCode.QUERY_CONSUMER_OFFSET, **query).ext_fields["offset"] == "5"
    heartbeat(r, "rg", "10.1.2.3@1", "RT", "*")  # a live consumer holds its offsets: refused, nothing changed
    live = r.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, **reset)
    assert live.code == WireCode.NO_PERMISSION and "live consumer" in (live.remark or "")
    assert r.call(RequestCode.QUERY_CONSUMER_OFFSET, **query).ext_fields["offset"] == "5"


def test_broker_runtime_info(remoting_broker: Remoting) -> None:
    r = remoting_broker
    create(r, "BT", 1)
    send_grpc(r, "BT", 2)
    answer = r.call(RequestCode.GET_BROKER_RUNTIME_INFO)
    assert answer.code == WireCode.SUCCESS
    table = fastjson.loads(answer.body)["table"]
    assert all(isinstance(v, str) for v in table.values())  # KVTable: a map of strings
    assert int(table["msgPutTotalTodayNow"]) >= 2 and int(table["commitLogMaxOffset"]) > 0
    assert len([float(x) for x in table["putTps"].split(" ")]) == 3  # clusterList splits the three rates
    assert table["brokerVersionDesc"].startswith("Sluice") and float(table["commitLogDiskRatio"]) >= 0
    assert 0 < int(table["earliestMessageTimeStamp"]) <= int(time.time() * 1000)
    assert table["broker_put_messages"] == table["msgPutTotalTodayNow"]  # Sluice's own figures, by their names


class Peer:
    address = "127.0.0.1:1"

    def send_oneway(self, command: RemotingCommand) -> None:
        raise AssertionError("the name server calls no client")


def test_delete_topic_in_namesrv_follows_who_may_write_routes() -> None:
    def table() -> RouteTable:
        routes = RouteTable()
        routes.register(Registration("c", "broker-a", 0, "127.0.0.1:1", "s1", 1, {"NT": QueueSpec(2, 2, 6),
                                     "KEEP": QueueSpec(1, 1, 6)}, remoting_address="127.0.0.1:2"), 0)
        return routes

    request = RemotingCommand(RequestCode.DELETE_TOPIC_IN_NAMESRV, ext_fields={"topic": "NT"})
    anonymous, authenticated = table(), table()
    for routes, open_routes in ((anonymous, True), (authenticated, False)):
        processor = NameServerRemoting(routes, lambda: 0, open_routes=open_routes).processors()[216]
        answer = processor.process(request, RequestContext(Peer()))
        assert isinstance(answer, RemotingCommand) and answer.code == WireCode.SUCCESS
    assert anonymous.topic_names(0) == ["KEEP"]  # registrations are anyone's to make here: RocketMQ's deletion
    assert authenticated.topic_names(0) == ["KEEP", "NT"]  # this port checks no credentials: routes follow brokers


def test_the_table_answers_the_documented_codes_and_checks_rights_with_auth(
    broker_factory: Callable[..., BrokerController],
) -> None:
    broker = auth_broker(broker_factory)
    assert broker.store is not None
    table = admin_processors(broker, RemotingIds(broker.store.msg_id_prefix()))
    assert set(table) == set(ADMIN_CODES)

    def call(code: int, user: str | None, **ext: str) -> RemotingCommand:
        answer = table[code].process(RemotingCommand(code, ext_fields=ext), RequestContext(Peer(), user))
        assert isinstance(answer, RemotingCommand)
        return answer

    make = {"topic": "AUTH", "readQueueNums": "2", "writeQueueNums": "2", **TOPIC_ARGS}
    for user in (None, "u", "nobody"):
        assert call(RequestCode.UPDATE_AND_CREATE_TOPIC, user, **make).code == WireCode.NO_PERMISSION
    assert broker.topics.get("AUTH") is None  # refused: nothing made
    broker.accounts.grant("u", "Topic:AUTH", ["Create"])
    assert call(RequestCode.UPDATE_AND_CREATE_TOPIC, "u", **make).code == WireCode.SUCCESS
    assert call(RequestCode.GET_TOPIC_STATS_INFO, "u", topic="AUTH").code == WireCode.NO_PERMISSION
    assert call(RequestCode.GET_BROKER_RUNTIME_INFO, "u").code == WireCode.NO_PERMISSION
    assert call(RequestCode.DELETE_TOPIC_IN_BROKER, "u", topic="AUTH").code == WireCode.NO_PERMISSION
    query = {"topic": "AUTH", "key": "k", "maxNum": "1", "beginTimestamp": "0", "endTimestamp": "0"}
    assert call(RequestCode.QUERY_MESSAGE, "u", **query).code == WireCode.NO_PERMISSION
    broker.accounts.grant("u", "Topic:AUTH", ["Sub"])
    assert call(RequestCode.QUERY_MESSAGE, "u", **query).code == WireCode.QUERY_NOT_FOUND  # allowed: nothing
    assert call(RequestCode.GET_TOPIC_STATS_INFO, "u", topic="AUTH").code == WireCode.SUCCESS
    reset = {"topic": "AUTH", "group": "g", "timestamp": "-1", "isForce": "true"}
    assert call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, "u", **reset).code == WireCode.NO_PERMISSION
    messages = message_processors(broker)
    try:
        sent = send(messages, "AUTH", b"secret", user="root")
    finally:
        messages.shutdown()
    assert broker.store.wait_dispatched()
    offset = str(parse_offset_msg_id(sent.ext_fields["msgId"])[1])
    broker.accounts.create_user("v", "v-secret-123")
    assert call(RequestCode.VIEW_MESSAGE_BY_ID, "v", offset=offset).code == WireCode.NO_PERMISSION  # its topic's
    assert call(RequestCode.VIEW_MESSAGE_BY_ID, "u", offset=offset).code == WireCode.SUCCESS
    assert call(RequestCode.DELETE_TOPIC_IN_BROKER, "root", topic="AUTH").code == WireCode.SUCCESS
