"""Helpers of the cluster suite: polling for a condition, a thread-safe listener that counts what it received,
consumer settings fast enough for tests, and waiting for a topic's route."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

from broker.client import ConsumeStatus, ReceivedMessage
from broker.client.namesrv_client import NameServerClient, route_or_none
from broker.namesrv.local_cluster import LocalCluster

# A consumer that notices changes within a fraction of a second (the defaults are 20-30 s, RocketMQ's).
FAST = {
    "heartbeat_interval_ms": 200, "rebalance_interval_ms": 200, "persist_interval_ms": 200, "long_poll_ms": 1000,
    "route_poll_interval_ms": 300, "pull_backoff_ms": 200,
}


class Sink:
    """A listener that records every body it is given (how many times each)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[bytes] = Counter()

    def __call__(self, msgs: list[ReceivedMessage]) -> ConsumeStatus:
        with self.lock:
            self.counts.update(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    def bodies(self) -> set[bytes]:
        with self.lock:
            return set(self.counts)

    def duplicates(self) -> dict[bytes, int]:
        with self.lock:
            return {b: n for b, n in self.counts.items() if n > 1}


def route_brokers(namesrv: str, topic: str) -> set[str]:
    """The broker names the name servers list for ``topic`` now (empty: no route)."""
    client = NameServerClient(namesrv.split(","))
    try:
        route = route_or_none(client, topic)
        return set() if route is None else {q.broker_name for q in route.queue_datas}
    finally:
        client.close()


def shared_cluster(root: Path, **kwargs: Any) -> LocalCluster:
    """A cluster several tests of a module share (each with its own topics and groups): three brokers, registering
    every 500 ms and expired after 3 s, as the ``cluster`` fixture's."""
    settings: dict[str, Any] = {"register_interval_ms": 500, "broker_expire_ms": 3000, **kwargs}
    return LocalCluster(root, **settings)
