"""The authorization matrix, generated from the operation table: every method of every protocol front (the Sluice
service, the transaction coordinator, RocketMQ 5's MessagingService) that does an operation, called by a user with
no rights, by users holding the right actions on the wrong object (each object in turn), and by one holding exactly
the rights the row declares (requirements.py's rows, operations.py's rules). The first two are refused for
permission; the last is not (it may fail for other reasons: NOT_FOUND, a bad request...). The resolved operations
are aimed at real objects that are not the ones the request names: an open transaction recorded under another
producer group, a stored message of another topic. One broker process serves the whole module."""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as v2
from rocketmq.grpc_protocol import service_pb2 as v2s
from rocketmq.grpc_protocol import service_pb2_grpc as v2g

from broker.auth.operations import RULES, Operation
from broker.auth.policy import Kind, Need, Resource, group, topic
from broker.auth.requirements import TABLES, Row, is_anonymous, is_super_only
from broker.client import Message, encode_message
from broker.client.credentials import Credentials
from broker.client.half_batch import to_half_batch
from broker.format.message import msg_id_at
from broker.proto import coordinator_pb2 as cpb
from broker.proto import coordinator_pb2_grpc as cpb_grpc
from broker.proto import sluice_pb2 as pb
from broker.proto import sluice_pb2_grpc as pb_grpc
from tests.support.auth_process import FORBIDDEN, Secured, name_resources, secured_broker

TOPIC, GROUP, OWN_PRODUCER = "MxT", "MxG", "MxOwnP"
VICTIM_PRODUCER = "MxVictimP"  # the group the matrix's open transactions are recorded under
MESSAGE_TOPIC = "MxStored"  # the topic of the stored message a send-back or a view resolves
STREAM_TIMEOUT_S = 1.5  # a streaming call admitted holds until its deadline: long enough to be admitted
SERVICES: dict[str, tuple[Any, Any, str]] = {
    "/sluice.v1.Broker/": (pb_grpc.BrokerStub, pb, "Broker"),
    "/sluice.v1.TransactionCoordinator/": (cpb_grpc.TransactionCoordinatorStub, cpb, "TransactionCoordinator"),
    "/apache.rocketmq.v2.MessagingService/": (v2g.MessagingServiceStub, v2s, "MessagingService"),
}
# Operations no method of these fronts does: super users' own (user administration: test_auth_broker's
# test_non_super_users_cannot_manage_users) and the name server's anonymous route reads (test_auth_broker).
# Decided elsewhere: super-user rows and the name server's anonymous reads (test_auth_broker.py); a Telemetry
# stream's settings (tests/unit/rmqv2/test_rmqv2_client_security.py)
ELSEWHERE = {Operation.SUPER_USER, Operation.READ_ROUTES, Operation.PUBLISHER_SETTINGS, Operation.SUBSCRIBER_SETTINGS}


@dataclass
class World:
    """The objects the matrix made, as the broker would resolve them (the table's ``Lookup``, on the test side)."""

    broker: Secured
    groups: dict[str, str] = field(default_factory=dict)  # transaction id -> recorded producer group
    topics: dict[str, str] = field(default_factory=dict)  # msg id -> topic
    stored: pb.SendResponse | None = None

    def transaction_group(self, txn_id: str, half_commitlog_offset: int | None) -> str | None:
        return self.groups.get(txn_id)

    def message_topic(self, msg_id: str) -> str | None:
        return self.topics.get(msg_id)

    def open_transaction(self) -> str:
        txn_id = f"mx-{uuid.uuid4().hex[:12]}"
        self.broker.open_transaction(TOPIC, VICTIM_PRODUCER, txn_id)
        self.groups[txn_id] = VICTIM_PRODUCER
        return txn_id

    def message_id(self) -> str:
        assert self.stored is not None
        msg_id = msg_id_at(self.stored.msg_id_prefix, self.stored.commitlog_offsets[0])
        self.topics[msg_id] = MESSAGE_TOPIC
        return msg_id


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with secured_broker(tmp_path_factory.mktemp("auth-matrix")) as broker:
        for name in (TOPIC, MESSAGE_TOPIC):
            broker.topic(name, 2)
        w = World(broker)
        w.stored = broker.send(MESSAGE_TOPIC, b"stored")
        yield w


# ------------------------------------------------------------------------------------------------ requests
def sample_request(message_type: Any) -> Any:
    """A request of ``message_type`` naming MxT, MxG and MxOwnP wherever it names a topic or a group."""
    request = message_type()
    for f in message_type.DESCRIPTOR.fields:
        name = f.name
        if f.message_type is None:
            value: Any = {"topic": TOPIC, "consumer_group": GROUP, "producer_group": OWN_PRODUCER,
                          "resolution": 1}.get(name)
            if name in ("client_id", "key", "msg_id"):
                value = "c1"
            if value is not None:
                with contextlib.suppress(TypeError, AttributeError):  # a repeated field of that name: left empty
                    setattr(request, name, value)
            continue
        name_resources(request, name, f.message_type.name, TOPIC, GROUP)
    return request


def _v2_join(w: World) -> Any:
    """A transactional RocketMQ 5 send whose message id names an open transaction of another group."""
    message = v2.Message(topic=v2.Resource(name=TOPIC), body=b"x", system_properties=v2.SystemProperties(
        message_id=w.open_transaction(), message_type=v2.TRANSACTION, body_encoding=v2.IDENTITY))
    return v2s.SendMessageRequest(messages=[message])


# Requests aimed at resolved objects (fresh for each call: a call let through may end what it names).
AIMED: dict[str, Callable[[World], Any]] = {
    "/sluice.v1.Broker/EndTransaction": lambda w: pb.EndTransactionRequest(
        transaction_id=w.open_transaction(), producer_group=OWN_PRODUCER, commit=False),
    "/sluice.v1.Broker/SendMessage": lambda w: pb.SendMessageRequest(
        topic=TOPIC, queue_id=0, body=b"x", producer_group=OWN_PRODUCER, transactional=True,
        transaction_id=w.open_transaction()),
    "/sluice.v1.Broker/SendBatch": lambda w: (lambda txn: pb.SendBatchRequest(
        entries=to_half_batch(encode_message(Message(TOPIC, b"x"), 0), OWN_PRODUCER, txn), count=1,
        producer_group=OWN_PRODUCER, transaction_id=txn))(w.open_transaction()),
    "/sluice.v1.Broker/ConsumerSendMsgBack": lambda w: pb.ConsumerSendMsgBackRequest(
        consumer_group=GROUP, msg_id=w.message_id(), delay_level=-1),
    "/sluice.v1.Broker/ViewMessageById": lambda w: pb.ViewMessageByIdRequest(msg_id=w.message_id()),
    "/sluice.v1.Broker/DeleteTopic": lambda w: pb.DeleteTopicRequest(topic=TOPIC + "Gone"),
    "/sluice.v1.TransactionCoordinator/RecordDecision": lambda w: cpb.RecordDecisionRequest(
        decision=cpb.TransactionDecision(transaction_id=f"mx-{uuid.uuid4().hex[:12]}", outcome="ABORT")),
    "/apache.rocketmq.v2.MessagingService/EndTransaction": lambda w: v2s.EndTransactionRequest(
        topic=v2.Resource(name=TOPIC), transaction_id=w.open_transaction(), message_id="m",
        resolution=v2.ROLLBACK, source=v2.SOURCE_CLIENT),
    "/apache.rocketmq.v2.MessagingService/SendMessage": _v2_join,
}


# ------------------------------------------------------------------------------------------------ rights
def wrong(n: Need) -> list[tuple[str, str]]:
    """The actions of ``n`` granted on objects that are not its own (for the Cluster: on every topic and group)."""
    action = sorted(a.value for a in n.actions)[0]
    r = n.resource
    if r.kind is Kind.CLUSTER:
        return [("Topic:*", action), ("Group:*", action)]
    other: Resource = topic(r.name + "Wrong") if r.kind is Kind.TOPIC else group(r.name + "Wrong")
    return [(str(other), action)]


def right(n: Need) -> list[tuple[str, str]]:
    return [(str(n.resource), sorted(a.value for a in n.actions)[0])]


def refused_for_permission(error: Any) -> bool:
    return error is not None and "lacks" in error[1]


def invoke(w: World, path: str, method: Any, request: Any, creds: Credentials) -> tuple[str, str] | None:
    """The call's refusal as (code, reason): a gRPC error's, or a RocketMQ 5 answer's status when not OK."""
    stub_class = SERVICES[path][0]
    with grpc.insecure_channel(w.broker.endpoint) as channel:
        rpc = getattr(stub_class(channel), method.name)
        metadata = [*creds.metadata(), ("x-mq-client-id", f"matrix-{creds.access_key}")]
        try:
            if method.server_streaming:
                answers = list(itertools.islice(rpc(request, metadata=metadata, timeout=STREAM_TIMEOUT_S), 1))
            else:
                answers = [rpc(request, metadata=metadata, timeout=10)]
        except grpc.RpcError as e:
            return (e.code().name, e.details() or "")  # type: ignore[attr-defined]
    for answer in answers:
        for status in (getattr(answer, "status", None),
                       *(e.status for e in getattr(answer, "entries", ()) if hasattr(e, "status"))):
            if getattr(status, "code", None) == FORBIDDEN:
                return ("FORBIDDEN", status.message)  # type: ignore[union-attr]
    return None


@dataclass(frozen=True)
class Case:
    path: str
    method: Any

    @property
    def key(self) -> str:
        return self.path + self.method.name


def cases() -> list[Case]:
    found = []
    for path, (_, module, service_name) in SERVICES.items():
        for m in module.DESCRIPTOR.services_by_name[service_name].methods:
            row = TABLES[path].get(m.name)
            if m.client_streaming or is_super_only(row) or is_anonymous(row):
                continue  # streams of requests: each request is its unary call's; super-only: elsewhere
            assert isinstance(row, Row), (path, m.name)
            found.append(Case(path, m))
    return found


def request_for(w: World, case: Case) -> Any:
    aimed = AIMED.get(case.key)
    if aimed is not None:
        return aimed(w)
    return sample_request(getattr(SERVICES[case.path][1], case.method.input_type.name))


CASES = cases()


@pytest.mark.parametrize("case", CASES, ids=[c.key.rsplit(".", 1)[-1] for c in CASES])
def test_every_operation_through_every_front(world: World, case: Case) -> None:
    row = TABLES[case.path][case.method.name]
    needs = row(request_for(world, case), world)
    if not needs:  # the row does nothing a right governs (Telemetry's stream, a heartbeat naming no group...)
        assert row.operations(request_for(world, case), world) in ((), (Operation.HEARTBEAT,)), case.key
        return
    # no rights at all
    error = invoke(world, case.path, case.method, request_for(world, case), world.broker.user())
    assert refused_for_permission(error), (case.key, "no rights", error)
    # the right actions, one object at a time on the wrong object
    for i, n in enumerate(needs):
        grants = [g for j, m in enumerate(needs) for g in (wrong(m) if j == i else right(m))]
        error = invoke(world, case.path, case.method, request_for(world, case), world.broker.user(*grants))
        assert refused_for_permission(error), (case.key, "wrong object", n.describe(), grants, error)
    # exactly the rights the row declares
    grants = [g for n in needs for g in right(n)]
    error = invoke(world, case.path, case.method, request_for(world, case), world.broker.user(*grants))
    assert not refused_for_permission(error), (case.key, "right rights", grants, error)


def test_the_matrix_covers_every_operation(world: World) -> None:
    done = {op for c in CASES for op in TABLES[c.path][c.method.name].operations(request_for(world, c), world)}
    assert set(RULES) - ELSEWHERE <= done, sorted(op.value for op in set(RULES) - ELSEWHERE - done)
    resolved = {op for op, rule in RULES.items() if rule.resolved}
    assert resolved == {Operation.END_TRANSACTION, Operation.JOIN_TRANSACTION, Operation.SEND_BACK,
                        Operation.PUBLISH_BATCH, Operation.PUBLISHER_SETTINGS, Operation.SUBSCRIBER_SETTINGS,
                        Operation.VIEW_MESSAGE}
    # each resolved operation is reached through each front that has it, aimed at an object the request
    # does not name (AIMED)
    v2 = "/apache.rocketmq.v2.MessagingService/"
    for key in ("/sluice.v1.Broker/EndTransaction", f"{v2}EndTransaction", "/sluice.v1.Broker/SendMessage",
                "/sluice.v1.Broker/SendBatch", f"{v2}SendMessage", "/sluice.v1.Broker/ConsumerSendMsgBack",
                "/sluice.v1.Broker/ViewMessageById"):
        assert key in AIMED
