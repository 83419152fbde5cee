"""A read of offsets the query planned, met by a replica that shows less (connector/cluster_link.py's
SHORT_TAIL_RECHECK_S), on a real replicated group: the read is asked again for as long as a failover may last, not
taken for lost data after 15 s.

The soak's hour (seed 9151) stopped its Spark query once this way: during a partition of broker-a's master, an
executor's pull of 3 planned messages found the queue 3 short for longer than the 15 s the reader then waited, and
the query ended on a DataLossError, though every replica held the 3 messages once the group had settled. Here the
replicas that hold what was planned are frozen for longer than 15 s while the one left (out of the in-sync set,
behind) is all the name servers list: its answers are short until a holder is master again."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from broker.client import Admin, Message, Producer, PullStatus
from broker.ha.local_group import ReplicaGroup
from connector.cluster_link import ClusterLink
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(300)

SETTINGS = {"ha_lease_ttl_s": 2, "min_insync_replicas": 1, "ha_max_lag_ms": 2000, "ha_ack_timeout_ms": 2000}
TOPIC = "short_tail"
COUNT = 50
OLD_RECHECK_S = 15.0  # what the reader waited before: the holders stay away longer than this
HOLDERS_AWAY_S = OLD_RECHECK_S + 5


def test_a_planned_read_waits_while_only_a_replica_behind_answers(tmp_path: Path) -> None:
    with ReplicaGroup(tmp_path, 3, settings=SETTINGS) as g:
        master = g.wait_master()
        endpoint = g.endpoint(master)
        with Admin(endpoint) as admin:
            admin.create_topic(TOPIC, 1, if_not_exists=True)
        wait_until(lambda: g.state() is not None and len(g.state().in_sync) == 3,  # type: ignore[union-attr]
                   "all three replicas in sync", timeout_s=60)
        keeper, behind = (i for i in g.ids if i != master)
        g.pause(behind)  # it leaves the in-sync set and misses what follows
        wait_until(lambda: g.state() is not None and set(g.state().in_sync) == {master, keeper},  # type: ignore[union-attr]
                   "the paused replica out of the in-sync set", timeout_s=30)
        with Producer(endpoint) as producer:
            producer.send_batch([Message(TOPIC, f"m{i}".encode()) for i in range(COUNT)], queue_id=0)

        link = ClusterLink(g.namesrv, "short-tail-reader", timeout_s=3.0)
        try:
            planned = link.queue_offsets(TOPIC)
            assert planned[("broker-a", 0)] == (0, COUNT), planned  # what a driver plans from

            # The holders freeze; the replica behind, back, is the only one the name servers keep listing.
            g.pause(master)
            g.pause(keeper)
            g.resume(behind)
            def holders_back() -> None:
                g.resume(master)
                g.resume(keeper)

            back = threading.Timer(HOLDERS_AWAY_S, holders_back)
            back.start()
            try:
                started = time.monotonic()
                r = link.pull_raw((TOPIC, "broker-a", 0), COUNT - 10, max_msgs=10, tags="*")
                waited_s = time.monotonic() - started
            finally:
                back.join()
        finally:
            link.close()
        assert r.status is PullStatus.FOUND, (r.status, r.max_offset, waited_s)
        assert len(r.entry_positions) == 10 and r.next_begin_offset == COUNT
        assert waited_s > OLD_RECHECK_S, waited_s  # the old bound would have ended the read short
