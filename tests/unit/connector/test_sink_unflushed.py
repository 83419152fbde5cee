"""Rows of a transaction that a SYNC_FLUSH broker stored but did not flush to its disk in time (FLUSH_DISK_TIMEOUT):
``Producer.send_encoded`` raises FlushDiskTimeoutError instead of returning results to count, and the Spark sink
sends the rows again under a new attempt, the only one its commit names. A crash of the machine could take the
first attempt's rows away; a commit expecting them would then find fewer and stay open for ever (the same hazard as
FLUSH_SLAVE_TIMEOUT, tests/unit/ha/test_txn_in_place_unconfirmed.py). A real broker with a slow disk (its store's
fsyncs delayed past ``sync_flush_timeout_ms``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pyarrow as pa
import pytest

from broker.client import Admin, Message, Producer, PullConsumer
from broker.client.outgoing_message import encode_message
from broker.errors import FlushDiskTimeoutError
from broker.server.broker_controller import BrokerController
from connector.sink_options import parse_sink_options
from connector.sink_writer import _send_all

TOPIC = "SinkUnflushed"
FLUSH_TIMEOUT_MS = 200
SLOW_FSYNC_S = 0.6  # past the flush timeout: a send in that time is answered FLUSH_DISK_TIMEOUT
DISK_BACK_AFTER_S = 0.4  # the sink's first call is answered so; its resend finds a fast disk


def _rows(prefix: str, n: int) -> bytes:
    now = int(time.time() * 1000)
    return b"".join(encode_message(Message(TOPIC, f"{prefix}-{i}".encode()), 0, now) for i in range(n))


def _bodies(endpoint: str) -> list[bytes]:
    with PullConsumer(endpoint, "sink-unflushed-reader") as reader:
        return sorted(m.body for m in reader.pull(TOPIC, 0, 0, max_msgs=32).messages)


def test_unflushed_transaction_rows_are_an_unknown_outcome_and_the_sink_sends_them_again(
    broker_factory: Callable[..., BrokerController],
) -> None:
    broker = broker_factory(flush_disk_type="SYNC_FLUSH", store={"sync_flush_timeout_ms": FLUSH_TIMEOUT_MS})
    assert broker.store is not None
    faults = broker.store.faults
    endpoint = f"127.0.0.1:{broker.port}"
    with Admin(endpoint) as admin:
        admin.create_topic(TOPIC, 1)

    with Producer(endpoint) as producer:
        assert len(producer.send_encoded(_rows("flushed", 3), 3, "client-txn", attempt="a")) == 3
        faults.delay_fsyncs(SLOW_FSYNC_S)
        try:
            with pytest.raises(FlushDiskTimeoutError, match="not flushed to its disk in time"):
                producer.send_encoded(_rows("unflushed", 3), 3, "client-txn", attempt="b")
        finally:
            faults.delay_fsyncs(0)
    with Admin(endpoint) as admin:
        assert admin.end_transaction("client-txn", commit=True, committed_attempts=["a"],
                                     expected_messages=3) == "COMMITTED"
    assert _bodies(endpoint) == [b"flushed-0", b"flushed-1", b"flushed-2"]

    # The sink: its first call is answered FLUSH_DISK_TIMEOUT, so the rows go again under a new attempt.
    opts = parse_sink_options({"endpoints": endpoint, "topic": TOPIC})
    batch = pa.record_batch({"body": pa.array([f"sink-{i}".encode() for i in range(3)], pa.binary())})
    faults.delay_fsyncs(SLOW_FSYNC_S)
    disk_back = threading.Timer(DISK_BACK_AFTER_S, faults.delay_fsyncs, (0,))
    disk_back.start()
    try:
        sent, _, _, attempt = _send_all(opts, iter([batch]), "sink-txn", "7")
    finally:
        disk_back.join()
        faults.delay_fsyncs(0)
    assert sent == 3 and attempt.startswith("7.")  # not "7": a crash of the machine may lose that attempt's rows
    with Admin(endpoint) as admin:
        assert admin.end_transaction("sink-txn", commit=True, committed_attempts=[attempt],
                                     expected_messages=sent) == "COMMITTED"
    assert _bodies(endpoint) == [b"flushed-0", b"flushed-1", b"flushed-2", b"sink-0", b"sink-1", b"sink-2"]
