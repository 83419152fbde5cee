"""A transaction left open (UNKNOW) at a replicated group whose master is then SIGKILLed: the new master checks it
back with the producer, and the producer's check stream to the old master ends once that one has come back as a
replica, instead of being reopened every second for ever (the soak found that loop). About 15 s: three broker
processes, an etcd and a failover are what the fault needs."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from broker.client import (
    Admin,
    LocalTransactionState,
    Message,
    PullConsumer,
    PullStatus,
    TransactionProducer,
)
from broker.ha.local_group import ReplicaGroup
from tests.support.waiting import wait_until

SETTINGS = {"ha_lease_ttl_s": 2, "min_insync_replicas": 2, "ha_max_lag_ms": 3000, "ha_ack_timeout_ms": 3000,
            "transaction_timeout_ms": 1000, "transaction_check_interval_ms": 1000}
TOPIC = "TxnFailover"
# The producer lists the masters again when a stream breaks and every 30 s (BROKER_WATCH_INTERVAL_S): generous for a
# loaded machine.
CHECKED_WITHIN_S = 60.0


def _visible(endpoint: str) -> list[bytes]:
    with PullConsumer(endpoint, "txn-reader") as c:
        r = c.pull(TOPIC, 0, 0, max_msgs=32)
        return [m.body for m in r.messages] if r.status is PullStatus.FOUND else []


def test_an_open_transaction_is_checked_back_by_the_new_master(tmp_path: Path) -> None:
    with ReplicaGroup(tmp_path, 3, settings=SETTINGS, log_level=os.environ.get("SLUICE_LOG", "WARNING")) as g:
        master = g.wait_master()
        with Admin(g.endpoint(master)) as admin:
            admin.create_topic(TOPIC, 1)
        wait_until(lambda: g.state() is not None and len(g.state().in_sync) == 3,  # type: ignore[union-attr]
                   "three replicas in sync", timeout_s=60)
        decide = threading.Event()  # the application knows the outcome only after the master is gone

        def checker(_txn: str, _half: object) -> LocalTransactionState:
            return LocalTransactionState.COMMIT_MESSAGE if decide.is_set() else LocalTransactionState.UNKNOW

        with TransactionProducer(None, "txn-failover", checker, namesrv=g.namesrv, timeout_s=20) as producer:
            wait_until(lambda: g.endpoint(master) in producer._threads, "a check stream to the master", timeout_s=30)
            sent = producer.send_in_transaction(Message(TOPIC, b"open"), lambda _m, _t: LocalTransactionState.UNKNOW)
            assert sent.local_state is LocalTransactionState.UNKNOW
            g.kill(master)
            new = g.wait_master(other_than=master, timeout_s=60)
            decide.set()
            wait_until(lambda: _visible(g.endpoint(new)) == [b"open"], "the new master's check-back to commit it",
                       timeout_s=CHECKED_WITHIN_S, interval_s=0.2)
            g.start_replica(master)  # back as a replica: it holds no transactions of its own to check
            old = producer._threads[g.endpoint(master)]
            wait_until(lambda: not old.is_alive(), "the check stream to the old master to end", timeout_s=60,
                       interval_s=0.2)
