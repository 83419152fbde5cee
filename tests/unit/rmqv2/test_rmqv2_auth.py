"""RocketMQ 5's official client with credentials against a broker with auth: its signed header is the one Sluice
checks, so a user works for both kinds of client; rights are enforced on the RocketMQ 5 service too; and the
client's local-time-with-a-Z timestamp is refused once the client's zone is hours away from UTC (docs/security.md
says to run it with TZ=UTC)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from rmqv2_helpers import AUTH, FAST, ROOT, create_user, message, name, receive_until
from rocketmq import ClientConfiguration, Credentials, Producer, SimpleConsumer
from rocketmq import FilterExpression as RmqFilter

from broker.client import Admin
from broker.server.process import BrokerProcess
from tests.support.brokers import start_broker
from tests.support.waiting import wait_for


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("rmqv2-auth")
    proc = start_broker(root / "store", {**FAST, **AUTH})
    yield proc
    assert proc.stop() == 0, "\n".join(proc.output)


def config(endpoint: str, ak: str, sk: str) -> ClientConfiguration:
    return ClientConfiguration(endpoint, Credentials(ak, sk), request_timeout=5)


def test_the_official_client_signs_as_a_sluice_user(secured: BrokerProcess) -> None:
    ep = secured.endpoint
    topic, group, user = name("t"), name("g"), name("u")
    with Admin(ep, **ROOT) as admin:
        admin.create_topic(topic, 2)
    create_user(ep, user, (f"Topic:{topic}", ["Pub", "Sub"]), (f"Group:{group}", ["Sub"]))
    producer = Producer(config(ep, user, f"{user}-secret"), (topic,))
    producer.startup()
    try:
        for i in range(5):
            producer.send(message(topic, f"m{i}".encode()))
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(config(ep, user, f"{user}-secret"), group, {topic: RmqFilter("*")}, await_duration=2)
    consumer.startup()
    try:
        assert sorted(m.body for m in receive_until(consumer, 5, 10)) == [f"m{i}".encode() for i in range(5)]
    finally:
        consumer.shutdown()


def send_refused(broker: BrokerProcess, topic: str, ak: str, sk: str, because: str) -> None:
    """A send of the official client fails, and the broker logged its refusal ``because``."""
    producer = Producer(config(broker.endpoint, ak, sk), (topic,))
    try:
        producer.startup()
        with pytest.raises(Exception):  # noqa: B017  (the client raises bare Exception for a route it was refused)
            producer.send(message(topic, b"refused"))
    finally:
        producer.shutdown()
    wait_for(lambda: any(because in line and ak in line for line in broker.output), f"a refusal: {because}")


def test_wrong_credentials_and_missing_rights_are_refused(secured: BrokerProcess) -> None:
    ep = secured.endpoint
    topic, user = name("t"), name("u")
    with Admin(ep, **ROOT) as admin:
        admin.create_topic(topic, 1)
    create_user(ep, user, (f"Topic:{topic}", ["Sub"]))
    send_refused(secured, topic, user, "wrong-secret", "wrong signature")
    send_refused(secured, topic, user, f"{user}-secret", "lacks Pub")  # Sub only
    with Admin(ep, **ROOT) as admin:
        assert all(high == 0 for _, high in admin.queue_offsets(topic).values())


def test_a_client_whose_local_time_is_not_utc_is_refused(
    secured: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    ep = secured.endpoint
    topic, user = name("t"), name("u")
    with Admin(ep, **ROOT) as admin:
        admin.create_topic(topic, 1)
    create_user(ep, user, (f"Topic:{topic}", ["Pub"]))
    monkeypatch.setenv("TZ", "Asia/Shanghai")  # UTC+8: the client's "Z" timestamp is 8 hours ahead
    time.tzset()
    try:
        send_refused(secured, topic, user, f"{user}-secret", "window")
    finally:
        monkeypatch.undo()
        time.tzset()
