"""Name servers and brokers as real processes: registration, expiry, unregistration, claims, several name servers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import Message, Producer
from broker.client.namesrv_client import NameServerClient
from broker.errors import BrokerUnreachableError, InvalidArgumentError, TopicNotExistError
from broker.namesrv.local_cluster import LocalCluster
from broker.server.process import BrokerProcess
from tests.support.cluster import (
    all_brokers_running,
    create_everywhere,
    make_cluster,
    route_brokers,
    small_store_config,
)
from tests.support.waiting import wait_until


def test_brokers_register_their_topics_at_once_and_a_clean_shutdown_unregisters(tmp_path: Path) -> None:
    with make_cluster(tmp_path, broker_expire_ms=120_000) as cluster:
        ns = NameServerClient([cluster.namesrv])
        create_everywhere(cluster, "Routes")
        data = ns.route("Routes")
        assert {b.broker_name: dict(b.broker_addrs) for b in data.broker_datas} == {
            name: {0: cluster.endpoint(name)} for name in cluster.names
        }
        assert all(q.read_queue_nums == q.write_queue_nums == 8 and q.perm == 6 for q in data.queue_datas)
        assert cluster.stop("broker-c") == 0
        # gone at once: far sooner than the 120 s expiry
        assert route_brokers(ns, "Routes") == {"broker-a", "broker-b"}
        assert [b.broker_name for b in ns.cluster_info().brokers] == ["broker-a", "broker-b"]
        ns.close()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One cluster for the tests of expiry, claims and auto-created topics: each uses a topic of its own."""
    with make_cluster(tmp_path_factory.mktemp("routes")) as c:
        yield c


@pytest.fixture
def cluster(shared: LocalCluster) -> LocalCluster:
    """The shared cluster with its three brokers running (one a test killed is restarted on its store first)."""
    return all_brokers_running(shared)


def test_a_killed_broker_leaves_the_routes_after_the_expiry_time(cluster: LocalCluster) -> None:
    ns = NameServerClient([cluster.namesrv])
    create_everywhere(cluster, "Expiry")
    cluster.kill("broker-b")
    killed_at = time.monotonic()
    assert "broker-b" in route_brokers(ns, "Expiry")  # a name server cannot tell a crash from a pause at once
    wait_until(lambda: route_brokers(ns, "Expiry") == {"broker-a", "broker-c"}, "broker-b expired")
    assert time.monotonic() - killed_at >= 2.0  # the 3 s expiry, less one 500 ms registration interval at most
    cluster.restart("broker-b")
    wait_until(lambda: len(route_brokers(ns, "Expiry")) == 3, "broker-b back with its topics")
    ns.close()


def test_another_broker_claiming_a_live_name_is_refused_and_a_restart_replaces_its_own(cluster: LocalCluster) -> None:
    ns = NameServerClient([cluster.namesrv])
    create_everywhere(cluster, "Claims")
    original = cluster.endpoint("broker-a")
    impostor = BrokerProcess(cluster.root / "impostor", log_level="INFO",
                             extra_args=["--namesrv", cluster.namesrv, "--broker-name", "broker-a"])
    with impostor:
        wait_until(lambda: any("refused this broker's registration" in line for line in impostor.output),
                   "the impostor's refusal in its log")
        addresses = {b.broker_name: b.address for b in ns.cluster_info().brokers}
        assert addresses["broker-a"] == original  # never merged, never replaced
        impostor.stop()
    # The real broker-a crashes and comes back on another port: its own store id, so it replaces itself at once.
    cluster.kill("broker-a")
    restarted = cluster.restart("broker-a", same_port=False)
    assert restarted.endpoint != original
    took = wait_until(lambda: {b.broker_name: b.address for b in ns.cluster_info().brokers}["broker-a"]
                    == restarted.endpoint, "the new address")
    assert took < 2.0  # not the 3 s expiry of the old registration
    ns.close()


def test_two_name_servers_each_know_the_cluster_and_clients_survive_losing_one(tmp_path: Path) -> None:
    with make_cluster(tmp_path, brokers=2, namesrvs=2) as cluster:
        create_everywhere(cluster, "TwoNs")
        for address in cluster.namesrv.split(","):  # brokers register with each name server on its own
            ns = NameServerClient([address])
            wait_until(lambda ns=ns: len(route_brokers(ns, "TwoNs")) == 2, f"routes on {address}")
            ns.close()
        cluster.namesrvs[0].kill()
        with Producer(namesrv=cluster.namesrv) as producer:
            results = [producer.send(Message("TwoNs", b"%d" % i)) for i in range(20)]
        assert {r.broker_name for r in results} == {"broker-a", "broker-b"}


def test_auto_created_topics_land_on_the_broker_that_received_the_first_send(cluster: LocalCluster) -> None:
    ns = NameServerClient([cluster.namesrv])
    with Producer(namesrv=cluster.namesrv) as producer:
        first = producer.send(Message("Fresh", b"1"))
        wait_until(lambda: route_brokers(ns, "Fresh") == {first.broker_name}, "the auto-created route")
        later = [producer.send(Message("Fresh", b"x")) for _ in range(10)]
    assert {r.broker_name for r in later} == {first.broker_name}
    ns.close()


def test_clear_errors_for_bad_name_servers_and_topics_without_a_route(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="port"):
        Producer(namesrv="localhost:notaport")
    with pytest.raises(InvalidArgumentError, match="not both"):
        Producer("127.0.0.1:10911", namesrv="127.0.0.1:9876")
    with Producer(namesrv="127.0.0.1:1", timeout_s=5) as producer, pytest.raises(
        BrokerUnreachableError, match="no name server answered"
    ):
        producer.send(Message("T", b"x"))
    no_auto_create = small_store_config(tmp_path / "conf", auto_create_topic_enable=False)
    with (
        make_cluster(tmp_path, brokers=1, config=no_auto_create) as cluster,
        Producer(namesrv=cluster.namesrv) as producer,
        pytest.raises(TopicNotExistError, match=r"no live broker .* creates topics on first send"),
    ):
        producer.send(Message("Nowhere", b"x"))
