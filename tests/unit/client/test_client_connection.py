"""Endpoints: several comma-separated brokers (first reachable wins), clear errors when none answers."""

from __future__ import annotations

import socket

import pytest

from broker.client import Admin, Message, Producer
from broker.client.connection import Connection
from broker.errors import BrokerUnreachableError, InvalidArgumentError, ServiceNotAvailableError
from broker.proto import sluice_pb2 as pb
from broker.server.broker_controller import BrokerController


def test_first_reachable_endpoint_is_used(broker: BrokerController, endpoint: str) -> None:
    with Admin(f"127.0.0.1:1, {endpoint}") as admin:
        assert admin.conn.target == endpoint
        admin.create_topic("Multi", 2)
        assert [t.topic for t in admin.list_topics()] == ["Multi"]


def test_no_reachable_endpoint() -> None:
    with pytest.raises(ServiceNotAvailableError, match="none of the brokers"):
        Admin("127.0.0.1:1,127.0.0.1:2")
    with pytest.raises(InvalidArgumentError):
        Admin(" , ")
    with Producer("127.0.0.1:1", timeout_s=2) as p, pytest.raises(ServiceNotAvailableError, match="unreachable"):
        p.send(Message("T", b"x"), queue_id=0)


def test_endpoint_from_environment(broker: BrokerController, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_ENDPOINT", endpoint)
    with Admin() as admin:
        assert admin.conn.target == endpoint
        assert admin.list_topics() == []


def test_a_connect_that_gets_no_answer_fails_as_never_sent() -> None:
    """A host that drops the connection's SYNs (a killed container whose address the machine still has in its ARP
    cache, a firewall) must fail the call as never sent, within the connect timeout, so that a producer sends the
    message to another broker. Without a connect timeout, gRPC kept connecting for 20 s, the call ran into its own
    deadline, and DEADLINE_EXCEEDED counted as "may have been stored"."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)  # never accepted: with its one slot taken, Linux drops every further SYN
        with socket.create_connection(listener.getsockname()):
            conn = Connection(f"127.0.0.1:{listener.getsockname()[1]}")
            try:
                with pytest.raises(BrokerUnreachableError) as failed:
                    conn.call(conn.stub.GetQueueOffsets, pb.GetQueueOffsetsRequest(topic="T"), timeout_s=20)
            finally:
                conn.close()
    assert failed.value.request_sent is False, failed.value.message
