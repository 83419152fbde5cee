"""Committed consumer offsets through failovers, on real processes with a real etcd (controller mode, three
replicas): an offset commit a master acknowledged is read back, not lower, from every later master
(broker/ha/metadata_sync.py). Two failovers in a row: the replica that stays a slave through the first one is
elected at the second, and must hold what the second master acknowledged, not only what the first one did (a
metadata version counted by the first master must not pass for one of the second's)."""

from __future__ import annotations

import os
from pathlib import Path

from broker.client import Admin, Message, Producer, PullConsumer
from broker.errors import BrokerError
from broker.ha.local_group import ReplicaGroup
from tests.support.waiting import wait_until

SETTINGS = {"ha_lease_ttl_s": 2, "min_insync_replicas": 2, "ha_max_lag_ms": 3000, "ha_ack_timeout_ms": 3000}
TOPIC, GROUP, QUEUES = "Offsets", "offsets-ha", 2
MESSAGES = 200
FIRST_COMMITS = 40  # more commits on the first master than config files any master starts with


def _commit(endpoint: str, offsets: dict[tuple[str, int], int]) -> bool:
    """Whether the master at ``endpoint`` acknowledged the commit (False while it is not master yet)."""
    try:
        with PullConsumer(endpoint, GROUP) as c:
            c.commit_offsets(offsets)
    except BrokerError:
        return False
    return True


def _committed(endpoint: str) -> dict[int, int] | None:
    try:
        with PullConsumer(endpoint, GROUP) as c:
            return dict(c.committed_offsets(TOPIC))
    except BrokerError:
        return None


def test_acknowledged_offsets_hold_through_two_failovers(tmp_path: Path) -> None:
    with ReplicaGroup(tmp_path, 3, settings=SETTINGS, log_level=os.environ.get("SLUICE_LOG", "WARNING")) as g:
        first = g.wait_master()
        with Admin(g.endpoint(first)) as admin:
            admin.create_topic(TOPIC, QUEUES, if_not_exists=True)
        wait_until(lambda: g.state() is not None and len(g.state().in_sync) == 3,  # type: ignore[union-attr]
                   "all three replicas in sync", timeout_s=60)
        with Producer(g.endpoint(first)) as p:
            for i in range(MESSAGES):
                p.send(Message(TOPIC, f"m-{i}".encode()), queue_id=i % QUEUES)
        # Each commit changes the offsets file: the first master's metadata counts up past forty.
        for n in range(1, FIRST_COMMITS + 1):
            assert _commit(g.endpoint(first), {(TOPIC, q): n for q in range(QUEUES)})
        g.kill(first)
        second = g.wait_master(other_than=first, timeout_s=30)
        acked = {q: FIRST_COMMITS + 10 + q for q in range(QUEUES)}
        wait_until(lambda: _commit(g.endpoint(second), {(TOPIC, q): o for q, o in acked.items()}),
                   "the second master acknowledging a commit", timeout_s=30)
        assert _committed(g.endpoint(second)) == acked
        # The third replica followed both masters; it is the only one left to elect.
        g.kill(second)
        third = g.wait_master(other_than=second, timeout_s=30)
        assert third not in (first, second)
        read: dict[int, int] = {}

        def answered() -> bool:
            read.update(_committed(g.endpoint(third)) or {})
            return bool(read)

        wait_until(answered, "the third master answering", timeout_s=30)
        lower = {q: (o, read.get(q)) for q, o in acked.items() if read.get(q, -1) < o}
        assert not lower, f"acknowledged offsets read back lower after the failovers (acked, read): {lower}"
