"""Shared by the cluster, name server and security tests: a cluster of real processes (a name server and brokers on
port 0 of 127.0.0.1, each in its own store directory) with fast registration, and the ``cluster`` fixture."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import Admin
from broker.client.namesrv_client import NameServerClient
from broker.errors import TopicNotExistError
from broker.namesrv.local_cluster import LocalCluster
from tests.support.waiting import wait_until

# Registration every 500 ms and expiry after 3 s keep tests of routes, expiry and failover short; the production
# defaults (30 s and 120 s) are checked by the configuration tests.
REGISTER_INTERVAL_MS = 500
BROKER_EXPIRE_MS = 3000
WAIT_S = 20.0


SMALL_STORE = {  # small files: a fresh store allocates a few MiB instead of 1.4 GB
    "mapped_file_size_commit_log": 64 << 20, "mapped_file_size_consume_queue": 30_000 * 20,
    "max_hash_slot_num": 16_384, "max_index_num": 65_536,
}


def small_store_config(root: Path, **settings: object) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "broker.json"
    path.write_text(json.dumps({"store": SMALL_STORE, **settings}))
    return path


def make_cluster(root: Path, brokers: int = 3, **kwargs: object) -> LocalCluster:
    settings: dict[str, object] = {"register_interval_ms": REGISTER_INTERVAL_MS, "broker_expire_ms": BROKER_EXPIRE_MS}
    settings.update(kwargs)
    if "config" not in settings:  # a test's own config file is kept as it is (written before, maybe at this path)
        settings["config"] = small_store_config(root)
    return LocalCluster(root, brokers=brokers, **settings)  # type: ignore[arg-type]


def route_brokers(ns: NameServerClient, topic: str) -> set[str]:
    try:
        return {q.broker_name for q in ns.route(topic).queue_datas}
    except TopicNotExistError:
        return set()


def create_everywhere(cluster: LocalCluster, topic: str, queues: int = 8) -> None:
    """The topic on every broker of the cluster, and in the name servers' routes."""
    for name in cluster.names:
        with Admin(cluster.endpoint(name)) as admin:
            admin.create_topic(topic, queues)
    ns = NameServerClient(cluster.namesrv.split(","))
    try:
        wait_until(lambda: route_brokers(ns, topic) == set(cluster.names), f"{topic} on every broker")
    finally:
        ns.close()


def all_brokers_running(cluster: LocalCluster) -> LocalCluster:
    """``cluster`` with each of its brokers running: one that an earlier test of a module sharing the cluster killed
    or stopped is restarted on its store (a cluster start costs seconds; a restart only when needed)."""
    for name in cluster.names:
        if not cluster.brokers[name].running:
            cluster.restart(name)
    return cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A name server and three brokers, stopped at teardown (a suite's conftest imports it to offer it)."""
    with make_cluster(tmp_path) as c:
        yield c
