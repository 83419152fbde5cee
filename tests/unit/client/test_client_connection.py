"""Endpoints: several comma-separated brokers (first reachable wins), clear errors when none answers."""

from __future__ import annotations

import pytest

from broker.client import Admin, Message, Producer
from broker.errors import InvalidArgumentError, ServiceNotAvailableError
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
