"""The pieces of authentication and authorization on their own: the signature header, the replay window, the
policy rules (most specific wins, Deny wins ties, prefixes, source networks, retry and dead-letter topics), the
users file, and the requirement table against every served method."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from rocketmq.grpc_protocol import service_pb2 as v2s

from broker.auth.accounts import Accounts, User
from broker.auth.policy import CLUSTER, Action, Decision, Entry, Pattern, allows, decide, group, need, topic
from broker.auth.requirements import TABLES, is_super_only, requirement_of
from broker.client.credentials import Credentials
from broker.errors import AuthenticationError, InvalidArgumentError, NoPermissionError
from broker.format.signature import (
    DATE_TIME_HEADER,
    check_date_time,
    parse_header,
    sign,
    signature_matches,
    signed_metadata,
)
from broker.proto import coordinator_pb2 as cpb
from broker.proto import namesrv_pb2 as npb
from broker.proto import sluice_pb2 as pb

NOW = dt.datetime(2026, 11, 26, 12, 0, 0, tzinfo=dt.UTC)
LOCAL = ipaddress.ip_address("127.0.0.1")


# ------------------------------------------------------------------------------------------------ signature
def test_a_signed_header_parses_and_verifies_in_either_hex_case() -> None:
    (date_key, date_time), (_, header) = signed_metadata("alice", "s3cret", NOW)
    assert (date_key, date_time) == (DATE_TIME_HEADER, "20261126T120000Z")
    signed = parse_header(header)
    assert signed.access_key == "alice"
    assert signature_matches("s3cret", date_time, signed.signature_hex)
    assert not signature_matches("other", date_time, signed.signature_hex)
    lower = header.replace(sign("s3cret", date_time), sign("s3cret", date_time).lower())
    assert signature_matches("s3cret", date_time, parse_header(lower).signature_hex)


def test_rocketmq_clients_header_shape_is_accepted() -> None:
    # What RocketMQ's Java client writes (no space after the commas is accepted too).
    sig = sign("sk", "20261126T120000Z")
    for text in (f"MQv2-HMAC-SHA1 Credential=ak, SignedHeaders=x-mq-date-time, Signature={sig}",
                 f"MQv2-HMAC-SHA1 Credential=ak,SignedHeaders=x-mq-date-time,Signature={sig}"):
        assert parse_header(text).access_key == "ak"


@pytest.mark.parametrize("header", [
    "", "Basic YWxhZGRpbjpvcGVuc2VzYW1l", "MQv2-HMAC-SHA1 Credential=alice",
    "MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=host, Signature=" + "A" * 40,
    "MQv2-HMAC-SHA1 Credential=al ice, SignedHeaders=x-mq-date-time, Signature=" + "A" * 40,
    "MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, Signature=" + "A" * 39,
    "MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, Signature=" + "G" * 40,
    "MQv2-HMAC-SHA1 Credential=" + "a" * 65 + ", SignedHeaders=x-mq-date-time, Signature=" + "A" * 40,
    "MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, Signature=" + "A" * 600,
])
def test_malformed_headers_are_refused_as_unauthenticated(header: str) -> None:
    with pytest.raises(AuthenticationError):
        parse_header(header)


@pytest.mark.parametrize("offset_s, ok", [(0, True), (899, True), (-899, True), (901, False), (-901, False),
                                          (86_400 * 365, False)])
def test_the_window_bounds_a_replayed_header(offset_s: int, ok: bool) -> None:
    stamp = (NOW + dt.timedelta(seconds=offset_s)).strftime("%Y%m%dT%H%M%SZ")
    if ok:
        check_date_time(stamp, NOW, 900)
    else:
        with pytest.raises(AuthenticationError, match="window"):
            check_date_time(stamp, NOW, 900)


@pytest.mark.parametrize("stamp", [None, "", "2026-11-26T12:00:00Z", "20261126T120000", "20261326T120000Z", "x" * 300])
def test_missing_or_malformed_timestamps_are_refused(stamp: str | None) -> None:
    with pytest.raises(AuthenticationError):
        check_date_time(stamp, NOW, 900)


def test_credentials_never_show_the_secret() -> None:
    creds = Credentials("alice", "hunter2-secret")
    assert "hunter2" not in repr(creds) and "hunter2" not in str(creds)
    assert "hunter2" not in repr(User("alice", "hunter2-secret"))
    with pytest.raises(InvalidArgumentError):
        Credentials.of("alice", None)
    with pytest.raises(InvalidArgumentError):
        Credentials("bad key!", "x")


# ------------------------------------------------------------------------------------------------ policy
def entry(resource: str, actions: str, decision: str = "Allow", *nets: str) -> Entry:
    return Entry.from_json({"resource": resource, "actions": actions.split(","), "decision": decision,
                            "source_ips": list(nets)})


def test_nothing_granted_is_denied() -> None:
    assert not allows([], need(topic("t"), Action.PUB), LOCAL)
    assert not allows([entry("Topic:t", "Sub")], need(topic("t"), Action.PUB), LOCAL)


def test_deny_wins_over_allow_at_equal_specificity() -> None:
    entries = [entry("Topic:t", "Pub"), entry("Topic:t", "Pub", "Deny")]
    assert decide(entries, topic("t"), Action.PUB, LOCAL) is Decision.DENY
    assert decide(list(reversed(entries)), topic("t"), Action.PUB, LOCAL) is Decision.DENY
    assert decide([entry("Topic:t", "All"), entry("Topic:t", "Pub", "Deny")], topic("t"), Action.PUB, LOCAL) is (
        Decision.DENY
    )


def test_the_most_specific_match_wins_literal_over_prefix_over_any() -> None:
    entries = [entry("*", "Pub", "Deny"), entry("Topic:orders-*", "Pub"), entry("Topic:orders-eu", "Pub", "Deny")]
    assert decide(entries, topic("orders-us"), Action.PUB, LOCAL) is Decision.ALLOW  # prefix beats *
    assert decide(entries, topic("orders-eu"), Action.PUB, LOCAL) is Decision.DENY  # literal beats prefix
    assert decide(entries, topic("audit"), Action.PUB, LOCAL) is Decision.DENY  # only *
    longer = [entry("Topic:orders-*", "Pub", "Deny"), entry("Topic:orders-eu-*", "Pub")]
    assert decide(longer, topic("orders-eu-1"), Action.PUB, LOCAL) is Decision.ALLOW  # longer prefix wins
    assert decide(longer, topic("orders-us-1"), Action.PUB, LOCAL) is Decision.DENY
    assert decide([entry("Topic:*", "Pub")], topic("anything"), Action.PUB, LOCAL) is Decision.ALLOW
    assert decide([entry("Topic:*", "Pub")], group("anything"), Action.PUB, LOCAL) is None


def test_source_networks_narrow_an_entry_and_never_widen_it() -> None:
    entries = [entry("Topic:t", "Pub", "Allow", "10.0.0.0/8")]
    assert allows(entries, need(topic("t"), Action.PUB), ipaddress.ip_address("10.1.2.3"))
    assert not allows(entries, need(topic("t"), Action.PUB), ipaddress.ip_address("192.168.1.1"))
    assert not allows(entries, need(topic("t"), Action.PUB), None)
    denied_from_lan = [entry("Topic:t", "Pub"), entry("Topic:t", "Pub", "Deny", "192.168.0.0/16")]
    assert allows(denied_from_lan, need(topic("t"), Action.PUB), ipaddress.ip_address("10.0.0.1"))
    assert not allows(denied_from_lan, need(topic("t"), Action.PUB), ipaddress.ip_address("192.168.3.4"))
    v6 = [entry("Topic:t", "Pub", "Allow", "::1/128")]
    assert allows(v6, need(topic("t"), Action.PUB), ipaddress.ip_address("::1"))
    assert not allows(v6, need(topic("t"), Action.PUB), LOCAL)


def test_retry_and_dead_letter_topics_follow_their_group() -> None:
    entries = [entry("Group:g", "Sub")]
    for name in ("%RETRY%g", "%DLQ%g"):
        assert allows(entries, need(topic(name), Action.SUB), LOCAL)
        assert allows(entries, need(topic(name), Action.PUB), LOCAL)  # consumers put messages back for later
    assert not allows(entries, need(topic("%RETRY%other"), Action.SUB), LOCAL)
    assert not allows([entry("Topic:%RETRY%g", "Sub")], need(topic("%RETRY%g"), Action.SUB), LOCAL)


def test_cluster_rights_stand_in_for_admin_only_when_the_resource_says_nothing() -> None:
    delete_t = need(topic("audit"), Action.DELETE, or_cluster=True)
    assert allows([entry("Cluster", "Delete")], delete_t, LOCAL)
    assert not allows([entry("Cluster", "Delete"), entry("Topic:audit", "Delete", "Deny")], delete_t, LOCAL)
    assert not allows([entry("Cluster", "Delete")], need(topic("audit"), Action.DELETE), LOCAL)
    assert allows([entry("*", "All")], need(CLUSTER, Action.LIST), LOCAL)


@pytest.mark.parametrize("text", ["Topic", "Topic:", "Queue:x", "Topic:a*b", "Topic:" + "x" * 300, ""])
def test_bad_resource_patterns_are_refused(text: str) -> None:
    with pytest.raises(InvalidArgumentError):
        Pattern.parse(text)


def test_bad_actions_decisions_and_networks_are_refused() -> None:
    bad: dict[str, Any]
    for bad in ({"actions": ["Publish"]}, {"decision": "Maybe"}, {"source_ips": ["10.0.0.0/33"]}, {"actions": []}):
        with pytest.raises(InvalidArgumentError):
            Entry.from_json({"resource": "Topic:t", "actions": ["Pub"], "decision": "Allow", "source_ips": [], **bad})


# ------------------------------------------------------------------------------------------------ accounts
def test_users_and_entries_survive_a_restart_in_a_private_file(tmp_path: Path) -> None:
    accounts = Accounts(tmp_path)
    accounts.create_user("alice", "s3cret")
    accounts.grant("alice", "Topic:orders-*", ["Pub", "Sub"])
    accounts.grant("alice", "Topic:orders-*", ["Get"])  # merged into the same entry
    accounts.grant("alice", "Topic:orders-eu", ["Pub"], "Deny", ["10.0.0.0/8"])
    path = tmp_path / "users.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again = Accounts(tmp_path)
    again.load()
    assert again.user("alice") == User("alice", "s3cret")
    assert [(str(e.pattern), sorted(a.value for a in e.actions), e.decision.value) for e in again.entries("alice")] == [
        ("Topic:orders-*", ["Get", "Pub", "Sub"], "Allow"), ("Topic:orders-eu", ["Pub"], "Deny")]
    again.revoke("alice", "Topic:orders-*", ["Pub"])
    assert sorted(a.value for a in again.entries("alice")[0].actions) == ["Get", "Sub"]
    again.revoke("alice", "Topic:orders-eu")
    assert len(again.entries("alice")) == 1
    again.delete_user("alice")
    assert again.user("alice") is None and again.entries("alice") == ()
    assert "alice" not in json.loads(path.read_text())["users"]


def test_the_root_user_is_never_written_nor_changed_by_rpc(tmp_path: Path) -> None:
    accounts = Accounts(tmp_path, User("root", "rootsecret"))
    assert accounts.user("root") is not None and accounts.user("root").super_user  # type: ignore[union-attr]
    for change in (lambda: accounts.delete_user("root"), lambda: accounts.update_user("root", enabled=False),
                   lambda: accounts.create_user("root", "x")):
        with pytest.raises(NoPermissionError):
            change()
    accounts.create_user("bob", "b")
    assert "rootsecret" not in (tmp_path / "users.json").read_text()


def test_account_changes_refuse_bad_input_and_change_nothing(tmp_path: Path) -> None:
    accounts = Accounts(tmp_path)
    accounts.create_user("alice", "s")
    before = (tmp_path / "users.json").read_bytes()
    for bad in (lambda: accounts.create_user("alice", "again"), lambda: accounts.create_user("a b", "s"),
                lambda: accounts.create_user("x", ""), lambda: accounts.create_user("x", "s" * 65),
                lambda: accounts.grant("alice", "Topic:t", []), lambda: accounts.grant("alice", "Nope", ["Pub"]),
                lambda: accounts.grant("nobody", "Topic:t", ["Pub"])):
        with pytest.raises((InvalidArgumentError, NoPermissionError, Exception)) as info:
            bad()
        assert info.type.__name__.endswith("Error")
    assert (tmp_path / "users.json").read_bytes() == before


# ------------------------------------------------------------------------------------------------ requirements
def served_methods() -> list[str]:
    methods = []
    for service in (*pb.DESCRIPTOR.services_by_name.values(), *cpb.DESCRIPTOR.services_by_name.values(),
                    *npb.DESCRIPTOR.services_by_name.values(),
                    *v2s.DESCRIPTOR.services_by_name.values()):
        methods += [f"/{service.full_name}/{m.name}" for m in service.methods]
    return methods


def test_every_served_method_has_a_declared_requirement() -> None:
    missing = [m for m in served_methods() if requirement_of(m) is None]
    assert missing == [], f"methods without a row in broker/auth/requirements.py: {missing}"
    declared = {f"{service}{name}" for service, table in TABLES.items() for name in table}
    assert declared == set(served_methods()), "rows for methods that no service has"


def test_user_administration_is_for_super_users_only() -> None:
    for name in ("CreateUser", "UpdateUser", "DeleteUser", "ListUsers", "GrantAcl", "RevokeAcl", "ListAcls"):
        assert is_super_only(requirement_of(f"/sluice.v1.Broker/{name}"))
    assert not is_super_only(requirement_of("/sluice.v1.Broker/SendMessage"))
    assert is_super_only(requirement_of("/sluice.v1.Broker/NotAMethod"))


# ------------------------------------------------------------------------------------------------ interceptors
def test_the_interceptors_wrap_each_method_once_not_per_call() -> None:
    """gRPC runs every interceptor on every call: a handler built per call made the request guard in front keep
    one cache entry per call (1.1 KB each, without bound)."""
    import grpc

    from broker.auth.gate import AuthGate, AuthSettings
    from broker.ha.replication_gate import ReplicationGate
    from broker.server.metrics import Counter
    from broker.server.request_guard import MalformedRequestGuard

    registered = {m: grpc.unary_unary_rpc_method_handler(lambda r, c: r, request_deserializer=bytes)
                  for m in ("/sluice.v1.Broker/SendMessage", "/sluice.v1.Broker/PullMessage")}

    signed = signed_metadata("root", "r", dt.datetime.now(dt.UTC))
    wrong = signed_metadata("root", "not-r", dt.datetime.now(dt.UTC))

    class Details(grpc.HandlerCallDetails):
        def __init__(self, method: str, metadata: tuple[tuple[str, str], ...]) -> None:
            self.method, self.invocation_metadata = method, metadata

    chain = [MalformedRequestGuard(), AuthGate(Accounts(None, User("root", "r")), AuthSettings(900, False),
                                               Counter("c", "c")), ReplicationGate()]

    def handler_for(method: str, metadata: tuple[tuple[str, str], ...] = signed) -> grpc.RpcMethodHandler:
        def through(i: int) -> grpc.RpcMethodHandler:
            if i == len(chain):
                return registered[method]
            return chain[i].intercept_service(lambda d: through(i + 1), Details(method, metadata))  # type: ignore[no-any-return]

        return through(0)

    for method in registered:
        first = handler_for(method)
        assert all(handler_for(method) is first for _ in range(1000))
        refused = handler_for(method, wrong)  # refused before its body is parsed: a handler of its own, no parser
        assert refused is not first and refused.request_deserializer is None
        assert handler_for(method) is first  # the refusal did not displace the method's handler in the guard
    guard = chain[0]
    assert isinstance(guard, MalformedRequestGuard) and len(guard._wrapped._wrapped) == 2
