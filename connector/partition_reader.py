"""Executor side: read one partition, queue offsets [start, end) of one queue of one broker, as Arrow record batches.

Pulls are batched (``pullBatchSize`` messages each) and never long-poll: the driver planned only offsets that were
already present, so a task never waits for data. The next pull is issued on a helper thread as soon as the
previous answer arrives, so the broker and the network work while this thread decodes (gRPC and numpy/Arrow
release the GIL for most of their work).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from broker.client import PullStatus, RawPullResult
from broker.errors import BrokerError, SubscriptionGroupNotExistError
from connector.auth_options import refusals_explained
from connector.broker_link import BrokerLink, link_for, unknown_group
from connector.data_loss import data_lost
from connector.offsets import QueueKey
from connector.options import SourceOptions
from connector.record_batch import RowFilter, decode_entries

log = logging.getLogger(__name__)

MAX_EMPTY_PULLS = 1000  # pulls in a row that move no offset forward: the broker is misbehaving, stop


@dataclass(frozen=True)
class SluicePartition(InputPartition):
    """One Spark input partition: a range of one queue. Picklable; planned on the driver, read on an executor."""

    topic: str
    queue_id: int
    start: int
    end: int  # exclusive
    broker: str = ""  # the broker holding the queue; "" for the one broker of option 'endpoints'

    def __post_init__(self) -> None:
        assert 0 <= self.start < self.end, self

    def key(self, options: SourceOptions) -> QueueKey:
        return (self.topic, self.broker or options.broker_name or "", self.queue_id)


def read_partition(options: SourceOptions, part: SluicePartition) -> Iterator[pa.RecordBatch]:
    with refusals_explained(options):  # a refusal names what to grant (auth_options.py)
        yield from _read(options, part)


def _read(options: SourceOptions, part: SluicePartition) -> Iterator[pa.RecordBatch]:
    link = link_for(options)
    row_filter_tags = options.tag_set
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="sluice-pull") as pool:
        at = part.start
        pending = pool.submit(_pull, link, options, part, at)
        stalls = 0
        while True:
            r = pending.result()
            nxt = _next_offset(options, part, at, r)
            if nxt < part.end:
                pending = pool.submit(_pull, link, options, part, nxt)
            if r.status is PullStatus.FOUND and r.entry_positions:
                batch = decode_entries(
                    r.buffer, r.entry_positions, topic=part.topic, broker=part.key(options)[1],
                    include_properties=options.include_properties,
                    row_filter=RowFilter(at, part.end, row_filter_tags),
                )
                if batch.num_rows:
                    yield batch
            stalls = stalls + 1 if nxt <= at else 0
            if stalls > MAX_EMPTY_PULLS:
                raise BrokerError(f"pulls of {part} stay at offset {at}: the broker returns no progress")
            if nxt >= part.end:
                return
            at = nxt


def _pull(link: BrokerLink, options: SourceOptions, part: SluicePartition, offset: int) -> RawPullResult:
    """One pull, retried while the broker is unreachable (a broker restart should not fail the task)."""
    max_msgs = min(options.pull_batch_size, part.end - offset)
    try:
        return link.pull_raw(part.key(options), offset, max_msgs=max_msgs, tags=options.tag_expression)
    except SubscriptionGroupNotExistError as e:
        raise unknown_group(options.pull_group, e) from None


def _next_offset(options: SourceOptions, part: SluicePartition, at: int, r: RawPullResult) -> int:
    """Where the next pull starts; lost ranges fail the task or are skipped (failOnDataLoss)."""
    if r.status in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG):
        return min(max(r.next_begin_offset, at), part.end)
    if at < r.min_offset:  # expired under us
        skip_to = min(r.min_offset, part.end)
        data_lost(options, part.key(options), at, f"from {r.min_offset}", skip_to - at)
        return skip_to
    # The queue ends before offsets the driver saw: the broker lost its tail (or the topic was recreated).
    data_lost(options, part.key(options), at, f"up to {r.max_offset}", part.end - at)
    return part.end
