"""Broker processes for the suites that test through a real ``sluice broker`` (the connector, RocketMQ 5), and
waiting for sent messages to be readable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from broker.client import Admin
from broker.private_file import write_private
from broker.server.process import BrokerProcess
from tests.support.waiting import wait_until


def start_broker(store: Path, settings: dict[str, Any] | None = None) -> BrokerProcess:
    """A broker process on 127.0.0.1 port 0 storing in ``store``; ``settings``, the contents of its config file,
    are written beside the store as a private file (they may hold the root user's secret key)."""
    config = None
    if settings is not None:
        config = store.parent / f"{store.name}.json"
        write_private(config, json.dumps(settings).encode())
    return BrokerProcess(store, config=config).start()


def wait_dispatched(broker: Admin | str, topic: str, max_offsets: dict[int, int], timeout_s: float = 30.0) -> None:
    """Until every queue's max offset reaches the given one. A send is acknowledged once in the commit log; the
    consume queues that pulls read are built right after by the dispatcher (as RocketMQ's reput service does),
    so a pull issued the instant a send returns may not see it yet. ``broker`` is an endpoint, or an Admin that
    carries the credentials of a broker with authentication."""
    if isinstance(broker, str):
        with Admin(broker) as admin:
            wait_dispatched(admin, topic, max_offsets, timeout_s)
        return

    def dispatched() -> bool:
        have = {qid: hi for qid, (_lo, hi) in broker.queue_offsets(topic).items()}
        return all(have.get(qid, 0) >= want for qid, want in max_offsets.items())

    wait_until(dispatched, f"the max offsets of {topic}'s queues to reach {max_offsets}", timeout_s=timeout_s)
