"""What an unauthenticated caller learns and reaches: an unknown access key, a disabled user and a wrong signature
get one answer on every front (the Sluice service, RocketMQ 5's, the name server), and a call that fails
authentication is refused before its body is parsed."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from broker.auth.accounts import Accounts, User
from broker.auth.gate import BAD_CREDENTIALS, AuthGate, AuthSettings
from broker.client import Admin
from broker.errors import ResponseCode
from broker.format.signature import signed_metadata
from broker.namesrv import NameServer
from broker.namesrv.name_server_service import now_ms
from broker.proto.status import RESPONSE_CODE_KEY
from broker.server.metrics import Counter
from broker.server.process import BrokerProcess
from broker.server.request_guard import MalformedRequestGuard
from tests.support.secured_process import ROOT, ROOT_SECRET, start_secured

TOPIC = "AnswersT"
CALL_TIMEOUT_S = 10.0
LOG_WAIT_S = 10.0  # a line the broker wrote before it answered reaches this process's reader soon after
SEND = "/sluice.v1.Broker/SendMessage"
SEND_STREAM = "/sluice.v1.Broker/SendStream"
V2_QUERY_ROUTE = "/apache.rocketmq.v2.MessagingService/QueryRoute"
REGISTER = "/sluice.v1.NameServer/RegisterBroker"
# Field 1, length-delimited, with a length far past the end: no protobuf parser accepts these bytes.
UNPARSABLE = b"\x0a\xff\xff\xff\xff\x0f" + b"\x00" * 16
Metadata = tuple[tuple[str, str], ...]


def _raw(data: bytes) -> bytes:
    return data


def signed(access_key: str, secret_key: str) -> Metadata:
    return tuple(signed_metadata(access_key, secret_key, dt.datetime.now(dt.UTC)))


def answer(channel: grpc.Channel, method: str, metadata: Metadata, body: bytes = b"") -> tuple[Any, str, str]:
    """(gRPC code, details, response code) of a unary call whose body goes as the bytes given, unparsed here."""
    call = channel.unary_unary(method, request_serializer=_raw, response_deserializer=_raw)
    with pytest.raises(grpc.RpcError) as refused:
        call(body, metadata=metadata, timeout=CALL_TIMEOUT_S)
    e: Any = refused.value
    codes = [v for k, v in e.trailing_metadata() or () if k == RESPONSE_CODE_KEY]
    return e.code(), e.details(), codes[0] if codes else ""


def stream_answer(channel: grpc.Channel, method: str, metadata: Metadata, body: bytes) -> tuple[Any, str]:
    call = channel.stream_stream(method, request_serializer=_raw, response_deserializer=_raw)
    with pytest.raises(grpc.RpcError) as refused:
        list(call(iter([body]), metadata=metadata, timeout=CALL_TIMEOUT_S))
    e: Any = refused.value
    return e.code(), e.details()


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = start_secured(tmp_path_factory.mktemp("answers"))
    with Admin(broker.endpoint, access_key=ROOT, secret_key=ROOT_SECRET) as admin:
        admin.create_topic(TOPIC, 1)
        admin.create_user("alice", "alice-secret-1")
        admin.create_user("carol", "carol-secret-1")
        admin.update_user("carol", enabled=False)
    yield broker
    assert broker.stop() == 0, "\n".join(broker.output)


def logged(broker: BrokerProcess, texts: list[str]) -> str:
    """The broker's log once it holds every one of ``texts`` (its lines are read by a thread of their own)."""
    deadline = time.monotonic() + LOG_WAIT_S
    while True:
        try:
            log = "\n".join(tuple(broker.output))
        except RuntimeError:  # the reading thread added a line meanwhile
            continue
        missing = [t for t in texts if t not in log]
        if not missing:
            return log
        assert time.monotonic() < deadline, f"not logged: {missing}"
        time.sleep(0.05)


def stored(broker: BrokerProcess) -> dict[Any, tuple[int, int]]:
    with Admin(broker.endpoint, access_key=ROOT, secret_key=ROOT_SECRET) as admin:
        return admin.queue_offsets(TOPIC)


# ------------------------------------------------------------------------------------------------ one answer
def test_an_unknown_key_a_disabled_user_and_a_wrong_signature_get_the_same_answer(secured: BrokerProcess) -> None:
    before = stored(secured)
    callers = {"unknown access key": signed("mallory", "any-secret"),
               "disabled user": signed("carol", "carol-secret-1"),
               "wrong signature": signed("alice", "not-alices-secret")}
    with grpc.insecure_channel(secured.endpoint) as channel:
        for method in (SEND, V2_QUERY_ROUTE):
            answers = {cause: answer(channel, method, md) for cause, md in callers.items()}
            keys = {"unknown access key": "mallory", "disabled user": "carol", "wrong signature": "alice"}
            for cause, (code, details, response_code) in answers.items():
                assert code == grpc.StatusCode.UNAUTHENTICATED, (method, cause)
                assert response_code == str(int(ResponseCode.UNAUTHENTICATED)), (method, cause)
                assert details == BAD_CREDENTIALS.format(key=keys[cause]), (method, cause)
            assert len({details.replace(f"'{keys[c]}'", "'KEY'") for c, (_, details, _) in answers.items()}) == 1
    assert stored(secured) == before  # nothing was sent
    log = logged(secured, [f"({cause})" for cause in callers])  # the broker's log tells them apart
    assert "not-alices-secret" not in log and "any-secret" not in log


def test_the_name_server_answers_the_same_for_an_unknown_key_and_a_wrong_signature() -> None:
    server = NameServer("127.0.0.1", 0, root=User(ROOT, ROOT_SECRET))
    server.start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            unknown = answer(channel, REGISTER, signed("mallory", ROOT_SECRET))
            wrong = answer(channel, REGISTER, signed(ROOT, "not-the-root-secret"))
        assert unknown[0] == wrong[0] == grpc.StatusCode.UNAUTHENTICATED
        assert unknown[1] == BAD_CREDENTIALS.format(key="mallory") and wrong[1] == BAD_CREDENTIALS.format(key=ROOT)
        assert unknown[2] == wrong[2] == str(int(ResponseCode.UNAUTHENTICATED))
        assert server.table.brokers(now_ms()) == []  # nothing registered
        assert server.refusals.value((("reason", "unauthenticated"),)) == 2
    finally:
        server.shutdown()


# ------------------------------------------------------------------------------------------------ before the body
def test_an_unauthenticated_call_is_refused_before_its_body_is_parsed(secured: BrokerProcess) -> None:
    before = stored(secured)
    with grpc.insecure_channel(secured.endpoint) as channel:
        for metadata in ((), signed("alice", "not-alices-secret"), signed("mallory", "x")):
            code, details, response_code = answer(channel, SEND, metadata, UNPARSABLE)
            assert code == grpc.StatusCode.UNAUTHENTICATED, details  # not INVALID_ARGUMENT: never parsed
            assert response_code == str(int(ResponseCode.UNAUTHENTICATED))
            stream_code, _ = stream_answer(channel, SEND_STREAM, metadata, UNPARSABLE)
            assert stream_code == grpc.StatusCode.UNAUTHENTICATED
        # the same bytes from an authenticated caller reach the parser, which refuses them
        code, details, response_code = answer(channel, SEND, signed(ROOT, ROOT_SECRET), UNPARSABLE)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "not a valid protobuf message" in details
        assert response_code == str(int(ResponseCode.INVALID_ARGUMENT))
    assert stored(secured) == before


def test_the_gate_refuses_from_the_headers_without_calling_the_parser() -> None:
    """A real gRPC server with the broker's two interceptors in front of a method whose parser counts its calls."""
    parsed: list[bytes] = []
    lock = threading.Lock()

    def parse(data: bytes) -> bytes:
        with lock:
            parsed.append(data)
        return data

    def echo(request: bytes, _context: grpc.ServicerContext) -> bytes:
        return request

    def echo_stream(requests: Iterator[bytes], _context: grpc.ServicerContext) -> Iterator[bytes]:
        yield from requests

    handlers: dict[str, Callable[..., grpc.RpcMethodHandler]] = {
        "Unary": lambda: grpc.unary_unary_rpc_method_handler(echo, request_deserializer=parse),
        "Stream": lambda: grpc.stream_stream_rpc_method_handler(echo_stream, request_deserializer=parse),
    }
    refusals = Counter("refusals", "test")
    gate = AuthGate(Accounts(None, User(ROOT, ROOT_SECRET)), AuthSettings(900, False), refusals)
    server = grpc.server(futures.ThreadPoolExecutor(4), interceptors=[MalformedRequestGuard(), gate])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "test.Parsed", {name: make() for name, make in handlers.items()}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            for metadata in ((), signed(ROOT, "wrong"), signed("mallory", ROOT_SECRET)):
                code, _, response_code = answer(channel, "/test.Parsed/Unary", metadata, b"body")
                assert code == grpc.StatusCode.UNAUTHENTICATED
                assert response_code == str(int(ResponseCode.UNAUTHENTICATED))
                assert stream_answer(channel, "/test.Parsed/Stream", metadata, b"body")[0] == code
            assert parsed == []
            assert refusals.value((("reason", "unauthenticated"),)) == 6
            ok = channel.unary_unary("/test.Parsed/Unary", request_serializer=_raw, response_deserializer=_raw)
            assert ok(b"body", metadata=signed(ROOT, ROOT_SECRET), timeout=CALL_TIMEOUT_S) == b"body"
            assert parsed == [b"body"]
    finally:
        server.stop(None)


def test_a_rotated_secret_is_refused_with_the_same_answer(secured: BrokerProcess) -> None:
    with Admin(secured.endpoint, access_key=ROOT, secret_key=ROOT_SECRET) as admin:
        admin.create_user("dave", "dave-secret-old")
        admin.update_user("dave", secret_key="dave-secret-new")
    with grpc.insecure_channel(secured.endpoint) as channel:
        code, details, _ = answer(channel, SEND, signed("dave", "dave-secret-old"))
    assert code == grpc.StatusCode.UNAUTHENTICATED and details == BAD_CREDENTIALS.format(key="dave")
