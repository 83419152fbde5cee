"""Store test fixtures: real stores in tmp_path with tiny files so that rolling, expiry and recovery happen fast."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from broker.store import MessageStore, StoreConfig

# Small but not degenerate: a few dozen entries per commit-log file, 10 units per consume-queue file,
# 8 hash slots (so collisions are certain) and 64 index entries per index file.
SMALL = dict(
    mapped_file_size_commit_log=16 * 1024,
    mapped_file_size_consume_queue=10 * 20,
    max_hash_slot_num=8,
    max_index_num=64,
    max_message_size=4096,
    max_batch_bytes=12 * 1024,
    flush_interval_commit_log_ms=20,
    flush_interval_consume_queue_ms=20,
)


def small_config(path: str, **overrides: Any) -> StoreConfig:
    return StoreConfig(store_path=path, **{**SMALL, **overrides})


@pytest.fixture
def make_store(tmp_path: Any, request: pytest.FixtureRequest) -> Iterator[Callable[..., MessageStore]]:
    """``make_store(**config overrides)`` -> a started store on tmp_path/store; shut down after the test.

    Every store still running when the test ends must pass ``check()`` (the consistency oracle), unless the test is
    marked ``unchecked_store`` with the reason it leaves the store inconsistent on purpose."""
    started: list[MessageStore] = []

    def factory(start: bool = True, **overrides: Any) -> MessageStore:
        store = MessageStore(small_config(str(tmp_path / "store"), **overrides))
        if start:
            store.start()
        started.append(store)
        return store

    yield factory
    checked = request.node.get_closest_marker("unchecked_store") is None
    problems = {id(s): s.check() for s in started if s._running and checked}
    for s in started:
        if s._running:
            s.shutdown()
    assert not any(problems.values()), f"check() after the test: {[p for p in problems.values() if p]}"


@pytest.fixture
def store(make_store: Callable[..., MessageStore]) -> MessageStore:
    return make_store()
