"""Clusters of real processes: a name server and brokers on port 0 of 127.0.0.1, each in its own store directory.

Registration every 500 ms and expiry after 3 s keep tests of routes, expiry and failover short; the production
defaults (30 s and 120 s) are checked by the configuration tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.namesrv.local_cluster import LocalCluster

REGISTER_INTERVAL_MS = 500
BROKER_EXPIRE_MS = 3000


def make_cluster(root: Path, brokers: int = 3, **kwargs: object) -> LocalCluster:
    settings: dict[str, object] = {"register_interval_ms": REGISTER_INTERVAL_MS, "broker_expire_ms": BROKER_EXPIRE_MS}
    settings.update(kwargs)
    return LocalCluster(root, brokers=brokers, **settings)  # type: ignore[arg-type]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with make_cluster(tmp_path) as c:
        yield c
