"""The remoting transport in process, with processors written for the test: answers matched by opaque, one-way
requests unanswered, unknown codes, processors that raise or answer later, malformed frames and idle connections."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.errors import BrokerUnreachableError, TopicNotExistError
from broker.remoting import server as server_module
from broker.remoting.client import RemotingClient
from broker.remoting.codes import WireCode
from broker.remoting.command import RemotingCommand, SerializeType
from broker.remoting.frame import encode_frame
from broker.remoting.processor import Answer, RequestContext
from broker.remoting.server import RemotingServer
from tests.support.waiting import wait_until

ECHO, SLOW, BOOM, REFUSE, LATER, RECORD = 1, 2, 3, 4, 5, 6


class Echo:
    def process(self, request: RemotingCommand, context: RequestContext) -> Answer:
        return request.response(WireCode.SUCCESS, ext_fields=dict(request.ext_fields), body=request.body)


class Slow:
    """Answers after the number of milliseconds in ``ms``: later requests may be answered first."""

    def process(self, request: RemotingCommand, context: RequestContext) -> Answer:
        time.sleep(int(request.ext_fields["ms"]) / 1000)
        return request.response(WireCode.SUCCESS, ext_fields={"ms": request.ext_fields["ms"]})


class Boom:
    def process(self, request: RemotingCommand, context: RequestContext) -> Answer:
        raise RuntimeError("processor bug")


class Refuse:
    def process(self, request: RemotingCommand, context: RequestContext) -> Answer:
        raise TopicNotExistError("no such topic")


class Later:
    """Answers with a Future completed by another thread, as a held pull does."""

    def process(self, request: RemotingCommand, context: RequestContext) -> Answer:
        future: Future[RemotingCommand] = Future()
        threading.Timer(0.05, lambda: future.set_result(request.response(WireCode.PULL_NOT_FOUND))).start()
        return future


class Record:
    def __init__(self) -> None:
        self.seen: list[RemotingCommand] = []

    def process(self, request: RemotingCommand, context: RequestContext) -> Answer:
        self.seen.append(request)
        return request.response(WireCode.SUCCESS)  # dropped by the transport for one-way requests


@pytest.fixture
def record() -> Record:
    return Record()


@pytest.fixture
def server(record: Record) -> Iterator[RemotingServer]:
    table = {ECHO: Echo(), SLOW: Slow(), BOOM: Boom(), REFUSE: Refuse(), LATER: Later(), RECORD: record}
    with RemotingServer(table, "127.0.0.1", 0, idle_timeout_s=1.0) as s:
        yield s


@pytest.fixture
def client(server: RemotingServer) -> Iterator[RemotingClient]:
    with RemotingClient(server.address) as c:
        yield c


def test_answers_in_the_requests_serialization(client: RemotingClient) -> None:
    for kind in SerializeType:
        answer = client.invoke(RemotingCommand(ECHO, ext_fields={"k": "v"}, body=b"b", serialize_type=kind))
        assert (answer.code, answer.ext_fields, answer.body, answer.serialize_type) == (0, {"k": "v"}, b"b", kind)
        assert answer.is_response


def test_several_requests_in_flight_are_matched_by_opaque(client: RemotingClient) -> None:
    delays = [300, 200, 100, 0]  # answered in the reverse order of sending
    pending = [client.invoke_async(RemotingCommand(SLOW, ext_fields={"ms": str(ms)})) for ms in delays]
    answers = [p.result_or_raise(5, client) for p in pending]
    assert [a.ext_fields["ms"] for a in answers] == [str(ms) for ms in delays]
    assert [a.opaque for a in answers] == [p.opaque for p in pending]


def test_unknown_code_is_request_code_not_supported(client: RemotingClient) -> None:
    answer = client.invoke(RemotingCommand(999))
    assert answer.code == WireCode.REQUEST_CODE_NOT_SUPPORTED
    assert answer.remark is not None and "request type 999 not supported" in answer.remark


def test_a_processor_that_raises_answers_system_error_and_the_server_goes_on(client: RemotingClient) -> None:
    answer = client.invoke(RemotingCommand(BOOM))
    assert answer.code == WireCode.SYSTEM_ERROR and answer.remark == "RuntimeError: processor bug"
    refused = client.invoke(RemotingCommand(REFUSE))
    assert refused.code == WireCode.TOPIC_NOT_EXIST and refused.remark == "no such topic"
    assert client.invoke(RemotingCommand(ECHO)).code == WireCode.SUCCESS


def test_a_future_answer_is_sent_when_it_completes(client: RemotingClient) -> None:
    assert client.invoke(RemotingCommand(LATER)).code == WireCode.PULL_NOT_FOUND


def read_frame(sock: socket.socket) -> bytes:
    prefix = sock.recv(4, socket.MSG_WAITALL)
    return sock.recv(struct.unpack(">i", prefix)[0], socket.MSG_WAITALL)


def test_one_way_requests_get_no_answer(server: RemotingServer, record: Record) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        oneway = RemotingCommand(RECORD, opaque=1, flag=2)
        unknown_oneway = RemotingCommand(999, opaque=2, flag=2)
        answered = RemotingCommand(ECHO, opaque=3)
        sock.sendall(encode_frame(oneway) + encode_frame(unknown_oneway) + encode_frame(answered))
        first = read_frame(sock)  # the only answer: to the request after the one-way ones
        assert b'"opaque":3' in first
        wait_until(lambda: len(record.seen) == 1, "the one-way request to reach its processor", timeout_s=5)
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(1)


MALFORMED = {
    "over the frame limit": struct.pack(">i", 32 << 20),
    "negative length": struct.pack(">i", -5),
    "header length past the frame": struct.pack(">iI", 6, 50) + b"{}",
    "unknown serialization type": struct.pack(">iI", 6, (3 << 24) | 2) + b"{}",
    "header that does not parse": struct.pack(">iI", 7, 3) + b"{x}",
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_frame_closes_that_connection_only(
    server: RemotingServer, client: RemotingClient, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    with RemotingClient(server.address) as bad:
        bad.send_raw(MALFORMED[case])
        wait_until(lambda: bad.closed, "the server to close the connection", timeout_s=5)
        with pytest.raises(BrokerUnreachableError):
            bad.invoke(RemotingCommand(ECHO))
    assert client.invoke(RemotingCommand(ECHO)).code == WireCode.SUCCESS
    assert len([r for r in caplog.records if "malformed frame" in r.getMessage()]) == 1


def test_a_truncated_frame_then_close_is_logged_and_nothing_reaches_a_processor(
    server: RemotingServer, record: Record, caplog: pytest.LogCaptureFixture
) -> None:
    frame = encode_frame(RemotingCommand(RECORD, opaque=1))
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(frame[:-3])
    wait_until(lambda: any("truncated frame" in r.getMessage() for r in caplog.records), "the truncation logged",
               timeout_s=5)
    assert record.seen == []


def test_an_idle_connection_is_closed(server: RemotingServer) -> None:
    with RemotingClient(server.address) as idle:
        assert idle.invoke(RemotingCommand(ECHO)).code == WireCode.SUCCESS
        wait_until(lambda: idle.closed, "the idle connection to be closed", timeout_s=5)


def test_connections_past_the_limit_are_closed() -> None:
    with RemotingServer({ECHO: Echo()}, "127.0.0.1", 0, max_connections=1) as s, RemotingClient(s.address) as first:
        assert first.invoke(RemotingCommand(ECHO)).code == WireCode.SUCCESS
        with RemotingClient(s.address) as second:
            wait_until(lambda: second.closed, "the connection past the limit to be closed", timeout_s=5)
        assert first.invoke(RemotingCommand(ECHO)).code == WireCode.SUCCESS


def test_a_broker_with_auth_serves_remoting_with_its_signatures_checked(tmp_path: Path) -> None:
    secured = BrokerConfig(store_path=str(tmp_path), remoting_listen="127.0.0.1:0", auth_enabled=True,
                           allow_plaintext_auth=True)
    assert secured.remoting_listen == "127.0.0.1:0"  # test_remoting_acl.py: what the port then checks


def test_requests_past_the_queue_bound_are_answered_system_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "MAX_QUEUED_REQUESTS", 1)
    with RemotingServer({SLOW: Slow()}, "127.0.0.1", 0, workers=1) as s, RemotingClient(s.address) as c:
        running = c.invoke_async(RemotingCommand(SLOW, ext_fields={"ms": "400"}))
        wait_until(lambda: s._queued == 0, "the first request to start", timeout_s=5)
        queued = c.invoke_async(RemotingCommand(SLOW, ext_fields={"ms": "0"}))  # waits for the only worker
        busy = c.invoke(RemotingCommand(SLOW, ext_fields={"ms": "0"}))
        assert busy.code == WireCode.SYSTEM_BUSY and busy.remark is not None and "[OVERLOAD]" in busy.remark
        assert running.result_or_raise(5, c).code == queued.result_or_raise(5, c).code == WireCode.SUCCESS
