"""The name server's route table on its own: registrations, keep-alives, claims, expiry and routes."""

from __future__ import annotations

import pytest

from broker.errors import InvalidArgumentError, TopicNotExistError
from broker.namesrv.route_table import (
    MAX_TOPICS_PER_BROKER,
    QueueSpec,
    Registration,
    RegistrationRefused,
    RouteTable,
)

EIGHT = QueueSpec(8, 8, 6)


def reg(name: str = "a", broker_id: int = 0, address: str = "10.0.0.1:10911", store_id: str = "s1",
        version: int = 1, topics: dict[str, QueueSpec] | None = None, cluster: str = "C",
        keepalive: bool = False) -> Registration:
    return Registration(cluster, name, broker_id, address, store_id, version,
                        None if keepalive else (topics if topics is not None else {"T": EIGHT}),
                        role="MASTER" if broker_id == 0 else "SLAVE")


def test_full_registration_then_cheap_keepalives() -> None:
    t = RouteTable(broker_expire_ms=1000)
    assert t.register(reg(), now_ms=0)
    assert t.register(reg(keepalive=True), now_ms=900)  # same version: accepted, and it keeps the broker alive
    assert t.route("T", now_ms=1800).queues == {"a": EIGHT}
    assert not t.register(reg(version=2, keepalive=True), now_ms=1800)  # a version it does not hold: send all
    assert t.register(reg(version=2, topics={"T": EIGHT, "U": QueueSpec(4, 4, 6)}), now_ms=1800)
    assert t.route("U", now_ms=1800).queues == {"a": QueueSpec(4, 4, 6)}


def test_keepalive_after_expiry_asks_for_the_topics_again() -> None:
    t = RouteTable(broker_expire_ms=1000)
    t.register(reg(), now_ms=0)
    assert not t.register(reg(keepalive=True), now_ms=5000)  # expired meanwhile: the name server forgot it
    with pytest.raises(TopicNotExistError):
        t.route("T", now_ms=5000)


def test_a_silent_broker_leaves_every_route_after_the_expiry_time() -> None:
    t = RouteTable(broker_expire_ms=1000)
    t.register(reg("a"), now_ms=0)
    t.register(reg("b", address="10.0.0.2:10911", store_id="s2"), now_ms=600)
    assert set(t.route("T", now_ms=1000).queues) == {"a", "b"}
    assert set(t.route("T", now_ms=1001).queues) == {"b"}
    assert [s.live.broker_name for s in t.brokers(now_ms=1001)] == ["b"]
    assert [b.broker_name for b in t.expire(now_ms=1601)] == ["b"]


def test_another_live_broker_claiming_a_name_and_id_is_refused_never_merged() -> None:
    t = RouteTable()
    t.register(reg(address="10.0.0.1:1", store_id="first"), now_ms=0)
    with pytest.raises(RegistrationRefused, match=r"registered by another live broker at 10\.0\.0\.1:1"):
        t.register(reg(address="10.0.0.9:1", store_id="second", topics={"Other": EIGHT}), now_ms=10)
    assert t.route("T", now_ms=10).brokers["a"][1] == {0: "10.0.0.1:1"}
    with pytest.raises(TopicNotExistError):
        t.route("Other", now_ms=10)


def test_the_same_broker_restarting_replaces_its_registration_at_once() -> None:
    t = RouteTable()
    t.register(reg(address="10.0.0.1:1", store_id="mine"), now_ms=0)
    t.register(reg(address="10.0.0.1:2", store_id="mine", version=7), now_ms=10)  # same store, new port
    assert t.route("T", now_ms=10).brokers["a"][1] == {0: "10.0.0.1:2"}
    t.register(reg(address="10.0.0.1:2", store_id="wiped", version=1), now_ms=20)  # same address, new store
    assert [s.live.store_id for s in t.brokers(now_ms=20)] == ["wiped"]


def test_a_claim_is_taken_once_the_holder_unregisters_or_expires() -> None:
    t = RouteTable(broker_expire_ms=1000)
    t.register(reg(address="10.0.0.1:1", store_id="first"), now_ms=0)
    assert not t.unregister("a", 0, "second")  # not its registration to remove
    assert t.unregister("a", 0, "first")
    t.register(reg(address="10.0.0.9:1", store_id="second"), now_ms=10)
    t.register(reg(address="10.0.0.1:1", store_id="first"), now_ms=2000)  # "second" expired at 1010
    assert t.route("T", now_ms=2000).brokers["a"][1] == {0: "10.0.0.1:1"}


def test_a_broker_name_belongs_to_one_cluster() -> None:
    t = RouteTable()
    t.register(reg(cluster="C1"), now_ms=0)
    with pytest.raises(RegistrationRefused, match="belongs to cluster 'C1'"):
        t.register(reg(broker_id=1, cluster="C2", address="10.0.0.2:1", store_id="s2"), now_ms=0)


def test_a_group_route_lists_every_live_member_and_takes_queues_from_the_master() -> None:
    t = RouteTable(broker_expire_ms=1000)
    t.register(reg(broker_id=0, topics={"T": EIGHT}), now_ms=0)
    t.register(reg(broker_id=1, address="10.0.0.2:1", store_id="s2", topics={"T": QueueSpec(8, 8, 4)}), now_ms=600)
    route = t.route("T", now_ms=700)
    assert route.queues == {"a": EIGHT}
    assert route.brokers["a"] == ("C", {0: "10.0.0.1:10911", 1: "10.0.0.2:1"})
    route = t.route("T", now_ms=1300)  # the master expired: the slave's view, readable only
    assert route.queues == {"a": QueueSpec(8, 8, 4)}
    assert route.brokers["a"][1] == {1: "10.0.0.2:1"}


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"name": ""}, "broker name"),
        ({"name": "a b"}, "broker name"),
        ({"cluster": "x" * 200}, "cluster"),
        ({"address": ""}, "address"),
        ({"store_id": ""}, "store id"),
        ({"broker_id": -1}, "broker id"),
        ({"topics": {"bad topic!": EIGHT}}, "topic"),
        ({"topics": {"T": QueueSpec(-1, 8, 6)}}, "out of range"),
    ],
)
def test_bad_registrations_are_refused_with_the_field_named(bad: dict[str, object], match: str) -> None:
    t = RouteTable()
    with pytest.raises(InvalidArgumentError, match=match):
        t.register(reg(**bad), now_ms=0)  # type: ignore[arg-type]
    assert t.brokers(now_ms=0) == []


def test_a_registration_past_the_topic_limit_is_refused() -> None:
    topics = {f"T{i}": EIGHT for i in range(MAX_TOPICS_PER_BROKER + 1)}
    with pytest.raises(RegistrationRefused, match="more than"):
        RouteTable().register(reg(topics=topics), now_ms=0)
