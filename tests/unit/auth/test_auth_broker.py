"""Authentication and authorization on a running broker (in-process, TLS, ``auth_enabled``): every kind of bad
credential, the replay window, mutual TLS naming a user, each RPC refused without its right and admitted with it
(driven by the requirement table), Deny over Allow, revocation on the next request, retry and dead-letter
topics, source networks, and refusals that are counted and never carry a secret."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import logging
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as v2
from rocketmq.grpc_protocol import service_pb2 as v2s
from rocketmq.grpc_protocol import service_pb2_grpc as v2g

from broker.auth.accounts import User
from broker.auth.requirements import TABLES, is_super_only
from broker.client import Admin, Message, Producer, PullConsumer, PullStatus, encode_message
from broker.client.connection import Connection
from broker.client.credentials import Credentials
from broker.client.namesrv_client import NameServerClient
from broker.client.route import MessageQueue
from broker.client.tls import TlsSettings
from broker.config import BrokerConfig
from broker.errors import AuthenticationError, BrokerError, InvalidArgumentError, NoPermissionError, TlsError
from broker.format.signature import signed_metadata
from broker.namesrv import NameServer
from broker.proto import coordinator_pb2 as cpb
from broker.proto import coordinator_pb2_grpc as cpb_grpc
from broker.proto import namesrv_pb2 as npb
from broker.proto import sluice_pb2 as pb
from broker.proto import sluice_pb2_grpc as pb_grpc
from broker.server.broker_controller import BrokerController
from tests.support.auth_process import name_resources
from tests.support.broker_lookup import BrokerLookup
from tests.support.certs import Pki, tls_settings
from tests.support.waiting import wait_until

ROOT = Credentials("root", "root-secret-value")
# gRPC service path -> (stub class, module of its messages, service name)
SERVICES: dict[str, tuple[Any, Any, str]] = {
    "/sluice.v1.Broker/": (pb_grpc.BrokerStub, pb, "Broker"),
    "/sluice.v1.TransactionCoordinator/": (cpb_grpc.TransactionCoordinatorStub, cpb, "TransactionCoordinator"),
    "/apache.rocketmq.v2.MessagingService/": (v2g.MessagingServiceStub, v2s, "MessagingService"),
}
SECRET = "alice-secret-value"
TOPIC, GROUP = "AuthT", "AuthG"


@pytest.fixture
def secured(broker_factory: Callable[..., BrokerController], pki: Pki) -> BrokerController:
    return broker_factory(**tls_settings(pki), auth_enabled=True, auth_root_access_key=ROOT.access_key,
                          auth_root_secret_key=ROOT.secret_key)


@pytest.fixture
def ep(secured: BrokerController) -> str:
    return secured.address


def tls(pki: Pki) -> dict[str, Any]:
    return {"tls_ca": str(pki.ca)}


def as_root(pki: Pki) -> dict[str, Any]:
    return {**tls(pki), "access_key": ROOT.access_key, "secret_key": ROOT.secret_key}


def as_alice(pki: Pki, secret: str = SECRET) -> dict[str, Any]:
    return {**tls(pki), "access_key": "alice", "secret_key": secret}


def call(ep: str, pki: Pki, stub_method: str, request: Any, creds: Credentials | None = ROOT) -> Any:
    conn = Connection(ep, 10, TlsSettings(str(pki.ca)), creds)
    try:
        return conn.call(getattr(conn.stub, stub_method), request)
    finally:
        conn.close()


def admin_rpc(ep: str, pki: Pki, method: str, request: Any) -> Any:
    return call(ep, pki, method, request, ROOT)


def create_alice(ep: str, pki: Pki, *grants: tuple[str, str, str]) -> None:
    admin_rpc(ep, pki, "CreateUser", pb.UserRequest(access_key="alice", secret_key=SECRET))
    for resource, actions, decision in grants:
        grant(ep, pki, resource, actions, decision)


def grant(ep: str, pki: Pki, resource: str, actions: str, decision: str = "Allow", *nets: str) -> None:
    admin_rpc(
        ep,
        pki,
        "GrantAcl",
        pb.GrantAclRequest(
            entry=pb.AclEntry(
                access_key="alice", resource=resource, actions=actions.split(","), decision=decision, source_ips=nets
            )
        ),
    )


def make_topic(ep: str, pki: Pki, name: str = TOPIC) -> None:
    with Admin(ep, **as_root(pki)) as admin:
        admin.create_topic(name, 2)


# ------------------------------------------------------------------------------------------------ authentication
def test_missing_unknown_and_wrong_credentials_are_unauthenticated(ep: str, pki: Pki) -> None:
    make_topic(ep, pki)
    create_alice(ep, pki, ("Topic:AuthT", "Pub", "Allow"))
    with pytest.raises(AuthenticationError, match="requires credentials"), Producer(ep, **tls(pki)) as p:
        p.send(Message(TOPIC, b"x"))
    with (
        pytest.raises(AuthenticationError, match="'mallory' is unknown or disabled, or the signature is wrong"),
        Producer(ep, **{**as_alice(pki), "access_key": "mallory"}) as p,
    ):
        p.send(Message(TOPIC, b"x"))
    with (
        pytest.raises(AuthenticationError, match="'alice' is unknown or disabled, or the signature is wrong") as info,
        Producer(ep, **as_alice(pki, "not-the-secret")) as p,
    ):
        p.send(Message(TOPIC, b"x"))
    assert SECRET not in str(info.value) and "not-the-secret" not in str(info.value)
    with Producer(ep, **as_alice(pki)) as p:
        assert p.send(Message(TOPIC, b"ok")).status.name == "SEND_OK"


def raw_send(ep: str, pki: Pki, metadata: list[tuple[str, str]]) -> grpc.RpcError:
    creds = grpc.ssl_channel_credentials(pki.ca.read_bytes())
    with grpc.secure_channel(ep, creds) as channel:
        try:
            pb_grpc.BrokerStub(channel).SendMessage(pb.SendMessageRequest(topic=TOPIC, body=b"x"), metadata=metadata,
                                                    timeout=10)
        except grpc.RpcError as e:
            return e
    raise AssertionError("the send was accepted")


@pytest.mark.parametrize("metadata", [
    [("authorization", "MQv2-HMAC-SHA1 Credential=alice")],
    [("authorization", "Basic YWxpY2U6c2VjcmV0")],
    [("authorization", "MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, Signature=" + "0" * 40)],
    [("x-mq-date-time", "20261126T120000Z")],
])
def test_malformed_headers_are_unauthenticated_and_store_nothing(ep: str, pki: Pki, metadata: Any,
                                                                  secured: BrokerController) -> None:
    make_topic(ep, pki)
    create_alice(ep, pki, ("Topic:AuthT", "Pub", "Allow"))
    before = secured.store.max_offset(TOPIC, 0) + secured.store.max_offset(TOPIC, 1)  # type: ignore[union-attr]
    e = raw_send(ep, pki, metadata)
    assert e.code() is grpc.StatusCode.UNAUTHENTICATED, e
    assert dict(e.trailing_metadata())["sluice-response-code"] == "906"
    assert secured.store.max_offset(TOPIC, 0) + secured.store.max_offset(TOPIC, 1) == before  # type: ignore[union-attr]


def test_a_replayed_header_outside_the_window_is_refused(ep: str, pki: Pki) -> None:
    make_topic(ep, pki)
    create_alice(ep, pki, ("Topic:AuthT", "Pub", "Allow"))
    old = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=16)
    e = raw_send(ep, pki, list(signed_metadata("alice", SECRET, old)))
    assert e.code() is grpc.StatusCode.UNAUTHENTICATED and "window" in (e.details() or "")
    recent = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=14)  # a slow clock inside the window still works
    with pytest.raises(AssertionError, match="accepted"):
        raw_send(ep, pki, list(signed_metadata("alice", SECRET, recent)))


def test_a_plaintext_client_against_the_tls_broker_gets_a_clear_error(ep: str) -> None:
    with pytest.raises(TlsError), Producer(ep, access_key="alice", secret_key=SECRET, timeout_s=5) as p:
        p.send(Message(TOPIC, b"x"))


def test_auth_needs_tls_or_an_explicit_allowance(tmp_path: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="allow_plaintext_auth"):
        BrokerConfig(listen="127.0.0.1:0", store_path=str(tmp_path / "s"), auth_enabled=True)
    BrokerConfig(listen="127.0.0.1:0", store_path=str(tmp_path / "s"), auth_enabled=True, allow_plaintext_auth=True)


def test_a_broker_with_auth_and_no_user_refuses_to_start(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLUICE_ROOT_ACCESS_KEY", raising=False)
    monkeypatch.delenv("SLUICE_ROOT_SECRET_KEY", raising=False)
    config = BrokerConfig(listen="127.0.0.1:0", store_path=str(tmp_path / "s"), auth_enabled=True,
                          allow_plaintext_auth=True)
    with pytest.raises(InvalidArgumentError, match="SLUICE_ROOT_ACCESS_KEY"):
        BrokerController(config).start()


def test_the_root_user_can_come_from_the_environment(broker_factory: Callable[..., BrokerController],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_ROOT_ACCESS_KEY", "envroot")
    monkeypatch.setenv("SLUICE_ROOT_SECRET_KEY", "env-root-secret")
    b = broker_factory(auth_enabled=True, allow_plaintext_auth=True)
    with Admin(b.address, access_key="envroot", secret_key="env-root-secret") as admin:
        admin.create_topic("EnvT", 1)
    with pytest.raises(AuthenticationError), Admin(b.address) as admin:
        admin.create_topic("EnvT2", 1)


def test_mutual_tls_certificate_names_the_user(broker_factory: Callable[..., BrokerController], pki: Pki) -> None:
    b = broker_factory(**tls_settings(pki, tls_ca=str(pki.ca), tls_client_auth="require"), auth_enabled=True,
                       auth_root_access_key=ROOT.access_key, auth_root_secret_key=ROOT.secret_key)
    mtls: dict[str, Any] = {"tls_ca": str(pki.ca), "tls_cert": str(pki.client_cert), "tls_key": str(pki.client_key)}
    with Admin(b.address, **mtls, access_key=ROOT.access_key, secret_key=ROOT.secret_key) as admin:
        admin.create_topic(TOPIC, 1)
    with (
        pytest.raises(AuthenticationError),
        Producer(b.address, **mtls) as p,
    ):  # a verified certificate, but no user of that name yet
        p.send(Message(TOPIC, b"x"))
    conn = Connection(b.address, 10, TlsSettings(str(pki.ca), str(pki.client_cert), str(pki.client_key)), ROOT)
    conn.call(conn.stub.CreateUser, pb.UserRequest(access_key="client", secret_key="unused-secret"))
    conn.call(conn.stub.GrantAcl, pb.GrantAclRequest(entry=pb.AclEntry(access_key="client", resource=f"Topic:{TOPIC}",
                                                                       actions=["Pub"])))
    conn.close()
    with Producer(b.address, **mtls) as p:  # the certificate's CN is "client"
        assert p.send(Message(TOPIC, b"x")).status.name == "SEND_OK"


# ------------------------------------------------------------------------------------------------ authorization
def test_pub_only_cannot_consume_and_sub_on_the_topic_is_not_enough(ep: str, pki: Pki) -> None:
    make_topic(ep, pki)
    create_alice(ep, pki, ("Topic:AuthT", "Pub", "Allow"))
    with Producer(ep, **as_alice(pki)) as p:
        p.send(Message(TOPIC, b"x"))
    queue = MessageQueue(TOPIC, "", 0)
    with PullConsumer(ep, GROUP, **as_alice(pki)) as c, pytest.raises(NoPermissionError, match=f"Sub on Group:{GROUP}"):
        c.pull(queue, 0, 10)
    grant(ep, pki, f"Topic:{TOPIC}", "Sub")
    with PullConsumer(ep, GROUP, **as_alice(pki)) as c, pytest.raises(NoPermissionError, match=f"Sub on Group:{GROUP}"):
        c.pull(queue, 0, 10)
    grant(ep, pki, f"Group:{GROUP}", "Sub")
    with PullConsumer(ep, GROUP, **as_alice(pki)) as c:
        assert c.pull(queue, 0, 10).status in (PullStatus.FOUND, PullStatus.NO_NEW_MSG)


def test_deny_beats_allow_and_a_literal_beats_a_prefix(ep: str, pki: Pki) -> None:
    make_topic(ep, pki, "orders-eu")
    make_topic(ep, pki, "orders-us")
    create_alice(ep, pki, ("Topic:orders-*", "Pub", "Allow"), ("Topic:orders-eu", "Pub", "Deny"))
    with Producer(ep, **as_alice(pki)) as p:
        assert p.send(Message("orders-us", b"x")).status.name == "SEND_OK"
        with pytest.raises(NoPermissionError, match="orders-eu"):
            p.send(Message("orders-eu", b"x"))
    grant(ep, pki, "Topic:orders-us", "Pub", "Deny")
    grant(ep, pki, "Topic:orders-us", "Pub", "Allow")  # equal specificity: Deny still wins
    with Producer(ep, **as_alice(pki)) as p, pytest.raises(NoPermissionError):
        p.send(Message("orders-us", b"x"))


def test_revocation_and_disabling_apply_to_the_next_request(ep: str, pki: Pki) -> None:
    make_topic(ep, pki)
    create_alice(ep, pki, ("Topic:AuthT", "Pub", "Allow"))
    with Producer(ep, **as_alice(pki)) as p:
        p.send(Message(TOPIC, b"1"))
        admin_rpc(ep, pki, "RevokeAcl", pb.RevokeAclRequest(access_key="alice", resource=f"Topic:{TOPIC}"))
        with pytest.raises(NoPermissionError):
            p.send(Message(TOPIC, b"2"))
        grant(ep, pki, f"Topic:{TOPIC}", "Pub")
        p.send(Message(TOPIC, b"3"))
        admin_rpc(ep, pki, "UpdateUser", pb.UserRequest(access_key="alice", enabled=False))
        with pytest.raises(AuthenticationError):
            p.send(Message(TOPIC, b"4"))
        admin_rpc(ep, pki, "UpdateUser", pb.UserRequest(access_key="alice", enabled=True))
        p.send(Message(TOPIC, b"5"))
        admin_rpc(ep, pki, "DeleteUser", pb.DeleteUserRequest(access_key="alice"))
        with pytest.raises(AuthenticationError):
            p.send(Message(TOPIC, b"6"))


def test_a_new_secret_replaces_the_old_one(ep: str, pki: Pki) -> None:
    make_topic(ep, pki)
    create_alice(ep, pki, ("Topic:AuthT", "Pub", "Allow"))
    admin_rpc(ep, pki, "UpdateUser", pb.UserRequest(access_key="alice", secret_key="rotated-secret"))
    with pytest.raises(AuthenticationError), Producer(ep, **as_alice(pki)) as p:
        p.send(Message(TOPIC, b"x"))
    with Producer(ep, **as_alice(pki, "rotated-secret")) as p:
        p.send(Message(TOPIC, b"x"))


def test_retry_and_dead_letter_topics_follow_the_groups_rights(ep: str, pki: Pki) -> None:
    create_alice(ep, pki, (f"Group:{GROUP}", "Sub", "Allow"))
    with PullConsumer(ep, GROUP, **as_alice(pki)) as c:
        for name in (f"%RETRY%{GROUP}", f"%DLQ%{GROUP}"):
            with pytest.raises(BrokerError) as info:  # allowed: what follows is the broker's own refusal or answer
                c.pull(MessageQueue(name, "", 0), 0, 1)
                raise BrokerError("pulled")
            assert not isinstance(info.value, NoPermissionError | AuthenticationError) or "lacks" not in str(
                info.value
            ), info.value
        with pytest.raises(NoPermissionError, match="lacks"):
            c.pull(MessageQueue("%RETRY%OtherGroup", "", 0), 0, 1)


def test_source_networks_are_a_condition_on_top_of_authentication(ep: str, pki: Pki) -> None:
    make_topic(ep, pki)
    create_alice(ep, pki, ("Topic:AuthT", "Pub", "Allow"))
    grant(ep, pki, f"Topic:{TOPIC}", "Pub", "Deny", "127.0.0.0/8")
    with Producer(ep, **as_alice(pki)) as p, pytest.raises(NoPermissionError):
        p.send(Message(TOPIC, b"x"))
    admin_rpc(ep, pki, "RevokeAcl", pb.RevokeAclRequest(access_key="alice", resource=f"Topic:{TOPIC}"))
    grant(ep, pki, f"Topic:{TOPIC}", "Pub", "Allow", "10.0.0.0/8")  # allowed only from elsewhere
    with Producer(ep, **as_alice(pki)) as p, pytest.raises(NoPermissionError):
        p.send(Message(TOPIC, b"x"))
    with (
        pytest.raises(AuthenticationError),
        Producer(ep, **tls(pki)) as p,
    ):  # an allowed network lets no one in without credentials
        p.send(Message(TOPIC, b"x"))


def test_non_super_users_cannot_manage_users(ep: str, pki: Pki) -> None:
    create_alice(ep, pki, ("*", "All", "Allow"))
    alice = Credentials("alice", SECRET)
    for method, request in (("CreateUser", pb.UserRequest(access_key="eve", secret_key="x")),
                            ("GrantAcl", pb.GrantAclRequest(entry=pb.AclEntry(access_key="alice", resource="*",
                                                                              actions=["All"]))),
                            ("ListUsers", pb.ListUsersRequest())):
        with pytest.raises(NoPermissionError, match="super users only"):
            call(ep, pki, method, request, alice)
    users = admin_rpc(ep, pki, "ListUsers", pb.ListUsersRequest()).users
    assert [(u.access_key, u.super_user) for u in users] == [("alice", False), ("root", True)]


def test_refusals_are_counted_logged_briefly_and_never_carry_a_secret(
    ep: str, pki: Pki, secured: BrokerController, caplog: pytest.LogCaptureFixture
) -> None:
    make_topic(ep, pki)
    create_alice(ep, pki)
    caplog.set_level(logging.DEBUG)
    with Producer(ep, **as_alice(pki, "a-wrong-secret-value")) as p:
        for _ in range(20):
            with pytest.raises(AuthenticationError):
                p.send(Message(TOPIC, b"x"))
    with Producer(ep, **as_alice(pki)) as p, pytest.raises(NoPermissionError):
        p.send(Message(TOPIC, b"x"))
    text = caplog.text + secured.metrics.render()
    for secret in (SECRET, "a-wrong-secret-value", ROOT.secret_key):
        assert secret not in text
    refusals = [r for r in caplog.records if "refused" in r.getMessage() and "wrong signature" in r.getMessage()]
    assert 1 <= len(refusals) <= 10  # at most LOG_PER_SECOND a second, the rest only counted
    assert "sluice_auth_refusals_total" in secured.metrics.render()
    assert secured.metrics.auth_refusals.value((("reason", "unauthenticated"),)) >= 20
    assert secured.metrics.auth_refusals.value((("reason", "denied"),)) >= 1


# ------------------------------------------------------------------------------------------------ every RPC
def sample_request(message_type: Any) -> Any:
    """A request of ``message_type`` naming AuthT, AuthG and AuthP wherever it names a topic or a group."""
    request = message_type()
    for field in message_type.DESCRIPTOR.fields:
        name = field.name
        if field.message_type is None:
            if name == "topic":
                setattr(request, name, TOPIC)
            elif name == "consumer_group":
                setattr(request, name, GROUP)
            elif name == "producer_group":
                setattr(request, name, "AuthP")
            elif name in ("client_id", "transaction_id", "msg_id", "key"):
                with contextlib.suppress(TypeError, AttributeError):  # a repeated field of that name: left empty
                    setattr(request, name, "c1")
            elif name == "resolution":  # RocketMQ 5's EndTransaction: a well-formed one reaches its rights
                setattr(request, name, 1)  # COMMIT
            elif name == "entries" and field.type == field.TYPE_BYTES:
                setattr(request, name, encode_message(Message(TOPIC, b"x"), 0))
            continue
        name_resources(request, name, field.message_type.name, TOPIC, GROUP)
    return request


def every_method() -> Iterator[tuple[str, str, Any]]:
    for path, (_, module, service_name) in SERVICES.items():
        service = module.DESCRIPTOR.services_by_name[service_name]
        for m in service.methods:
            if m.client_streaming or is_super_only(TABLES[path].get(m.name)):
                continue  # Telemetry: rights from metadata only; user admin: test_non_super_users_cannot_manage_users
            yield path, m.name, m


def invoke(ep: str, pki: Pki, path: str, method: Any, creds: Credentials) -> grpc.RpcError | None:
    stub_class, module, _ = SERVICES[path]
    request = sample_request(getattr(module, method.input_type.name))
    creds_channel = grpc.ssl_channel_credentials(pki.ca.read_bytes())
    with grpc.secure_channel(ep, creds_channel) as channel:
        rpc = getattr(stub_class(channel), method.name)
        metadata = [*creds.metadata(), ("x-mq-client-id", f"auth-test-{creds.access_key}")]
        try:
            answer = rpc(request, metadata=metadata, timeout=2)
            if method.server_streaming:  # a stream's refusal: the call's error, or (RocketMQ 5) its first answer's
                answer = next(iter(answer), None)
        except grpc.RpcError as e:
            return e
    status = getattr(answer, "status", None)
    if getattr(status, "code", None) == v2.Code.FORBIDDEN:  # RocketMQ 5 answers refusals in its status
        return V2Refusal(status.message)
    return None


class V2Refusal(grpc.RpcError):
    """A RocketMQ 5 answer refused for permission (its status, not the call's), read as the call's would be."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.PERMISSION_DENIED

    def details(self) -> str:
        return self.message


def test_each_rpc_is_refused_without_its_right_and_admitted_with_it(ep: str, pki: Pki, secured: BrokerController
                                                                     ) -> None:
    make_topic(ep, pki)
    create_alice(ep, pki)
    alice = Credentials("alice", SECRET)
    checked = []
    for path, name, method in every_method():
        requirement = TABLES[path][name]
        module = SERVICES[path][1]
        assert secured.store is not None and secured.transactions is not None
        lookup = BrokerLookup(secured.store, secured.transactions)
        needs = requirement(sample_request(getattr(module, method.input_type.name)), lookup)
        if needs:
            e = invoke(ep, pki, path, method, alice)
            assert e is not None and e.code() is grpc.StatusCode.PERMISSION_DENIED, (path, name, e)
        for n in needs:
            grant(ep, pki, str(n.resource), sorted(a.value for a in n.actions)[0])
        e = invoke(ep, pki, path, method, alice)
        assert (
            e is None
            or e.code() not in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
            or ("lacks" not in (e.details() or "") and "credentials" not in (e.details() or ""))
        ), (name, e.details())
        admin_rpc(ep, pki, "DeleteUser", pb.DeleteUserRequest(access_key="alice"))
        create_alice(ep, pki)
        checked.append(name)
    assert len(checked) >= 45, checked


# ------------------------------------------------------------------------------------------------ name server
def test_a_name_server_with_auth_takes_registrations_from_the_root_user_only(
    broker_factory: Callable[..., BrokerController], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("SLUICE_ROOT_ACCESS_KEY", raising=False)
    monkeypatch.delenv("SLUICE_ROOT_SECRET_KEY", raising=False)
    with NameServer("127.0.0.1", 0, root=User(ROOT.access_key, ROOT.secret_key)) as ns:
        fast = {"namesrv_addr": ns.address, "register_interval_ms": 200}
        broker_factory(tmp_path / "signed", broker_name="signed", auth_root_access_key=ROOT.access_key,
                       auth_root_secret_key=ROOT.secret_key, **fast)
        broker_factory(tmp_path / "unsigned", broker_name="unsigned", **fast)
        reader = NameServerClient([ns.address])  # route reads need no credentials

        def names() -> set[str]:
            return {
                b.broker_name for b in reader.call("GetBrokerClusterInfo", npb.GetBrokerClusterInfoRequest()).brokers
            }

        wait_until(lambda: "signed" in names() and ns.refusals.value((("reason", "unauthenticated"),)) >= 2,
                   "the signed broker registered and the unsigned one refused twice")
        assert names() == {"signed"}
        reader.close()


def test_metrics_need_a_user_with_get_on_the_cluster(broker_factory: Callable[..., BrokerController], pki: Pki) -> None:
    b = broker_factory(**tls_settings(pki), auth_enabled=True, auth_root_access_key=ROOT.access_key,
                       auth_root_secret_key=ROOT.secret_key, metrics_port=0)
    url = f"https://127.0.0.1:{b.metrics_port}/metrics"
    context = ssl.create_default_context(cafile=str(pki.ca))

    def scrape(user: str | None, secret: str = "") -> int:
        request = urllib.request.Request(url)
        if user is not None:
            request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode())
        try:
            with urllib.request.urlopen(request, context=context, timeout=10) as answer:
                assert b"sluice_put_messages_total" in answer.read()
                return int(answer.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    create_alice(b.address, pki)
    assert scrape(None) == 401
    assert scrape("alice", "wrong") == 401
    assert scrape("alice", SECRET) == 403
    grant(b.address, pki, "Cluster", "Get")
    assert scrape("alice", SECRET) == 200
    assert scrape(ROOT.access_key, ROOT.secret_key) == 200
    assert b.metrics.auth_refusals.value((("reason", "denied"),)) >= 1


def test_a_batch_is_refused_whole_when_one_of_its_topics_is_not_allowed(
    ep: str, pki: Pki, secured: BrokerController
) -> None:
    make_topic(ep, pki)
    make_topic(ep, pki, "Forbidden")
    create_alice(ep, pki, ("Topic:AuthT", "Pub", "Allow"), ("Group:AuthP", "Pub", "Allow"))
    store = secured.store
    assert store is not None

    def stored() -> int:
        return sum(store.max_offset(t, q) for t in (TOPIC, "Forbidden") for q in (0, 1))

    mixed = b"".join(encode_message(Message(t, b"x"), 0) for t in (TOPIC, "Forbidden", TOPIC))
    with Producer(ep, "AuthP", **as_alice(pki)) as p:
        for transaction_id in (None, "auth-txn-1"):  # plain, and as half messages of a batch transaction
            with pytest.raises(NoPermissionError, match="lacks Pub on Topic:Forbidden"):
                p.send_encoded(mixed, 3, transaction_id)
        assert stored() == 0
        allowed = b"".join(encode_message(Message(TOPIC, b"x"), 0) for _ in range(3))
        p.send_encoded(allowed, 3)
        p.send_encoded(allowed, 3, "auth-txn-2")
    with Producer(ep, "OtherGroup", **as_alice(pki)) as p, pytest.raises(NoPermissionError, match="Group:OtherGroup"):
        p.send_encoded(allowed, 3, "auth-txn-3")  # a transaction of a group alice may not publish for
    assert stored() == 3


def test_a_broker_without_auth_refuses_user_administration(broker_factory: Callable[..., BrokerController]) -> None:
    b = broker_factory()
    conn = Connection(b.address, 10)
    try:
        with pytest.raises(NoPermissionError, match="--auth"):
            conn.call(conn.stub.CreateUser, pb.UserRequest(access_key="planted", secret_key="planted-secret"))
    finally:
        conn.close()
    assert b.accounts is not None and b.accounts.user("planted") is None


def test_a_send_stream_is_authenticated_once_and_each_message_authorized(
    ep: str, pki: Pki, secured: BrokerController
) -> None:
    """Producer.send goes on a SendStream: its open is authenticated (the date-time window applies then), and each
    message needs the rights a SendMessage call needs; a refused message does not end the stream."""
    make_topic(ep, pki)
    make_topic(ep, pki, "AuthOther")
    create_alice(ep, pki, ("Topic:AuthT", "Pub", "Allow"))
    gate = secured.auth_gate
    assert gate is not None
    with pytest.raises(AuthenticationError), Producer(ep, **tls(pki)) as anonymous:
        anonymous.send(Message(TOPIC, b"anonymous"), queue_id=0)
    with Producer(ep, **as_alice(pki)) as p:
        p.send(Message(TOPIC, b"1"), queue_id=0)
        with pytest.raises(NoPermissionError, match="AuthOther"):
            p.send(Message("AuthOther", b"2"), queue_id=0)
        p.send(Message(TOPIC, b"3"), queue_id=0)
        assert p.conn.send_stream.answers == 3  # one stream, the refusal one of its answers
        later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=gate.settings.window_s + 60)
        gate.clock = lambda: later  # the stream's signed date-time is now outside the window
        p.send(Message(TOPIC, b"4"), queue_id=0)  # checked when the stream opened; its messages are not re-dated
        assert p.conn.send_stream.answers == 4
        with pytest.raises(AuthenticationError, match="window"), Producer(ep, **as_alice(pki)) as fresh:
            fresh.send(Message(TOPIC, b"replayed"), queue_id=0)  # a new stream is checked against the window
    gate.clock = lambda: dt.datetime.now(dt.UTC)
    with PullConsumer(ep, "reader", **as_root(pki)) as c:
        bodies = [m.body for q in range(2) for m in c.pull(TOPIC, q, 0, max_msgs=100).messages]
    assert sorted(bodies) == [b"1", b"3", b"4"]
