"""The authorization matrix of the remoting port: every request code a broker serves that needs a right, sent signed
over a real remoting connection by a user with no rights, by users holding the right actions on the wrong object
(each object in turn), and by one holding exactly the rights the code's operation needs (the least each rule
allows: Get where a read takes Pub, Sub or Get; Update where a reset takes Update). The first two are answered
NO_PERMISSION; the last is not (it may fail for other reasons: no consumer online, a handle that names nothing).
Each code is translated to the operation its gRPC twin does, which asks for the rights (broker/auth/operations.py):
this shows the translation reaches the same check through the remoting front, including the operations that read
what they were granted on behalf of the caller (a reset by time reads the group's offsets with Update, not Sub)."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from message_wire_helpers import pull_header, v2_header

from broker.auth.requirements import REMOTING, is_anonymous
from broker.client.credentials import Credentials
from broker.format.message import SysFlag
from broker.format.system_topics import SCHEDULE_TOPIC, TRANS_HALF_TOPIC
from broker.remoting import fastjson
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, WireCode
from broker.remoting.command import RemotingCommand
from broker.remoting.message_batch import BatchItem, encode_batch
from broker.remoting.message_entry import parse_offset_msg_id
from broker.remoting.message_properties import format_properties
from broker.server.broker_controller import BrokerController

T, G, PRODUCER = "RmxT", "RmxG", "RmxVictimP"
ROOT = Credentials("root", "root-secret-1")
TOPIC_ARGS = {"defaultTopic": "TBW102", "perm": "6", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0",
              "order": "false", "readQueueNums": "2", "writeQueueNums": "2"}
# Codes no right governs here: the name server's (route reads need none; its topic deletion is its root user's).
NOT_HERE = {"DELETE_TOPIC_IN_NAMESRV"}
_users = itertools.count()


@dataclass
class World:
    """The broker, its root user's connection, and the objects the requests aim at."""

    broker: BrokerController
    root: RemotingClient
    stored_offset: int = -1  # commit-log offset of a message stored in T

    def half(self) -> tuple[str, str]:
        """A new open transaction recorded under PRODUCER: (its id, its half's commit-log offset)."""
        props = format_properties({"TRAN_MSG": "true", "PGROUP": PRODUCER}).rstrip("\x02")
        header = v2_header(T, props, sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE, group=PRODUCER)
        sent = self.root.invoke(RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=header, body=b"half"))
        assert sent.code == WireCode.SUCCESS, sent.remark
        return sent.ext_fields["transactionId"], str(parse_offset_msg_id(sent.ext_fields["msgId"])[1])


def _heartbeat(w: World) -> RemotingCommand:
    data = {"clientID": "rmx@1", "consumerDataSet": [{"groupName": G, "messageModel": "CLUSTERING",
                                                      "subscriptionDataSet": [{"topic": T, "subString": "*"}]}]}
    return RemotingCommand(RequestCode.HEART_BEAT, body=json.dumps(data).encode())


def _lock(code: int) -> Callable[[World], RemotingCommand]:
    body = fastjson.dumps({"consumerGroup": G, "clientId": "rmx@1",
                           "mqSet": [{"topic": T, "brokerName": "broker-a", "queueId": 0}]}, standard=True)
    return lambda w: RemotingCommand(code, body=body)


def _end(w: World) -> RemotingCommand:
    """Ends a transaction recorded under PRODUCER while naming another group: decided on the recorded one."""
    txn_id, offset = w.half()
    return RemotingCommand(RequestCode.END_TRANSACTION, ext_fields={
        "producerGroup": "RmxOwnP", "tranStateTableOffset": "0", "commitLogOffset": offset,
        "commitOrRollback": "12", "fromTransactionCheck": "false", "msgId": "U", "transactionId": txn_id})


def _ext(code: int, **ext: str) -> Callable[[World], RemotingCommand]:
    return lambda w: RemotingCommand(code, ext_fields=ext)


def _receipt(code: int) -> Callable[[World], RemotingCommand]:
    return _ext(code, consumerGroup=G, topic=T, queueId="0", offset="0", extraInfo="no-such-handle",
                invisibleTime="1000")


READ, CONSUME = [(f"Topic:{T}", "Get")], [(f"Group:{G}", "Sub"), (f"Topic:{T}", "Sub")]
QUEUE = {"topic": T, "queueId": "0"}
# code name -> (the request, built fresh for each call; exactly the rights it needs)
CASES: dict[str, tuple[Callable[[World], RemotingCommand], list[tuple[str, str]]]] = {
    "SEND_MESSAGE": (lambda w: RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=v2_header(T), body=b"x"),
                     [(f"Topic:{T}", "Pub")]),
    "SEND_BATCH_MESSAGE": (lambda w: RemotingCommand(RequestCode.SEND_BATCH_MESSAGE, ext_fields={
        **v2_header(T), "m": "true"}, body=encode_batch([BatchItem(b"x")])), [(f"Topic:{T}", "Pub")]),
    "PULL_MESSAGE": (_ext(RequestCode.PULL_MESSAGE, **pull_header(G, T, 0, 0)), CONSUME),
    "CONSUMER_SEND_MSG_BACK": (lambda w: RemotingCommand(RequestCode.CONSUMER_SEND_MSG_BACK, ext_fields={
        "group": G, "offset": str(w.stored_offset), "delayLevel": "0", "originMsgId": "", "maxReconsumeTimes": "3"}),
        CONSUME),
    "GET_MAX_OFFSET": (_ext(RequestCode.GET_MAX_OFFSET, **QUEUE), READ),
    "GET_MIN_OFFSET": (_ext(RequestCode.GET_MIN_OFFSET, **QUEUE), READ),
    "GET_EARLIEST_MSG_STORETIME": (_ext(RequestCode.GET_EARLIEST_MSG_STORETIME, **QUEUE), READ),
    "SEARCH_OFFSET_BY_TIMESTAMP": (_ext(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, **QUEUE, timestamp="0"), READ),
    "QUERY_CONSUMER_OFFSET": (_ext(RequestCode.QUERY_CONSUMER_OFFSET, consumerGroup=G, **QUEUE), CONSUME),
    "UPDATE_CONSUMER_OFFSET": (_ext(RequestCode.UPDATE_CONSUMER_OFFSET, consumerGroup=G, commitOffset="0", **QUEUE),
                               CONSUME),
    "HEART_BEAT": (_heartbeat, CONSUME),
    "UNREGISTER_CLIENT": (_ext(RequestCode.UNREGISTER_CLIENT, clientID="rmx@1", consumerGroup=G),
                          [(f"Group:{G}", "Sub")]),
    "GET_CONSUMER_LIST_BY_GROUP": (_ext(RequestCode.GET_CONSUMER_LIST_BY_GROUP, consumerGroup=G),
                                   [(f"Group:{G}", "Get")]),
    "QUERY_MESSAGE": (_ext(RequestCode.QUERY_MESSAGE, topic=T, key="k", maxNum="1", beginTimestamp="0",
                           endTimestamp="0"), READ),
    "VIEW_MESSAGE_BY_ID": (lambda w: RemotingCommand(RequestCode.VIEW_MESSAGE_BY_ID, ext_fields={
        "offset": str(w.stored_offset)}), READ),
    "UPDATE_AND_CREATE_TOPIC": (_ext(RequestCode.UPDATE_AND_CREATE_TOPIC, topic="RmxNew", **TOPIC_ARGS),
                                [("Topic:RmxNew", "Create")]),
    "DELETE_TOPIC_IN_BROKER": (_ext(RequestCode.DELETE_TOPIC_IN_BROKER, topic="RmxGone"),
                               [("Topic:RmxGone", "Delete")]),
    "GET_TOPIC_STATS_INFO": (_ext(RequestCode.GET_TOPIC_STATS_INFO, topic=T), READ),
    "GET_BROKER_RUNTIME_INFO": (_ext(RequestCode.GET_BROKER_RUNTIME_INFO), [("Cluster", "Get")]),
    "UPDATE_AND_CREATE_SUBSCRIPTIONGROUP": (lambda w: RemotingCommand(
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        body=json.dumps({"groupName": G, "retryMaxTimes": 3}).encode()), [(f"Group:{G}", "Update")]),
    "GET_CONSUMER_CONNECTION_LIST": (_ext(RequestCode.GET_CONSUMER_CONNECTION_LIST, consumerGroup=G),
                                     [(f"Group:{G}", "Get")]),
    "GET_CONSUME_STATS": (_ext(RequestCode.GET_CONSUME_STATS, consumerGroup=G, topic=T),
                          [(f"Group:{G}", "Get"), (f"Topic:{T}", "Get")]),
    "INVOKE_BROKER_TO_RESET_OFFSET": (_ext(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, topic=T, group=G,
                                           timestamp="-1", isForce="true"),
                                      [(f"Group:{G}", "Update"), (f"Topic:{T}", "Get")]),
    "END_TRANSACTION": (_end, [(f"Group:{PRODUCER}", "Pub")]),
    "LOCK_BATCH_MQ": (_lock(RequestCode.LOCK_BATCH_MQ), CONSUME),
    "UNLOCK_BATCH_MQ": (_lock(RequestCode.UNLOCK_BATCH_MQ), CONSUME),
    "POP_MESSAGE": (_ext(RequestCode.POP_MESSAGE, consumerGroup=G, topic=T, queueId="-1", maxMsgNums="1",
                         invisibleTime="60000", pollTime="0", bornTime=str(int(time.time() * 1000)), initMode="0",
                         expType="TAG", exp="*", order="false"), CONSUME),
    "ACK_MESSAGE": (_receipt(RequestCode.ACK_MESSAGE), CONSUME),
    "CHANGE_MESSAGE_INVISIBLETIME": (_receipt(RequestCode.CHANGE_MESSAGE_INVISIBLETIME), CONSUME),
}


@pytest.fixture
def world(broker_factory: Callable[..., BrokerController]) -> Iterator[World]:
    broker = broker_factory(auth_enabled=True, auth_root_access_key=ROOT.access_key,
                            auth_root_secret_key=ROOT.secret_key, allow_plaintext_auth=True,
                            remoting_listen="127.0.0.1:0", broker_name="broker-a", transaction_timeout_ms=600_000)
    with RemotingClient(broker.remoting_address(), credentials=ROOT) as root:
        w = World(broker, root)
        for topic in (T, "RmxGone"):
            made = root.invoke(RemotingCommand(RequestCode.UPDATE_AND_CREATE_TOPIC,
                                               ext_fields={"topic": topic, **TOPIC_ARGS}))
            assert made.code == WireCode.SUCCESS, made.remark
        stored = root.invoke(RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=v2_header(T), body=b"stored"))
        assert stored.code == WireCode.SUCCESS, stored.remark
        w.stored_offset = parse_offset_msg_id(stored.ext_fields["msgId"])[1]
        assert broker.store is not None and broker.store.wait_dispatched()
        yield w


def wrong(resource: str, action: str) -> list[tuple[str, str]]:
    """``action`` on objects that are not ``resource`` (for the Cluster: on every topic and group)."""
    if resource == "Cluster":
        return [("Topic:*", action), ("Group:*", action)]
    return [(resource + "Wrong", action)]


def answer_of(w: World, command: RemotingCommand, grants: list[tuple[str, str]]) -> RemotingCommand:
    """``command`` sent signed by a new user holding exactly ``grants``."""
    assert w.broker.accounts is not None
    user = Credentials(f"rmx{next(_users)}", "rmx-secret-value")
    w.broker.accounts.create_user(user.access_key, user.secret_key)
    for resource, action in grants:
        w.broker.accounts.grant(user.access_key, resource, [action])
    with RemotingClient(w.broker.remoting_address(), credentials=user) as c:
        return c.invoke(command, timeout_s=10)


def test_every_code_needs_exactly_its_operations_rights(world: World) -> None:
    failures = []
    for name, (build, needs) in CASES.items():
        refused = answer_of(world, build(world), [])
        if refused.code != WireCode.NO_PERMISSION:
            failures.append((name, "no rights", refused.code, refused.remark))
        for i in range(len(needs)):
            grants = [g for j, n in enumerate(needs) for g in (wrong(*n) if j == i else [n])]
            refused = answer_of(world, build(world), grants)
            if refused.code != WireCode.NO_PERMISSION:
                failures.append((name, "wrong object", grants, refused.code, refused.remark))
        admitted = answer_of(world, build(world), needs)
        if admitted.code == WireCode.NO_PERMISSION:
            failures.append((name, "its rights", needs, admitted.remark))
    assert failures == []


def test_the_matrix_covers_every_code_that_needs_a_right() -> None:
    needing = {name for name, row in REMOTING.items() if not is_anonymous(row)} - NOT_HERE
    assert needing == set(CASES), sorted(needing ^ set(CASES))


def send_command_with_delay() -> RemotingCommand:
    """A message to T delayed by one level: stored in the schedule topic until it is due."""
    props = format_properties({"DELAY": "1"}).rstrip("\x02")
    return RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=v2_header(T, props), body=b"later")


def test_an_anonymous_route_read_answers_no_system_topic(world: World) -> None:
    """Route reads need no credentials, so under auth they answer no system topic's route (super users' only)."""
    assert world.root.invoke(send_command_with_delay()).code == WireCode.SUCCESS  # the schedule topic holds it
    assert world.broker.store is not None and world.broker.store.wait_dispatched()
    assert world.broker.store.max_offset(SCHEDULE_TOPIC, 0) > 0
    with RemotingClient(world.broker.remoting_address()) as anonymous:
        def route(topic: str) -> RemotingCommand:
            return anonymous.invoke(RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": topic}))

        assert route(T).code == WireCode.SUCCESS
        for topic in (SCHEDULE_TOPIC, TRANS_HALF_TOPIC):
            refused = route(topic)
            assert refused.code == WireCode.NO_PERMISSION and "super users" in (refused.remark or ""), topic


def test_a_right_to_publish_under_a_groups_name_does_not_take_its_consumers_out(world: World) -> None:
    """Leaving a group ends a member's share of its queues and its locks: Sub on the group, as joining takes."""
    leave = RemotingCommand(RequestCode.UNREGISTER_CLIENT, ext_fields={"clientID": "rmx@1", "consumerGroup": G})
    assert answer_of(world, leave, [(f"Group:{G}", "Pub")]).code == WireCode.NO_PERMISSION
    assert answer_of(world, leave, [(f"Group:{G}", "Sub")]).code == WireCode.SUCCESS
