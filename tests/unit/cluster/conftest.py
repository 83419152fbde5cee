"""Clusters of real processes: a name server and brokers on port 0 of 127.0.0.1, each in its own store directory
(see cluster_helpers.py for the timings)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_helpers import make_cluster

from broker.namesrv.local_cluster import LocalCluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with make_cluster(tmp_path) as c:
        yield c
