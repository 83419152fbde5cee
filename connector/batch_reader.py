"""``spark.read.format("sluice")``: a bounded read of [startingOffsets, endingOffsets) of every queue.

A topic named by ``topic``/``topics`` that does not exist fails the read (SourceOptionError) instead of reading as
empty: a bounded read cannot wait for it, and an empty answer would hide a typo.

``partitions()`` runs once in the planning worker on the driver (it resolves offsets against the brokers there);
``read()`` runs on executors with a pickled copy of this reader and pulls each range directly from its broker.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from connector.auth_options import explains_refusals
from connector.broker_link import link_for
from connector.connector_errors import SourceOptionError
from connector.data_loss import data_lost
from connector.offset_resolver import current_topics, ending_positions, missing_topics, snapshot, starting_positions
from connector.options import SourceOptions
from connector.partition_reader import SluicePartition, read_partition
from connector.planning import OffsetRange, split_ranges

log = logging.getLogger(__name__)


class SluiceBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    @explains_refusals
    def partitions(self) -> list[InputPartition]:
        link = link_for(self.options)
        snap = snapshot(link, current_topics(self.options, link))
        missing = missing_topics(self.options, snap)
        if missing:  # a typo would otherwise read as an empty topic (a stream instead waits for it to appear)
            raise SourceOptionError(
                f"topic {missing[0]!r} does not exist on the broker at {self.options.endpoints}; check the 'topic' "
                f"option, or create the topic first (`sluice topic create {missing[0]}`)"
            )
        start = starting_positions(self.options, link, snap)
        end = ending_positions(self.options, snap, start)
        ranges = []
        for key, s in sorted(start.items()):
            lo = snap[key][0]
            e = end[key]
            if s < lo and e > s:
                data_lost(self.options, key, s, f"from {lo}", min(lo, e) - s)
                s = min(lo, e)
            topic, broker, qid = key
            ranges.append(OffsetRange(topic, qid, s, e, broker))
        parts = split_ranges(ranges, self.options.min_partitions, self.options.max_messages_per_partition)
        log.info("sluice batch read: %d partitions over %d queues", len(parts), len(ranges))
        return [SluicePartition(r.topic, r.queue_id, r.start, r.end, r.broker) for r in parts]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SluicePartition):
            return iter(())  # Spark's placeholder partition when there is nothing to read
        return read_partition(self.options, partition)
