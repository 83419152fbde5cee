"""Replication tests: in-process brokers for component tests, real processes and a real etcd for fault tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from broker.ha.etcd_process import EtcdProcess


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    with EtcdProcess(tmp_path / "etcd") as e:
        yield e
