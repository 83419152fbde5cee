"""RocketMQ 5's official Python client (rocketmq-python-client, pinned in pyproject.toml) against a real broker
process: one broker for the module's tests (crash tests start their own), configured for quick redeliveries,
check-backs and dead letters so that each test waits seconds, not RocketMQ's minutes."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from rmqv2_helpers import FAST

from broker.server.process import BrokerProcess
from tests.support.brokers import start_broker


@pytest.fixture(scope="module")
def broker_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("rmqv2")
    proc = start_broker(root / "store", FAST)
    yield proc
    assert proc.stop() == 0, "\n".join(proc.output)
    shutil.rmtree(root)  # the preallocated store: tmp_path_retention_policy only removes function-scoped dirs


@pytest.fixture
def endpoint(broker_proc: BrokerProcess) -> str:
    return broker_proc.endpoint


@pytest.fixture
def store_dir(broker_proc: BrokerProcess) -> Path:
    return Path(broker_proc.args[broker_proc.args.index("--store") + 1])
