"""Brokers with every semantics service, in-process on port 0 (or as a child process for crash tests).

Delay levels are short except level 2 (5 s, RocketMQ's), so that one test can wait a real level-2 delay while the
retry path (levels 3..18) runs in a few seconds; transactions are checked back quickly. ``check()`` of the store
must be clean when each test ends.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.config import BrokerConfig
from broker.server.broker_controller import BrokerController

SHORT_LEVELS = "1s 5s " + " ".join(["200ms"] * 16)  # 18 levels; level 2 is the real 5 s
SMALL_STORE: dict[str, Any] = {
    "mapped_file_size_commit_log": 64 << 20,
    "mapped_file_size_consume_queue": 20_000 * 20,
    "max_hash_slot_num": 4096,
    "max_index_num": 200_000,
}
SEMANTICS: dict[str, Any] = {
    "message_delay_level": SHORT_LEVELS,
    "transaction_timeout_ms": 300,
    "transaction_check_interval_ms": 100,
    "transaction_check_max": 15,
}

BrokerFactory = Callable[..., BrokerController]


def broker_config(store_dir: Path, **overrides: Any) -> BrokerConfig:
    store = {**SMALL_STORE, **overrides.pop("store", {})}
    settings = {"listen": "127.0.0.1:0", "store_path": str(store_dir), **SEMANTICS, **overrides}
    return BrokerConfig(store=store, **settings)


def final_check(store_dir: Path, **settings: Any) -> None:
    """check() of the store once the last broker stopped, opened by a broker with the same settings."""
    final = BrokerController(broker_config(store_dir, **settings))
    final.start()
    try:
        assert final.store is not None and final.store.wait_dispatched(10)
        assert final.store.check() == []
    finally:
        final.shutdown()


