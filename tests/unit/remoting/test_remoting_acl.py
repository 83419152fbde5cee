"""RocketMQ 4's ACL over remoting against a real broker process with ``--auth`` and ``--remoting-listen``: signed
requests pass, every other one is answered NO_PERMISSION (16) and changes nothing; a user's rights are the ones
the gRPC fronts decide; the signature's byte layout; the heartbeat's SQL92 subscription filtering push pulls; and
NOTIFY_CONSUMER_IDS_CHANGED reaching the other members of a group."""

from __future__ import annotations

import base64
import json
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from message_wire_helpers import SUSPEND, pull_header, v2_header

from broker.auth.accounts import Accounts, User
from broker.client.credentials import Credentials
from broker.namesrv.name_server import NameServer
from broker.namesrv.remoting_processor import NameServerRemoting
from broker.namesrv.route_table import RouteTable
from broker.private_file import write_private
from broker.proto import sluice_pb2 as pb
from broker.remoting import signature
from broker.remoting.admin_table import ADMIN_CODES
from broker.remoting.admission import anonymous_codes, declared_codes
from broker.remoting.authentication import Authenticator
from broker.remoting.broker_table import broker_processors
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, WireCode
from broker.remoting.command import RemotingCommand
from broker.remoting.message_entry import iter_stored
from broker.remoting.message_processors import MESSAGE_CODES
from broker.remoting.message_properties import format_properties
from broker.remoting.server import RemotingServer
from broker.server.consumer_manager import ConsumerManager
from broker.server.process import BrokerProcess
from tests.support.auth_process import ROOT, SETTINGS, Secured
from tests.support.waiting import wait_until

NO_PERMISSION = WireCode.NO_PERMISSION


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root: Path = tmp_path_factory.mktemp("remoting-acl")
    config = root / "broker.json"
    write_private(config, json.dumps({**SETTINGS, "remoting_listen": "127.0.0.1:0"}).encode())
    proc = BrokerProcess(root / "store", config=config, metrics_port=0, log_level="WARNING").start()
    try:
        yield Secured(proc)
    finally:
        proc.stop()


def client(s: Secured, creds: Credentials | None = ROOT, **kw: object) -> RemotingClient:
    return RemotingClient(s.proc.remoting_endpoint, credentials=creds, **kw)  # type: ignore[arg-type]


def send_command(topic: str, body: bytes = b"m", props: dict[str, str] | None = None) -> RemotingCommand:
    text = format_properties(props or {}).rstrip("\x02")
    return RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=v2_header(topic, text), body=body)


def update_offset(group: str, topic: str, offset: int) -> RemotingCommand:
    return RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields={
        "consumerGroup": group, "topic": topic, "queueId": "0", "commitOffset": str(offset)})


def committed(s: Secured, group: str, topic: str) -> int | None:
    """The group's committed offset of queue 0, as the super user reads it over gRPC (None: none)."""
    found = s.call("QueryConsumerOffset", pb.QueryConsumerOffsetRequest(consumer_group=group, topic=topic))
    return next((o.offset for o in found.offsets if o.queue_id == 0), None)


# ------------------------------------------------------------------------------------------------ the signature


def test_the_signed_bytes_are_the_sorted_values_then_the_body() -> None:
    ext = {"topic": "T", "AccessKey": "ak", "queueId": "0", "consumerGroup": "G", "Signature": "ignored"}
    # Java's order: "AccessKey" < "consumerGroup" < "queueId" < "topic" (upper case first); values only, then body
    assert signature.signed_content(ext, b"xy") == b"akG0Txy"
    # HMAC-SHA1(b"sk-secret", b"akG0Txy"), base64: computed apart from the module
    assert signature.compute("sk-secret", b"akG0Txy") == "BHvtqXk/ZQHUDJOB5H9fr+MpsOI="
    fields = {"topic": "T", "queueId": "0", "consumerGroup": "G"}
    signature.sign(fields, b"xy", "ak", "sk-secret")
    assert fields["AccessKey"] == "ak" and fields["Signature"] == "BHvtqXk/ZQHUDJOB5H9fr+MpsOI="
    assert signature.matches("sk-secret", fields, b"xy") and not signature.matches("sk-secret", fields, b"xz")
    # UTF-16 order, not code points: U+FF5E sorts after U+1F600 (a surrogate pair, 0xD83D...) in Java
    assert signature.signed_content({"\uff5e": "b", "\U0001f600": "a"}, b"") == b"ab"


# ------------------------------------------------------------------------------------------------ authentication


def test_a_signed_request_is_served(secured: Secured) -> None:
    topic = secured.topic("AclSigned")
    user = secured.user((f"Topic:{topic}", "Pub"))
    before = secured.max_offset(topic)
    with client(secured, user) as c:
        answer = c.invoke(send_command(topic))
    assert answer.code == WireCode.SUCCESS, answer.remark
    wait_until(lambda: secured.max_offset(topic) == before + 1, "the signed message stored", timeout_s=5)


REFUSED: dict[str, tuple[Credentials | None, dict[str, str]]] = {
    "unsigned": (None, {}),
    "bad signature": (Credentials(ROOT.access_key, "not-the-root-secret"), {}),
    "unknown access key": (Credentials("nobody-here", "some-secret-value"), {}),
    "security token": (ROOT, {"SecurityToken": "sts-token"}),
}


@pytest.mark.parametrize("case", REFUSED)
def test_requests_without_valid_credentials_are_refused_16_and_change_nothing(secured: Secured, case: str) -> None:
    topic, group = secured.topic("AclRefused"), "AclRefusedG"
    creds, extra = REFUSED[case]
    secured.send(topic, b"there")  # so that a commit of offset 1 would be valid, if it were authenticated
    secured.call("UpdateConsumerOffsets", pb.UpdateConsumerOffsetsRequest(
        consumer_group=group, offsets=[pb.QueueOffset(topic=topic, queue_id=0, offset=0)]))
    stored = secured.max_offset(topic)
    with client(secured, None) as c:
        for command in (send_command(topic), update_offset(group, topic, 1)):
            command.ext_fields.update(extra)
            if creds is not None:  # signed after the extra fields, as a client's hook signs what it sends
                signature.sign(command.ext_fields, command.body, creds.access_key, creds.secret_key)
            answer = c.invoke(command)
            assert answer.code == NO_PERMISSION and answer.remark, case
            if case == "security token":
                assert "SecurityToken" in answer.remark
            elif case == "unsigned":
                assert "AccessKey" in answer.remark
            else:  # the same answer for an unknown key and a wrong signature
                assert "unknown or disabled, or the signature is wrong" in answer.remark
    assert secured.max_offset(topic) == stored and committed(secured, group, topic) == 0


def test_a_one_way_commit_without_credentials_stores_nothing(secured: Secured) -> None:
    topic, group = secured.topic("AclOneway"), "AclOnewayG"
    for body in (b"m0", b"m1"):
        secured.send(topic, body)
    with client(secured, None) as anonymous, client(secured) as signed:
        anonymous.invoke_oneway(update_offset(group, topic, 2))
        signed.invoke_oneway(update_offset(group, topic, 1))  # a marker: stored whatever order the two run in
        wait_until(lambda: committed(secured, group, topic) == 1, "the root user's commit", timeout_s=5)
        assert anonymous.invoke(update_offset(group, topic, 2)).code == NO_PERMISSION
    assert committed(secured, group, topic) == 1


# ------------------------------------------------------------------------------------------------ authorization


def test_rights_on_one_topic_do_not_reach_another(secured: Secured) -> None:
    a, b, group = secured.topic("AclTopicA"), secured.topic("AclTopicB"), "AclRightsG"
    user = secured.user((f"Topic:{a}", "Pub,Sub"), (f"Group:{group}", "Sub"))
    with client(secured, user) as c:
        assert c.invoke(send_command(a)).code == WireCode.SUCCESS
        assert c.invoke(RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields=pull_header(group, a, 0, 0))).code in (
            WireCode.SUCCESS, WireCode.PULL_NOT_FOUND)
        assert c.invoke(update_offset(group, a, 1)).code == WireCode.SUCCESS
        stored_b = secured.max_offset(b)
        for command in (send_command(b), RemotingCommand(RequestCode.PULL_MESSAGE,
                                                         ext_fields=pull_header(group, b, 0, 0)),
                        update_offset(group, b, 1)):
            answer = c.invoke(command)
            assert answer.code == NO_PERMISSION and answer.remark and b in answer.remark, command.code
        other_group = c.invoke(update_offset("AclOtherG", a, 1))
        assert other_group.code == NO_PERMISSION
    assert secured.max_offset(b) == stored_b and committed(secured, group, b) is None
    assert committed(secured, group, a) == 1


def denied_count(s: Secured) -> float:
    """The broker's ``sluice_auth_refusals_total{reason="denied"}``, scraped as the root user."""
    request = urllib.request.Request(f"http://127.0.0.1:{s.proc.metrics_port}/metrics")
    request.add_header("Authorization", "Basic " + base64.b64encode(f"{ROOT.access_key}:{ROOT.secret_key}".encode())
                       .decode())
    with urllib.request.urlopen(request, timeout=10) as answer:
        text = answer.read().decode()
    found = re.search(r'^sluice_auth_refusals_total\{[^}]*reason="denied"[^}]*\} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_a_refusal_is_counted_as_the_grpc_fronts_count_theirs(secured: Secured) -> None:
    """An operator watching ``sluice_auth_refusals_total`` sees a remoting client refused as a gRPC one."""
    topic = secured.topic("AclCounted")
    user = secured.user(("Topic:AclNothingHere", "Pub"))
    before = denied_count(secured)
    with client(secured, user) as c:
        assert c.invoke(send_command(topic)).code == NO_PERMISSION
        assert c.invoke(update_offset("AclCountedG", topic, 1)).code == NO_PERMISSION
    assert denied_count(secured) == before + 2


def test_heartbeats_and_consumer_lists_need_the_groups_rights(secured: Secured) -> None:
    topic, group = secured.topic("AclBeat"), "AclBeatG"
    user = secured.user((f"Topic:{topic}", "Sub"))  # no right on the group
    beat = {"clientID": "acl-beat@1", "consumerDataSet": [{"groupName": group, "messageModel": "CLUSTERING",
                                                           "subscriptionDataSet": [{"topic": topic,
                                                                                    "subString": "*"}]}]}
    with client(secured, user) as c:
        assert c.invoke(RemotingCommand(RequestCode.HEART_BEAT, body=json.dumps(beat).encode())).code == NO_PERMISSION
        listed = c.invoke(RemotingCommand(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                          ext_fields={"consumerGroup": group}))
        assert listed.code == NO_PERMISSION
    assert secured.call("GetConsumerList", pb.GetConsumerListRequest(consumer_group=group)).client_ids == []


def test_a_code_without_declared_rights_is_for_super_users_only(tmp_path: Path) -> None:
    """Default deny on the transport: a processor registered without a REMOTING row reaches super users only."""
    accounts = Accounts(tmp_path, User("root", "root-secret-value", super_user=True))
    accounts.create_user("plain", "plain-secret-value")
    accounts.grant("plain", "Cluster", ["Pub", "Sub", "Get", "List"])
    echo = RequestCode.GET_ALL_CONSUMER_OFFSET  # no row in the table

    class Echo:
        def process(self, request: RemotingCommand, context: object) -> RemotingCommand:
            return request.response(WireCode.SUCCESS, remark=getattr(context, "user", None))

    auth = Authenticator(accounts, anonymous_codes(), None, declared_codes())
    with RemotingServer({echo: Echo()}, "127.0.0.1", 0, authenticator=auth) as server:
        with RemotingClient(server.address, credentials=Credentials("root", "root-secret-value")) as root:
            assert root.invoke(RemotingCommand(echo)).remark == "root"  # the user reaches the processor
        with RemotingClient(server.address, credentials=Credentials("plain", "plain-secret-value")) as plain:
            refused = plain.invoke(RemotingCommand(echo))
            assert refused.code == NO_PERMISSION and refused.remark and "super users only" in refused.remark


def test_the_name_servers_route_reads_need_no_credentials() -> None:
    """A name server with a root user (registrations signed) still serves route reads to anyone, as over gRPC."""
    root = User("root", "root-secret-value", super_user=True)
    with NameServer("127.0.0.1", 0, root=root, remoting_listen=("127.0.0.1", 0)) as ns:
        assert ns.remoting is not None and ns.remoting.authenticator is not None
        with RemotingClient(ns.remoting.address) as c:
            listed = c.invoke(RemotingCommand(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
            assert listed.code == WireCode.SUCCESS and json.loads(listed.body) == {"topicList": []}
            route = c.invoke(RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": "Any"}))
            assert route.code == WireCode.TOPIC_NOT_EXIST


# ------------------------------------------------------------------------------------------------ subscriptions


def heartbeat(group: str, client_id: str, topic: str, expression: str = "*", kind: str = "TAG") -> RemotingCommand:
    data = {"clientID": client_id, "consumerDataSet": [{
        "groupName": group, "messageModel": "CLUSTERING", "consumeType": "CONSUME_PASSIVELY",
        "subscriptionDataSet": [{"topic": topic, "subString": expression, "expressionType": kind}]}]}
    return RemotingCommand(RequestCode.HEART_BEAT, body=json.dumps(data).encode())


def test_a_push_pull_is_filtered_by_the_heartbeats_subscription(secured: Secured) -> None:
    topic = secured.topic("AclSql")

    def push_pull(c: RemotingClient, group: str) -> list[bytes]:
        # a push consumer's pull: SUSPEND only, no subscription of its own (an empty one, as the Java client)
        header = {**pull_header(group, topic, 0, 0, sys_flag=SUSPEND, subscription=""), "expressionType": ""}
        answer = c.invoke(RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields=header))
        assert answer.code == WireCode.SUCCESS
        return [m.body for m in iter_stored(answer.body)]

    with client(secured) as c:
        for i in range(4):
            props = {"a": str(i), "TAGS": "TagA" if i % 2 else "TagB"}
            assert c.invoke(send_command(topic, b"m%d" % i, props)).code == WireCode.SUCCESS
        wait_until(lambda: secured.max_offset(topic) == 4, "the four messages", timeout_s=5)
        assert c.invoke(heartbeat("AclSqlG", "sql@1", topic, "a >= 2", "SQL92")).code == WireCode.SUCCESS
        assert c.invoke(heartbeat("AclTagG", "tag@1", topic, "TagA")).code == WireCode.SUCCESS
        assert push_pull(c, "AclSqlG") == [b"m2", b"m3"]
        assert push_pull(c, "AclTagG") == [b"m1", b"m3"]
        assert push_pull(c, "AclNoBeatG") == [b"m0", b"m1", b"m2", b"m3"]  # no heartbeat: everything


def test_the_consumer_table_keeps_expression_types_and_tells_its_listeners() -> None:
    table, told = ConsumerManager(), []
    table.add_listener(told.append)
    table.heartbeat("G", "c1", {"T": "a > 1"}, "CLUSTERING", {"T": "SQL92"})
    table.heartbeat("G", "c1", {"T": "a > 1"}, "CLUSTERING", {"T": "SQL92"})  # nothing changed: not told
    assert table.subscription("G", "T") == ("a > 1", "SQL92") and told == ["G"]
    time.sleep(0.002)  # heartbeats are told apart by their millisecond
    table.heartbeat("G", "c2", {"T": "TagA"}, "CLUSTERING")  # a gRPC heartbeat: tags, the latest one wins
    assert table.subscription("G", "T") == ("TagA", "TAG") and table.subscription("G", "Other") is None
    table.unregister("G", "c2")
    table.unregister("G", "nobody")  # not a member: nothing changed
    assert told == ["G", "G", "G"]


# ------------------------------------------------------------------------------------------------ notices


class Notices:
    def __init__(self) -> None:
        self.groups: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, command: RemotingCommand) -> None:
        if command.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED and command.is_oneway:
            with self._lock:
                self.groups.append(command.ext_fields.get("consumerGroup", ""))

    def count(self, group: str) -> int:
        with self._lock:
            return self.groups.count(group)


def test_the_other_members_are_notified_when_a_client_joins_or_leaves(secured: Secured) -> None:
    topic, group = secured.topic("AclNotify"), "AclNotifyG"
    seen = Notices()
    with client(secured, on_request=seen) as first:
        assert first.invoke(heartbeat(group, "first@1", topic)).code == WireCode.SUCCESS
        wait_until(lambda: seen.count(group) == 1, "the joiner's own notice", timeout_s=5)
        assert first.invoke(heartbeat(group, "first@1", topic)).code == WireCode.SUCCESS  # nothing changed
        with client(secured) as second:
            assert second.invoke(heartbeat(group, "second@1", topic)).code == WireCode.SUCCESS
            wait_until(lambda: seen.count(group) == 2, "the notice of the second client joining", timeout_s=5)
            left = second.invoke(RemotingCommand(RequestCode.UNREGISTER_CLIENT, ext_fields={
                "clientID": "second@1", "consumerGroup": group}))
            assert left.code == WireCode.SUCCESS
            wait_until(lambda: seen.count(group) == 3, "the notice of its leaving", timeout_s=5)
            assert second.invoke(heartbeat(group, "second@1", topic)).code == WireCode.SUCCESS
            wait_until(lambda: seen.count(group) == 4, "the notice of its joining again", timeout_s=5)
        # its connection closed: it leaves the group, and the first client is told
        wait_until(lambda: seen.count(group) == 5, "the notice of the closed connection", timeout_s=5)
        ids = secured.call("GetConsumerList", pb.GetConsumerListRequest(consumer_group=group)).client_ids
        assert list(ids) == ["first@1"]


def test_every_served_code_declares_its_rights() -> None:
    """A code served without a REMOTING row would be for super users only: each one the broker and the name server
    answer has its row (the one the processors check)."""
    served = {*broker_processors(SimpleNamespace(admin=None)), *MESSAGE_CODES, *ADMIN_CODES}  # type: ignore[arg-type]
    namesrv = set(NameServerRemoting(RouteTable(), lambda: 0).processors())
    assert (served | namesrv) - declared_codes() == set()
    assert anonymous_codes() == namesrv - {RequestCode.DELETE_TOPIC_IN_NAMESRV}  # route reads only
