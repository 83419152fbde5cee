"""Shared by the unit suites: in-process brokers on port 0 in tmp dirs, with small store files; `check()` must be
clean at teardown. (The connector suite defines its own `broker` fixture; semantics_e2e overrides
`broker_defaults`.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.config import BrokerConfig
from broker.server.broker_controller import BrokerController

SMALL_STORE: dict[str, Any] = {
    "mapped_file_size_commit_log": 16 << 20,
    "mapped_file_size_consume_queue": 4000 * 20,
    "max_hash_slot_num": 4096,
    "max_index_num": 16384,
}

BrokerFactory = Callable[..., BrokerController]


@pytest.fixture
def broker_defaults() -> tuple[dict[str, Any], dict[str, Any]]:
    """(store table, broker settings) every ``broker_factory`` broker starts from; a suite overrides this fixture
    to start its brokers differently (semantics_e2e: short delay levels, quick check-backs)."""
    return SMALL_STORE, {}


@pytest.fixture
def broker_factory(tmp_path: Path, broker_defaults: tuple[dict[str, Any], dict[str, Any]]) -> Iterator[BrokerFactory]:
    running: list[BrokerController] = []
    store_defaults, settings_defaults = broker_defaults

    def make(store_dir: Path | None = None, **overrides: Any) -> BrokerController:
        store = {**store_defaults, **overrides.pop("store", {})}
        settings = {"listen": "127.0.0.1:0", "store_path": str(store_dir or tmp_path / "store"), **settings_defaults,
                    **overrides}
        config = BrokerConfig(store=store, **settings)
        controller = BrokerController(config)
        controller.start()
        running.append(controller)
        return controller

    yield make
    for controller in running:
        if controller.store is not None and not controller._stopped:
            problems = controller.store.check()
            controller.shutdown()
            assert problems == [], problems


@pytest.fixture
def broker(broker_factory: BrokerFactory) -> BrokerController:
    return broker_factory()


@pytest.fixture
def endpoint(broker: BrokerController) -> str:
    return f"127.0.0.1:{broker.port}"
