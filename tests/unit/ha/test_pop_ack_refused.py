"""An ack refused after the master made it (its in-sync replicas did not confirm it in time: FLUSH_SLAVE_TIMEOUT)
is undone, on real processes with a real etcd: the message is delivered again after its invisible time, on the same
master or, after a failover, on the next one, and the consumer's handle stays good for an ack tried again
(broker/semantics/pop_ack_undo.py). Before, such an ack stood: the consumer was told it failed and the message was
never delivered again (the soak's "stored, never acknowledged" pop messages)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from broker.client import Admin, Message, PopConsumer, Producer
from broker.errors import FlushSlaveTimeoutError, NotMasterError, ServiceNotAvailableError
from broker.ha.local_group import ReplicaGroup
from tests.support.waiting import wait_until

# A paused slave stays in the in-sync set for ha_max_lag_ms, so an ack waits for it ha_ack_timeout_ms and is refused.
SETTINGS = {"ha_lease_ttl_s": 2, "min_insync_replicas": 2, "ha_max_lag_ms": 8000, "ha_ack_timeout_ms": 1000,
            "pop_min_invisible_ms": 100}
TOPIC, GROUP = "PopAckRefused", "pop-ack-refused"
INVISIBLE_MS = 5_000


def test_a_refused_ack_is_undone_and_the_message_delivered_again_by_the_next_master(tmp_path: Path) -> None:
    with ReplicaGroup(tmp_path, 3, settings=SETTINGS, log_level=os.environ.get("SLUICE_LOG", "WARNING")) as g:
        master = g.wait_master()
        with Admin(g.endpoint(master)) as admin:
            admin.create_topic(TOPIC, 1, if_not_exists=True)
            admin.update_subscription_group(GROUP)
        wait_until(lambda: g.state() is not None and len(g.state().in_sync) == 3,  # type: ignore[union-attr]
                   "all three replicas in sync", timeout_s=60)
        with Producer(g.endpoint(master)) as p:
            for body in (b"left", b"acked-again"):
                p.send(Message(TOPIC, body), queue_id=0)
        slave = next(i for i in g.ids if i != master)
        with PopConsumer(g.endpoint(master), GROUP) as c:
            got = []
            wait_until(lambda: len(got) == 2 or bool(got.extend(c.receive(TOPIC, 2, INVISIBLE_MS))), "both received",
                       timeout_s=10)
            left, acked_again = sorted(got, key=lambda m: m.message.body != b"left")
            g.pause(slave)
            try:
                with pytest.raises(FlushSlaveTimeoutError):
                    c.ack_all([left, acked_again])
            finally:
                g.resume(slave)
            c.ack(acked_again)  # its handle is current again: the ack tried again is taken
        # the undo is in the log of every replica: the next master replays it
        wait_until(lambda: len({g.log_end(i) for i in g.ids}) == 1, "every replica holding the master's log",
                   timeout_s=10)
        g.kill(master)
        new = g.wait_master(other_than=master, timeout_s=30)
        again: list[tuple[bytes, int]] = []
        with PopConsumer(g.endpoint(new), GROUP) as c:
            deadline = time.monotonic() + max(left.invisible_until_ms - time.time() * 1000, 0) / 1000 + 10
            while time.monotonic() < deadline and not again:
                try:
                    popped = c.receive(TOPIC, 2, INVISIBLE_MS, wait_ms=500)
                except (NotMasterError, ServiceNotAvailableError):  # etcd names it a moment before it serves pops
                    time.sleep(0.1)
                    continue
                again += [(m.message.body, int(time.time() * 1000)) for m in popped]
        assert [body for body, _ in again] == [b"left"], "the message whose ack was refused was not delivered again"
        assert again[0][1] >= left.invisible_until_ms, "delivered again before its invisible time ended"
