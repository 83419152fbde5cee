"""Helpers for the connector tests: brokers in subprocesses, topics, deterministic message bodies."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.client import Admin, Message, Producer
from broker.server.process import BrokerProcess

# Small files so that expiry tests have several commit-log and consume-queue files to delete.
EXPIRING_STORE: dict[str, Any] = {
    "mapped_file_size_commit_log": 64 * 1024,
    "mapped_file_size_consume_queue": 50 * 20,
    "max_message_size": 16 * 1024,
    "file_reserved_time_hours": 1 / 3600,  # one second
    "delete_when": ";".join(f"{h:02d}" for h in range(24)),  # every hour is a deletion hour
    "clean_resource_interval_ms": 200,
    "max_hash_slot_num": 4096,
    "max_index_num": 16384,
}


def start_broker(store: Path, store_config: dict[str, Any] | None = None) -> BrokerProcess:
    config = None
    if store_config is not None:
        config = store.parent / f"{store.name}.json"
        config.write_text(json.dumps({"store": store_config}))
    return BrokerProcess(store, config=config).start()


def new_topic(endpoint: str, queues: int = 8, prefix: str = "t") -> str:
    topic = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with Admin(endpoint) as admin:
        admin.create_topic(topic, queues)
    return topic


def body_of(topic: str, queue_id: int, i: int) -> bytes:
    return f"{topic}|{queue_id}|{i}".encode()


def fill(
    endpoint: str,
    topic: str,
    per_queue: int,
    queues: range | list[int],
    *,
    first: int = 0,
    tags: Callable[[int], str | None] = lambda i: None,
    chunk: int = 5000,
) -> None:
    """Send ``per_queue`` messages to each queue; message i of queue q has body ``topic|q|i`` (i from ``first``)."""
    with Producer(endpoint) as producer:
        for q in queues:
            for lo in range(first, first + per_queue, chunk):
                hi = min(lo + chunk, first + per_queue)
                msgs = [Message(topic, body_of(topic, q, i), tags=tags(i), keys=(f"k{i}",)) for i in range(lo, hi)]
                results = producer.send_batch(msgs, queue_id=q)
                assert len(results) == hi - lo


def wait_for(predicate: Callable[[], bool], timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)
