"""A transaction's half message answered FLUSH_SLAVE_TIMEOUT (stored on the master, not confirmed by its in-sync
replicas in time), on real processes with a real etcd: the producer does not run the local transaction, rolls the
half back where it is, and raises FlushSlaveTimeoutError (the send's outcome is unknown), as RocketMQ's producer runs
the local transaction on SEND_OK only. Before, the local transaction ran and committed a half that a failover could
take away: a committed transaction lost (the soak's "half acknowledged, committed, not readable")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.client import Admin, Message, PullConsumer
from broker.client.transaction_producer import LocalTransactionState, TransactionProducer
from broker.errors import FlushSlaveTimeoutError
from broker.ha.local_group import ReplicaGroup
from tests.support.waiting import wait_until

# A paused slave stays in the in-sync set for ha_max_lag_ms, so a write waits for it ha_ack_timeout_ms and is answered
# FLUSH_SLAVE_TIMEOUT.
SETTINGS = {"ha_lease_ttl_s": 2, "min_insync_replicas": 2, "ha_max_lag_ms": 8000, "ha_ack_timeout_ms": 1000}
TOPIC, GROUP = "TxnHalfUnconfirmed", "txn-half-unconfirmed"


def test_a_half_the_replicas_did_not_confirm_runs_no_local_transaction(tmp_path: Path) -> None:
    with ReplicaGroup(tmp_path, 3, settings=SETTINGS, log_level=os.environ.get("SLUICE_LOG", "WARNING")) as g:
        master = g.wait_master()
        with Admin(g.endpoint(master)) as admin:
            admin.create_topic(TOPIC, 1, if_not_exists=True)
        wait_until(lambda: g.state() is not None and len(g.state().in_sync) == 3,  # type: ignore[union-attr]
                   "all three replicas in sync", timeout_s=60)
        ran: list[str] = []

        def local(_msg: Message, txn_id: str) -> LocalTransactionState:
            ran.append(txn_id)
            return LocalTransactionState.COMMIT_MESSAGE

        def checker(_txn_id: str, _half: object) -> LocalTransactionState:
            return LocalTransactionState.ROLLBACK_MESSAGE  # its local transaction never ran

        slave = next(i for i in g.ids if i != master)
        with TransactionProducer(g.endpoint(master), GROUP, checker) as producer:
            confirmed = producer.send_in_transaction(Message(TOPIC, b"confirmed"), local, queue_id=0)
            assert confirmed.local_state is LocalTransactionState.COMMIT_MESSAGE and len(ran) == 1
            g.pause(slave)
            try:
                with pytest.raises(FlushSlaveTimeoutError, match="local transaction was not run"):
                    producer.send_in_transaction(Message(TOPIC, b"unconfirmed"), local, queue_id=0)
            finally:
                g.resume(slave)
            assert len(ran) == 1, "the local transaction ran on a half its replicas had not confirmed"
        # the rollback and everything before it in every replica's log: nothing more will become readable
        wait_until(lambda: len({g.log_end(i) for i in g.ids}) == 1, "every replica holding the master's log",
                   timeout_s=10)
        with PullConsumer(g.endpoint(master), "txn-half-reader") as reader:
            assert [m.body for m in reader.pull(TOPIC, 0, 0, max_msgs=8).messages] == [b"confirmed"]
