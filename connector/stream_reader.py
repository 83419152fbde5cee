"""``spark.readStream.format("sluice")``: the micro-batch stream reader.

Where each method runs (PySpark 4.3): one long-lived Python process on the driver owns one reader instance for the
whole query and serves ``initialOffset``, ``latestOffset(start, limit)``, ``getDefaultReadLimit``,
``reportLatestOffset``, ``prepareForTriggerAvailableNow``, ``partitions(start, end)`` and ``commit(end)``, so it may
keep state between triggers. ``read(partition)`` runs on executors in a different instance (pickled at planning
time), so it uses nothing but the options and the partition.

Commit protocol: Spark calls ``commit(end)`` for batch N only after batch N+1 has been planned, i.e. after batch N
is in the sink and the commit log. The engine runs batches one after another, so when ``latestOffset(start, ...)``
is called with ``start`` equal to the end of the batch this reader planned last, that batch is also durably done;
committing it then means the group is not left one batch behind when an AvailableNow query ends. The only other
commit is of the query's start (``_pin_fallbacks``), so the group never passes the checkpoint.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow

from broker.client import PullStatus
from broker.errors import SubscriptionGroupNotExistError
from broker.store.message import I64, POS_QUEUE_OFFSET
from connector.admission import AdmissionControl, default_read_limit
from connector.broker_link import BrokerLink, link_for, retried, unknown_group
from connector.data_loss import data_lost
from connector.group_commit import GroupCommitter
from connector.offset_resolver import (
    Snapshot,
    current_topics,
    missing_topics,
    snapshot,
    starting_positions,
    uncommitted,
)
from connector.offsets import QueueKey, SourceOffset
from connector.options import SourceOptions
from connector.partition_reader import SluicePartition, read_partition
from connector.planning import QueueRange, split_ranges

log = logging.getLogger(__name__)


class SluiceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._target: dict[QueueKey, int] | None = None  # Trigger.AvailableNow: never read past these
        self._snapshot: Snapshot = {}
        self._planned_end: dict[QueueKey, int] | None = None
        self._admission = AdmissionControl(options)
        self._committer = GroupCommitter(options.consumer_group)
        self._initial: dict | None = None  # initialOffset's answer, kept for Spark's second question

    # ------------------------------------------------------------------------------------------------ offsets

    def initialOffset(self) -> dict:
        """Resolved once per reader: Spark asks again when it runs the first batch (its start), and a second look
        at a moving queue ("latest") would start that batch after what was planned for it, skipping the messages
        that arrived in between."""
        if self._initial is None:
            link = link_for(self.options)
            snap = snapshot(link, current_topics(self.options, link))
            for topic in missing_topics(self.options, snap):  # a stream waits for it, as Kafka's subscribe does
                log.warning("topic %r does not exist on the broker yet; the query reads it once it is created", topic)
            positions = starting_positions(self.options, link, snap)
            self._pin_fallbacks(link, snap, positions)
            self._initial = self._json(positions)
            log.info("sluice source starts at %s", self._initial)
        return dict(self._initial)

    def _pin_fallbacks(self, link: BrokerLink, snap: Snapshot, positions: Mapping[QueueKey, int]) -> None:
        """startingOffsets=committed (the default with a group): queues the group has no offset for start at the
        fallback, which moves. Committing that start to the group makes a driver restarted before the first batch
        commits (Spark then asks initialOffset again) resolve the same start, not a later one. Nothing consumed is
        passed: these are where reading begins."""
        if self.options.starting.mode != "committed" or self.options.consumer_group is None:
            return
        fresh = uncommitted(link, snap)
        if fresh:
            self._committer.commit(link, {k: positions[k] for k in sorted(fresh)})

    def getDefaultReadLimit(self) -> ReadLimit:
        return default_read_limit(self.options)

    def prepareForTriggerAvailableNow(self) -> None:
        link = link_for(self.options)
        self._target = {k: hi for k, (_, hi) in snapshot(link, current_topics(self.options, link)).items()}
        log.info("Trigger.AvailableNow: reading up to %s", self._target)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        link = link_for(self.options)
        begin = self._parse(start)
        if self._planned_end is not None and begin == self._planned_end:
            self._committer.commit(link, begin)  # the batch this reader planned last is done (module docstring)
        topics = sorted(set(current_topics(self.options, link)) | {t for t, _ in begin})
        self._snapshot = snap = snapshot(link, topics)
        begin = self._skip_lost(begin, snap)
        latest = {k: hi for k, (_, hi) in snap.items()}
        if self._target is not None:
            latest = {k: min(hi, self._target[k]) for k, hi in latest.items() if k in self._target}
        # Queues that appeared since the last trigger (new topic, more queues) start at their earliest offset.
        base = {k: begin.get(k, snap[k][0]) for k in latest}
        for (topic, qid), lo in sorted(base.items()):
            if (topic, qid) not in begin and lo > 0:  # a queue starts at 0: its first messages expired unread
                data_lost(self.options, topic, qid, 0, f"from {lo} (a queue new to this query)", lo)
        end = self._admission.end_offsets(
            base, latest, limit, self._probe_bytes, available_now=self._target is not None
        )
        return self._json({**begin, **end})

    def reportLatestOffset(self) -> dict | None:
        if not self._snapshot:
            return None
        return self._json({k: hi for k, (_, hi) in self._snapshot.items()})

    def commit(self, end: dict) -> None:
        self._committer.commit(link_for(self.options), self._parse(end))

    # ------------------------------------------------------------------------------------------------ planning

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, finish = self._parse(start), self._parse(end)
        missing = [k for k in finish if k not in begin]
        if missing and not all(k in self._snapshot for k in missing):
            link = link_for(self.options)
            self._snapshot = {**self._snapshot, **snapshot(link, sorted({t for t, _ in missing}))}
        ranges = [
            QueueRange(t, q, begin[(t, q)] if (t, q) in begin else self._snapshot.get((t, q), (0, 0))[0], e)
            for (t, q), e in finish.items()
        ]
        parts = split_ranges(
            [r for r in ranges if r.end > r.start],
            self.options.min_partitions,
            self.options.max_messages_per_partition,
        )
        self._planned_end = finish
        return [SluicePartition(r.topic, r.queue_id, r.start, r.end) for r in parts]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SluicePartition), type(partition)
        return read_partition(self.options, partition)

    # ------------------------------------------------------------------------------------------------ helpers

    def _parse(self, offset: Mapping) -> dict[QueueKey, int]:
        return dict(SourceOffset.from_json(self.options.broker_name, offset).positions)

    def _json(self, positions: Mapping[QueueKey, int]) -> dict:
        return SourceOffset(self.options.broker_name, positions).to_json()

    def _skip_lost(self, begin: dict[QueueKey, int], snap: Snapshot) -> dict[QueueKey, int]:
        """Queues whose next offset expired or that vanished: fail, or (failOnDataLoss=false) move past the loss."""
        out = dict(begin)
        for (topic, qid), off in sorted(begin.items()):
            lo_hi = snap.get((topic, qid))
            if lo_hi is None:
                data_lost(self.options, topic, qid, off, "none: the queue no longer exists", 0)
                del out[(topic, qid)]
            elif off < lo_hi[0]:
                data_lost(self.options, topic, qid, off, f"from {lo_hi[0]}", lo_hi[0] - off)
                out[(topic, qid)] = lo_hi[0]
            elif off > lo_hi[1]:
                data_lost(self.options, topic, qid, off, f"up to {lo_hi[1]} (the queue went back)", 0)
                out[(topic, qid)] = lo_hi[1]
        return out

    def _probe_bytes(self, topic: str, queue_id: int, start: int, cap: int, budget: int) -> int:
        return probe_bytes(link_for(self.options), self.options, topic, queue_id, start, cap, budget)


def probe_bytes(
    link: BrokerLink, options: SourceOptions, topic: str, queue_id: int, start: int, cap: int, budget: int
) -> int:
    """The end offset (exclusive, <= cap) such that the stored entries of [start, end) fit in ``budget`` bytes."""
    at, used = start, 0
    while at < cap:
        try:
            r = retried(  # as every driver-side call: a broker restart during planning is ridden out, not fatal
                functools.partial(link.consumer.pull_raw, topic, queue_id, at,
                                  max_msgs=min(options.pull_batch_size, cap - at), tags=options.tag_expression)
            )  # fmt: skip
        except SubscriptionGroupNotExistError as e:
            raise unknown_group(options.pull_group, e) from None
        if r.status is PullStatus.NO_MATCHED_MSG:
            at = min(max(r.next_begin_offset, at + 1), cap)
            continue
        if r.status is PullStatus.OFFSET_ILLEGAL and r.min_offset > at:
            # expired before cleanup moved the queue's minimum: those offsets cost no bytes; the executor that
            # reads them reports the loss (failOnDataLoss)
            at = min(r.min_offset, cap)
            continue
        if r.status is not PullStatus.FOUND or not r.entry_positions:
            return at
        bounds = [*r.entry_positions, len(r.buffer)]
        for i, pos in enumerate(r.entry_positions):
            queue_offset = I64.unpack_from(r.buffer, pos + POS_QUEUE_OFFSET)[0]
            size = bounds[i + 1] - pos
            if queue_offset >= cap:
                return cap
            if used + size > budget:
                return queue_offset
            used += size
        at = min(max(r.next_begin_offset, at + 1), cap)
    return cap
