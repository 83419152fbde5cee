"""Per-client tables and RocketMQ 5 Telemetry under auth, attacked as a client would (raw v2 and Sluice stubs,
each call signed by a user holding only the rights named), against one broker process with small limits: a
stranger's Telemetry settings get no check-back, its NotifyClientTermination ends nobody, the client table and
the stream workers are capped per user, settings are bounded and create no group. Each test asserts the refusal
and that nothing changed for the legitimate client."""

from __future__ import annotations

import datetime as dt
import json
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from rmqv2_helpers import AUTH, ROOT, create_user, name
from rocketmq.grpc_protocol import definition_pb2 as v2
from rocketmq.grpc_protocol import service_pb2 as v2s
from rocketmq.grpc_protocol import service_pb2_grpc as v2g

from broker.client import Admin, Message
from broker.client.transaction_producer import LocalTransactionState, TransactionProducer
from broker.errors import ResponseCode
from broker.format.signature import signed_metadata
from broker.private_file import write_private
from broker.proto import sluice_pb2 as pb
from broker.proto import sluice_pb2_grpc as pbg
from broker.proto.status import RESPONSE_CODE_KEY
from broker.server.process import BrokerProcess
from tests.support.waiting import wait_for

MAX_CLIENTS = 40  # a user may hold a quarter: 10
WORKERS, RESERVED = 48, 8  # held-call budget 40: a user may hold a quarter, 10 streams
PER_USER = 10
SETTINGS: dict[str, Any] = {
    **AUTH, "rmqv2_max_clients": MAX_CLIENTS, "grpc_max_workers": WORKERS,
    "grpc_reserved_workers": RESERVED, "transaction_timeout_ms": 1000, "transaction_check_interval_ms": 200,
    "store": {"mapped_file_size_commit_log": 16 << 20, "mapped_file_size_consume_queue": 4000 * 20,
              "max_hash_slot_num": 4096, "max_index_num": 16384},
}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("rmqv2-clients")
    config = root / "broker.json"
    write_private(config, json.dumps(SETTINGS).encode())  # it holds auth_root_secret_key: 0600 or refused
    proc = BrokerProcess(root / "store", config=config, log_level="WARNING").start()
    yield proc
    assert proc.stop() == 0, "\n".join(proc.output)


def user(ep: str, *grants: tuple[str, list[str]]) -> tuple[str, str]:
    """A new user holding ``grants``; its (access key, secret key)."""
    return create_user(ep, name("u"), *grants)


def signed(creds: tuple[str, str] | None, client_id: str = "") -> list[tuple[str, str]]:
    md = list(signed_metadata(creds[0], creds[1], dt.datetime.now(dt.UTC))) if creds else []
    return md + ([("x-mq-client-id", client_id)] if client_id else [])


@pytest.fixture
def v2stub(secured: BrokerProcess) -> Iterator[Any]:
    with grpc.insecure_channel(secured.endpoint) as channel:
        yield v2g.MessagingServiceStub(channel)


def resource(text: str) -> v2.Resource:
    return v2.Resource(name=text)


def publishing(*topics: str) -> Any:
    return v2s.TelemetryCommand(settings=v2.Settings(client_type=v2.PRODUCER, publishing=v2.Publishing(
        topics=[resource(t) for t in topics])))


def subscription(group: str, *topics: str, expression: str = "*") -> Any:
    return v2s.TelemetryCommand(settings=v2.Settings(client_type=v2.SIMPLE_CONSUMER, subscription=v2.Subscription(
        group=resource(group), subscriptions=[v2.SubscriptionEntry(topic=resource(t), expression=v2.FilterExpression(
            type=v2.TAG, expression=expression)) for t in topics])))


class Telemetry:
    """One raw Telemetry stream: commands sent when asked, everything the broker sends collected."""

    def __init__(self, stub: Any, creds: tuple[str, str] | None, client_id: str) -> None:
        self._out: queue.Queue[Any] = queue.Queue()
        self.received: queue.Queue[Any] = queue.Queue()
        self.ended = threading.Event()
        self.error: grpc.RpcError | None = None
        self.call = stub.Telemetry(iter(self._out.get, None), metadata=signed(creds, client_id), timeout=120)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for command in self.call:
                self.received.put(command)
        except grpc.RpcError as e:
            self.error = e
        finally:
            self.ended.set()

    def send(self, command: Any) -> Any:
        """Send ``command`` and return the broker's answer to it."""
        self._out.put(command)
        return self.received.get(timeout=10)

    def drain(self) -> list[Any]:
        got = []
        while not self.received.empty():
            got.append(self.received.get_nowait())
        return got

    def close(self) -> None:
        self._out.put(None)
        self.call.cancel()


def txn_status(ep: str, txn_id: str) -> str:
    with Admin(ep, **ROOT) as admin:
        found = admin.list_transactions(txn_id)
    return found[0].status if found else ""


def test_telemetry_settings_need_pub_and_only_a_producer_with_the_rights_gets_check_backs(
    secured: BrokerProcess, v2stub: Any
) -> None:
    ep = secured.endpoint
    topic, group = name("t"), name("pg")
    with Admin(ep, **ROOT) as admin:
        admin.create_topic(topic, 1)
    victim = user(ep, (f"Topic:{topic}", ["Pub"]), (f"Group:{group}", ["Pub"]))
    nobody = user(ep)  # no rights at all
    every_topic = user(ep, ("Topic:*", ["Pub"]))  # may publish anywhere, but is not the producer group
    # RocketMQ 5 names the producer group as a topic: a stream listing the group (or the victim's topic) would be
    # sent the check-backs of the victim's transactions, half bodies included.
    refused = Telemetry(v2stub, nobody, name("c"))
    listing = Telemetry(v2stub, every_topic, name("c"))
    try:
        for settings in (publishing(group), publishing(topic), publishing(topic, group)):
            assert refused.send(settings).status.code == v2.FORBIDDEN
        answer = listing.send(publishing(group, topic))
        assert answer.status.code == v2.OK  # it may publish to both names; it is not the group's producer

        asked: list[str] = []

        def checker(txn_id: str, half: Any) -> LocalTransactionState:
            asked.append(txn_id)
            return LocalTransactionState.COMMIT_MESSAGE

        with TransactionProducer(ep, group, checker, access_key=victim[0], secret_key=victim[1]) as producer:
            sent = producer.send_in_transaction(Message(topic, b"half body"), lambda m, t: LocalTransactionState.UNKNOW)
            wait_for(lambda: txn_status(ep, sent.transaction_id) == "COMMITTED",
                     "the victim's transaction committed by its own check-back", timeout_s=30)
        assert sent.transaction_id in asked
        for stream in (refused, listing):
            assert not [c for c in stream.drain() if c.HasField("recover_orphaned_transaction_command")]
            assert not stream.ended.is_set()  # the stream stays, only its settings were refused
    finally:
        refused.close()
        listing.close()


def test_a_v2_producer_with_its_rights_still_gets_its_check_backs(secured: BrokerProcess, v2stub: Any) -> None:
    ep = secured.endpoint
    topic = name("t")
    with Admin(ep, **ROOT) as admin:
        admin.create_topic(topic, 1)
    # A v2 transaction is recorded under its topic's name as its producer group (docs/security.md)
    producer = user(ep, (f"Topic:{topic}", ["Pub"]), (f"Group:{topic}", ["Pub"]))
    client_id = name("c")
    stream = Telemetry(v2stub, producer, client_id)
    try:
        assert stream.send(publishing(topic)).status.code == v2.OK
        sent = v2stub.SendMessage(v2s.SendMessageRequest(messages=[v2.Message(
            topic=resource(topic), body=b"open", system_properties=v2.SystemProperties(
                message_id=name("m").upper(), message_type=v2.TRANSACTION, body_encoding=v2.IDENTITY))]),
            metadata=signed(producer, client_id), timeout=10)
        assert sent.status.code == v2.OK, sent.status
        check = stream.received.get(timeout=30)
        assert check.recover_orphaned_transaction_command.transaction_id == sent.entries[0].transaction_id
        assert check.recover_orphaned_transaction_command.message.body == b"open"
    finally:
        stream.close()


def heartbeat(stub: Any, creds: tuple[str, str], client_id: str, group: str) -> Any:
    return stub.Heartbeat(v2s.HeartbeatRequest(client_type=v2.SIMPLE_CONSUMER, group=resource(group)),
                          metadata=signed(creds, client_id), timeout=10)


def terminate(stub: Any, creds: tuple[str, str], client_id: str, group: str) -> int:
    """NotifyClientTermination's answer code (FORBIDDEN without the group's right, operations.py's LEAVE_GROUP)."""
    r = stub.NotifyClientTermination(v2s.NotifyClientTerminationRequest(group=resource(group)),
                                     metadata=signed(creds, client_id), timeout=10)
    return int(r.status.code)


def test_only_the_client_itself_may_end_it(secured: BrokerProcess, v2stub: Any) -> None:
    ep = secured.endpoint
    topic, group = name("t"), name("g")
    with Admin(ep, **ROOT) as admin:
        admin.create_topic(topic, 1)
    rights = ((f"Topic:{topic}", ["Sub"]), (f"Group:{group}", ["Sub"]))
    victim, stranger, no_group = user(ep, *rights), user(ep, *rights), user(ep)
    client_id = name("c")
    stream = Telemetry(v2stub, victim, client_id)
    try:
        assert stream.send(subscription(group, topic)).status.code == v2.OK
        assert heartbeat(v2stub, victim, client_id, group).status.code == v2.OK
        with Admin(ep, **ROOT) as admin:
            assert client_id in admin.consumer_list(group)
        for attacker in (stranger, no_group):  # even with the same rights on the group: another user's client
            assert terminate(v2stub, attacker, client_id, group) == v2.FORBIDDEN
            takeover = Telemetry(v2stub, attacker, client_id)  # its stream would be sent the victim's commands
            assert takeover.received.get(timeout=10).status.code == v2.FORBIDDEN
            takeover.close()
        # a heartbeat of the stranger (which may consume the group) naming the id would replace its subscriptions
        assert heartbeat(v2stub, stranger, client_id, group).status.code == v2.FORBIDDEN
        time.sleep(0.5)
        assert not stream.ended.is_set()
        with Admin(ep, **ROOT) as admin:
            assert client_id in admin.consumer_list(group)
        # the client itself may, and is gone
        assert terminate(v2stub, victim, client_id, group) == v2.OK
        assert stream.ended.wait(10)
        with Admin(ep, **ROOT) as admin:
            assert client_id not in admin.consumer_list(group)
    finally:
        stream.close()


def test_a_client_leaving_a_group_needs_a_right_on_it(secured: BrokerProcess, v2stub: Any) -> None:
    ep = secured.endpoint
    topic, group = name("t"), name("g")
    with Admin(ep, **ROOT) as admin:
        admin.create_topic(topic, 1)
    consumer, other = user(ep, (f"Topic:{topic}", ["Sub"]), (f"Group:{group}", ["Sub"])), user(ep)
    client_id = name("c")
    assert heartbeat(v2stub, consumer, client_id, group).status.code == v2.OK
    # a client of another user naming this group: refused, and the group's consumer stays
    assert terminate(v2stub, other, name("c"), group) == v2.FORBIDDEN
    with Admin(ep, **ROOT) as admin:
        assert client_id in admin.consumer_list(group)


def route(stub: Any, creds: tuple[str, str], client_id: str, topic: str) -> int:
    r = stub.QueryRoute(v2s.QueryRouteRequest(topic=resource(topic)), metadata=signed(creds, client_id), timeout=10)
    return int(r.status.code)


def test_one_user_may_register_a_quarter_of_the_client_table(secured: BrokerProcess, v2stub: Any) -> None:
    ep = secured.endpoint
    topic = name("t")
    with Admin(ep, **ROOT) as admin:
        admin.create_topic(topic, 1)
    flooder, other = user(ep, (f"Topic:{topic}", ["Pub"])), user(ep, (f"Topic:{topic}", ["Pub"]))
    kept = [name("c") for _ in range(MAX_CLIENTS // 4)]
    assert [route(v2stub, flooder, c, topic) for c in kept] == [v2.OK] * len(kept)
    past = [route(v2stub, flooder, name("c"), topic) for _ in range(5)]
    assert past == [v2.TOO_MANY_REQUESTS] * 5
    assert route(v2stub, flooder, kept[0], topic) == v2.OK  # its registered clients are still served
    assert route(v2stub, other, name("c"), topic) == v2.OK  # and other users' new ones
    # a Telemetry stream of a new client of the same user is refused the same way
    stream = Telemetry(v2stub, flooder, name("c"))
    try:
        assert stream.received.get(timeout=10).status.code == v2.TOO_MANY_REQUESTS
    finally:
        stream.close()
    for c in kept:  # its clients leave: its share is free again
        v2stub.NotifyClientTermination(v2s.NotifyClientTerminationRequest(), metadata=signed(flooder, c), timeout=10)
    assert route(v2stub, flooder, name("c"), topic) == v2.OK


def groups_file(secured: BrokerProcess) -> str:
    path = Path(secured.args[secured.args.index("--store") + 1]) / "config" / "subscriptionGroup.json"
    return path.read_text() if path.exists() else ""


def test_settings_are_bounded_and_create_no_group(secured: BrokerProcess, v2stub: Any) -> None:
    ep = secured.endpoint
    topic, group = name("t"), name("g")
    with Admin(ep, **ROOT) as admin:
        admin.create_topic(topic, 1)
    consumer = user(ep, ("Topic:*", ["Pub", "Sub"]), ("Group:*", ["Sub"]))
    stream = Telemetry(v2stub, consumer, name("c"))
    try:
        many = [f"{topic}-{i}" for i in range(257)]
        assert stream.send(publishing(*many)).status.code == v2.PAYLOAD_TOO_LARGE
        assert stream.send(subscription(group, *many)).status.code == v2.PAYLOAD_TOO_LARGE
        big = stream.send(subscription(group, *[topic] * 8, expression="x" * 20_000))
        assert big.status.code == v2.PAYLOAD_TOO_LARGE
        answer = stream.send(subscription(group, topic))
        assert answer.status.code == v2.OK and answer.settings.subscription.receive_batch_size == 32
        time.sleep(0.3)
        assert group not in groups_file(secured)  # described with a new group's defaults, not created
        with Admin(ep, **ROOT) as admin:
            assert group not in [g.group for g in admin.list_groups()]
        assert not stream.ended.is_set()
    finally:
        stream.close()


def refusal_code(e: grpc.RpcError) -> int:
    return next(int(v) for k, v in e.trailing_metadata() or () if k == RESPONSE_CODE_KEY)


class SendStream:
    """A raw SendStream held open: requests sent when asked."""

    def __init__(self, stub: Any, creds: tuple[str, str] | None) -> None:
        self._out: queue.Queue[Any] = queue.Queue()
        self.call = stub.SendStream(iter(self._out.get, None), metadata=signed(creds), timeout=120)

    def send(self, request: Any) -> Any:
        self._out.put(request)
        return next(self.call)

    def close(self) -> None:
        self._out.put(None)
        self.call.cancel()


def test_one_user_may_hold_a_quarter_of_the_stream_workers(secured: BrokerProcess, v2stub: Any) -> None:
    ep = secured.endpoint
    topic = name("t")
    with Admin(ep, **ROOT) as admin:
        admin.create_topic(topic, 1)
    nobody, producer = user(ep), user(ep, (f"Topic:{topic}", ["Pub"]))
    request = pb.SendMessageRequest(topic=topic, queue_id=0, body=b"x")
    with grpc.insecure_channel(ep) as channel:
        stub = pbg.BrokerStub(channel)
        held: list[SendStream] = []
        telemetry: list[Telemetry] = []
        try:
            # a user with no rights at all opens streams: each admitted (its requests are refused one by one)...
            for _ in range(PER_USER - 2):
                s = SendStream(stub, nobody)
                assert s.send(request).code == ResponseCode.NO_PERMISSION
                held.append(s)
            for _ in range(2):
                t = Telemetry(v2stub, nobody, name("c"))
                telemetry.append(t)
                assert t.send(publishing(topic)).status.code == v2.FORBIDDEN  # open, its settings refused
            # ... up to its share; past it every kind of stream is refused when it opens
            over = SendStream(stub, nobody)
            with pytest.raises(grpc.RpcError) as refused:
                over.send(request)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert refusal_code(refused.value) == ResponseCode.SYSTEM_BUSY
            late = Telemetry(v2stub, nobody, name("c"))
            assert late.ended.wait(10) and late.error is not None
            assert late.error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # streams of callers without credentials are refused at once and hold nothing
            for _ in range(3 * PER_USER):
                anonymous = SendStream(stub, None)
                with pytest.raises(grpc.RpcError) as unauthenticated:
                    anonymous.send(request)
                assert unauthenticated.value.code() == grpc.StatusCode.UNAUTHENTICATED
            # another user still opens its streams and is served
            mine = [SendStream(stub, producer) for _ in range(3)]
            try:
                for s in mine:
                    assert s.send(request).response.status == pb.SEND_OK
            finally:
                for s in mine:
                    s.close()
        finally:
            for s in held:
                s.close()
            for t in telemetry:
                t.close()
        # closed streams are released: the user may open one again
        wait_for(lambda: _opens(stub, nobody, request), "a stream after the others closed", timeout_s=10)


def test_transaction_check_streams_count_against_the_users_share(secured: BrokerProcess) -> None:
    group = name("pg")
    producer = user(secured.endpoint, (f"Group:{group}", ["Pub"]))
    subscribe = pb.TransactionCheckSubscribe(producer_group=group, client_id=name("c"))
    with grpc.insecure_channel(secured.endpoint) as channel:
        stub = pbg.BrokerStub(channel)
        calls = [stub.TransactionCheckStream(subscribe, metadata=signed(producer), timeout=60)
                 for _ in range(PER_USER + 1)]
        try:
            wait_for(lambda: any(c.done() for c in calls), "a check stream refused")
            time.sleep(0.5)
            (refused,) = [c for c in calls if c.done()]  # one past the share; the others open, waiting for checks
            assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert refusal_code(refused) == ResponseCode.SYSTEM_BUSY
        finally:
            for call in calls:
                call.cancel()


def _opens(stub: Any, creds: tuple[str, str], request: Any) -> bool:
    s = SendStream(stub, creds)
    try:
        return bool(s.send(request).code == ResponseCode.NO_PERMISSION)
    except grpc.RpcError:
        return False
    finally:
        s.close()
