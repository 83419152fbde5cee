"""Rows of a transaction written in place that the master stored but its in-sync replicas did not confirm in time
(FLUSH_SLAVE_TIMEOUT), on real processes with a real etcd: ``Producer.send_encoded`` raises FlushSlaveTimeoutError
instead of returning results, and the Spark sink sends the rows again under a new attempt, so its commit names
and counts only rows the replicas hold.

Before, the answer came back as results with status FLUSH_SLAVE_TIMEOUT that the sink counted as sent: in the soak,
a master paused right after storing one task's 4 rows answered so once resumed, a new master had taken over
without them, the old one cut them from its log as it rejoined, and the committed decision (8 attempts, 32 rows)
met 28 rows on the broker: the commit was refused at every restart of the query, stuck at that micro-batch."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from broker.client import Admin, Message, Producer, PullConsumer
from broker.client.outgoing_message import encode_message
from broker.errors import FlushSlaveTimeoutError
from broker.ha.local_group import ReplicaGroup
from connector.sink_options import parse_sink_options
from connector.sink_writer import _send_all
from tests.support.waiting import wait_until

# A paused slave stays in the in-sync set for ha_max_lag_ms, so a write waits for it ha_ack_timeout_ms and is answered
# FLUSH_SLAVE_TIMEOUT.
SETTINGS = {"ha_lease_ttl_s": 2, "min_insync_replicas": 2, "ha_max_lag_ms": 8000, "ha_ack_timeout_ms": 1000}
TOPIC = "TxnInPlaceUnconfirmed"
PREMISE_ROUNDS = 3  # tries of the client's case when the group changed under it (see the test)
RESUME_AFTER_S = 1.5  # past the first call's ack timeout: that call is answered FLUSH_SLAVE_TIMEOUT, a later one not


def _rows(prefix: str, n: int) -> bytes:
    now = int(time.time() * 1000)
    return b"".join(encode_message(Message(TOPIC, f"{prefix}-{i}".encode()), 0, now) for i in range(n))


def _bodies(endpoint: str) -> list[bytes]:
    with PullConsumer(endpoint, "txn-in-place-reader") as reader:
        return sorted(m.body for m in reader.pull(TOPIC, 0, 0, max_msgs=32).messages)


def test_unconfirmed_in_place_rows_are_an_unknown_outcome_and_the_sink_sends_them_again(tmp_path: Path) -> None:
    # ~16 s: a three-replica group with its etcd takes most of it, so the client and the sink share one group
    with ReplicaGroup(tmp_path, 3, settings=SETTINGS, log_level=os.environ.get("SLUICE_LOG", "WARNING")) as g:
        master = g.wait_master()
        with Admin(g.endpoint(master)) as admin:
            admin.create_topic(TOPIC, 1, if_not_exists=True)

        # The client: confirmed rows are results, unconfirmed ones an error (never results to count). The paused
        # slave must be in the master's in-sync set for the whole send; a suite loading the machine can cost the
        # master its lease meanwhile, which this checks in the recorded state and then tries again.
        for round_no in range(PREMISE_ROUNDS):
            master = g.wait_master()
            endpoint = g.endpoint(master)
            wait_until(lambda: g.state() is not None and len(g.state().in_sync) == 3,  # type: ignore[union-attr]
                       "all three replicas in sync", timeout_s=60)
            before = g.state()
            assert before is not None
            slave = next(i for i in g.ids if i != master)
            txn = f"client-txn-{round_no}"
            with Producer(endpoint) as producer:
                assert len(producer.send_encoded(_rows("confirmed", 3), 3, txn, attempt="a")) == 3
                g.pause(slave)
                try:
                    producer.send_encoded(_rows("unconfirmed", 3), 3, txn, attempt="b")
                except FlushSlaveTimeoutError as e:
                    assert "did not confirm" in e.message
                    break
                finally:
                    g.resume(slave)
            after = g.state()
            assert after is not None and (after.epoch != before.epoch or slave not in after.in_sync), (
                f"send_encoded returned results while in-sync replica {slave} was paused, the group unchanged ({after})"
            )
            with Admin(g.endpoint(g.wait_master())) as admin:  # its rows must not hold the queue back
                admin.end_transaction(txn, commit=False)
        else:
            pytest.fail(f"the group changed under every one of {PREMISE_ROUNDS} rounds")
        with Admin(endpoint) as admin:
            assert admin.end_transaction(txn, commit=True, committed_attempts=["a"],
                                         expected_messages=3) == "COMMITTED"
        assert _bodies(endpoint) == [b"confirmed-0", b"confirmed-1", b"confirmed-2"]

        # The sink: the task's first call is unconfirmed, so its rows go again under a new attempt, the one it names.
        opts = parse_sink_options({"endpoints": endpoint, "topic": TOPIC})
        batch = pa.record_batch({"body": pa.array([f"sink-{i}".encode() for i in range(3)], pa.binary())})
        g.pause(slave)
        resume = threading.Timer(RESUME_AFTER_S, g.resume, (slave,))
        resume.start()
        try:
            sent, _, _, attempt = _send_all(opts, iter([batch]), "sink-txn", "7")
        finally:
            resume.join()
        assert sent == 3 and attempt.startswith("7.")  # not "7": that attempt's rows may be lost in a failover
        with Admin(endpoint) as admin:
            assert admin.end_transaction("sink-txn", commit=True, committed_attempts=[attempt],
                                         expected_messages=sent) == "COMMITTED"
        assert _bodies(endpoint) == [b"confirmed-0", b"confirmed-1", b"confirmed-2",
                                     b"sink-0", b"sink-1", b"sink-2"]
