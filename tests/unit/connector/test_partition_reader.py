"""The executor's read of one partition (connector/partition_reader.py) against a real broker whose oldest files
expired after the driver planned the range, before cleanup moved the queue's minimum: failOnDataLoss=true fails
the task naming the range, false skips exactly the expired messages. No SparkSession: the function Spark's
executors call, called here."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from pyspark.sql.datasource import ReadAllAvailable

from broker.client import Message, Producer
from broker.server.broker_controller import BrokerController
from connector.broker_link import link_for
from connector.connector_errors import DataLossError, SourceOptionError
from connector.group_commit import GroupCommitter
from connector.options import parse_options
from connector.partition_reader import SluicePartition, read_partition
from connector.stream_reader import SluiceStreamReader, probe_bytes


def _expired_window(broker_factory: Callable[..., BrokerController]) -> tuple[str, int, int]:
    """A queue of 400 messages whose first two commit-log files are deleted, its minimum not yet moved:
    (endpoint, first readable offset, end)."""
    small = {"mapped_file_size_commit_log": 64 * 1024, "max_message_size": 16 * 1024}
    broker = broker_factory(store=small)
    endpoint = f"127.0.0.1:{broker.port}"
    with Producer(endpoint) as p:
        for k in range(8):
            p.send_batch([Message("Part", b"%04d" % (k * 50 + i) + b"p" * 1000) for i in range(50)], queue_id=0)
    store = broker.store
    assert store is not None and store.wait_dispatched()
    store.flush()
    store.commit_log.files.delete_first(2)  # what expiry deletes, before cleanup corrects the queue
    cq = store.queues.find("Part", 0)
    assert cq is not None and store.min_offset("Part", 0) == 0
    kept_from = store.min_phys_offset()
    first = next(q for q in range(400) if cq.unit(q).commitlog_offset >= kept_from)  # type: ignore[union-attr]
    return endpoint, first, 400


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_a_range_expired_under_the_task(
    broker_factory: Callable[..., BrokerController], fail_on_data_loss: str
) -> None:
    endpoint, first, end = _expired_window(broker_factory)
    options = parse_options(
        {"endpoints": endpoint, "topic": "Part", "failOnDataLoss": fail_on_data_loss, "pullBatchSize": "32"},
        streaming=False,
    )
    part = SluicePartition("Part", 0, 10, end)
    if fail_on_data_loss == "true":  # the whole lost range is named, not one pull's worth of it
        with pytest.raises(DataLossError, match=f"requested offset 10, available from {first}; {first - 10} message"):
            list(read_partition(options, part))
        return
    offsets = [o for b in read_partition(options, part) for o in b.column("queue_offset").to_pylist()]
    assert offsets == list(range(first, end))  # every kept message, none of the expired ones


def test_the_driver_sizes_a_trigger_past_the_expired_range(broker_factory: Callable[..., BrokerController]) -> None:
    """maxBytesPerTrigger's probe stopped at the first expired offset, so each trigger planned one offset of the
    window (and with failOnDataLoss=false logged one lost message per trigger) until cleanup ran."""
    endpoint, first, end = _expired_window(broker_factory)
    options = parse_options({"endpoints": endpoint, "topic": "Part", "pullBatchSize": "32"}, streaming=True)
    link = link_for(options)
    assert probe_bytes(link, options, "Part", 0, 10, end, budget=1) == first  # expired ones cost nothing
    assert probe_bytes(link, options, "Part", 0, 10, end, budget=1 << 30) == end


def test_a_group_the_broker_does_not_know_fails_at_once_saying_what_to_do(
    broker_factory: Callable[..., BrokerController],
) -> None:
    """With auto_create_subscription_group=false the executors' pulls under the default group were refused with a
    message naming a group the user never chose, and group commits were retried for 2.6 s on every trigger."""
    broker = broker_factory(auto_create_subscription_group=False)
    endpoint = f"127.0.0.1:{broker.port}"
    with Producer(endpoint) as p:
        p.send_batch([Message("Strict", b"x")] * 3, queue_id=0)
    assert broker.store is not None and broker.store.wait_dispatched()
    options = parse_options({"endpoints": endpoint, "topic": "Strict"}, streaming=False)
    with pytest.raises(SourceOptionError, match="consumerGroup option"):
        list(read_partition(options, SluicePartition("Strict", 0, 0, 3)))
    committer = GroupCommitter("nobody")
    started = time.monotonic()
    with pytest.raises(SourceOptionError, match="'nobody'"):
        committer.commit(link_for(options), {("Strict", "broker-a", 0): 1})
    assert time.monotonic() - started < 2.0  # no retries: those alone take 2.6 s


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_a_new_queue_whose_first_messages_expired_is_data_loss(
    broker_factory: Callable[..., BrokerController], fail_on_data_loss: str
) -> None:
    """A queue that appears after the query started (here a new topic matching topicPattern) starts at 0; when
    its minimum is already past 0, its first messages expired before the query saw them. The driver started it
    at its minimum without a word; Kafka's source reports such a partition as data loss, and so does this one."""
    small = {"mapped_file_size_commit_log": 64 * 1024, "max_message_size": 16 * 1024}
    broker = broker_factory(store=small)
    endpoint = f"127.0.0.1:{broker.port}"
    with Producer(endpoint) as p:
        p.send(Message("PatA", b"first"), queue_id=0)
        opts = {"endpoints": endpoint, "topicPattern": "Pat.*", "failOnDataLoss": fail_on_data_loss}
        reader = SluiceStreamReader(parse_options({**opts, "startingOffsets": "earliest"}, streaming=True))
        first_end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
        for k in range(8):
            p.send_batch([Message("PatB", b"%04d" % (k * 50 + i) + b"p" * 1000) for i in range(50)], queue_id=0)
    store = broker.store
    assert store is not None and store.wait_dispatched()
    store.flush()
    store.commit_log.files.delete_first(2)
    assert store.cleanup is not None
    store.cleanup.clean_once()  # moves the queues' minimums past the deleted files
    lo = store.min_offset("PatB", 0)
    assert lo > 0
    if fail_on_data_loss == "true":
        with pytest.raises(DataLossError, match=f"'PatB' queue broker-a:0: requested offset 0, available from {lo}"):
            reader.latestOffset(first_end, ReadAllAvailable())
        return
    end = reader.latestOffset(first_end, ReadAllAvailable())
    parts = [p for p in reader.partitions(first_end, end) if p.topic == "PatB"]  # type: ignore[attr-defined]
    assert [(p.queue_id, p.start, p.end) for p in parts] == [(0, lo, 400)]  # type: ignore[attr-defined]
