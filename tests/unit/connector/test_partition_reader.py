"""The executor's read of one partition (connector/partition_reader.py) against a real broker whose oldest files
expired after the driver planned the range, before cleanup moved the queue's minimum: failOnDataLoss=true fails
the task naming the range, false skips exactly the expired messages. No SparkSession: the function Spark's
executors call, called here."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker.client import Message, Producer
from broker.server.broker_controller import BrokerController
from connector.errors import DataLossError
from connector.options import parse_options
from connector.partition_reader import SluicePartition, read_partition


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
    if fail_on_data_loss == "true":
        with pytest.raises(DataLossError, match="requested offset 10"):
            list(read_partition(options, part))
        return
    offsets = [o for b in read_partition(options, part) for o in b.column("queue_offset").to_pylist()]
    assert offsets == list(range(first, end))  # every kept message, none of the expired ones
