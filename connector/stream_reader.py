"""``spark.readStream.format("sluice")``: the micro-batch stream reader.

Where each method runs (PySpark 4.3): one long-lived Python process on the driver owns one reader instance for the
whole query and serves ``initialOffset``, ``latestOffset(start, limit)``, ``getDefaultReadLimit``,
``reportLatestOffset``, ``prepareForTriggerAvailableNow``, ``partitions(start, end)`` and ``commit(end)``, so it may
keep state between triggers; ``stop()`` runs there too, once, when the query ends. ``read(partition)`` runs on
executors in a different instance (pickled at planning time), so it uses nothing but the options and the partition.

Commit protocol: Spark calls ``commit(end)`` for batch N only after batch N+1 has been planned, i.e. after batch N
is in the sink and the commit log. The engine runs batches one after another, so when ``latestOffset(start, ...)``
is called with ``start`` equal to the end of the batch this reader planned last, that batch is also durably done;
committing it then means the group is not left one batch behind when an AvailableNow query ends. The only other
commit is of the query's start (``_pin_fallbacks``), so the group never passes the checkpoint.

Partitions are (topic, broker, queue). In a cluster the routes are read again as triggers are planned: a broker or
a queue that joins shows up as new partitions starting at 0 (data loss when its minimum is already past 0, as for a
new topic), and a broker whose queues the query reads but that left the cluster or does not answer stops the query
naming it, or with failOnDataLoss=false holds its queues at their offsets until it answers again (data_loss.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow

from broker.client import PullStatus
from broker.errors import ServiceNotAvailableError, SubscriptionGroupNotExistError
from broker.format.message import I64, POS_QUEUE_OFFSET
from connector.admission import AdmissionControl, default_read_limit
from connector.auth_options import explains_refusals
from connector.broker_link import BrokerLink, link_for, release_link, unknown_group
from connector.data_loss import broker_gone, data_lost
from connector.failover import FAILOVER_WAIT_S
from connector.group_commit import GroupCommitter
from connector.offset_resolver import (
    Snapshot,
    current_topics,
    missing_topics,
    snapshot,
    starting_positions,
    uncommitted,
)
from connector.offsets import QueueKey, SourceOffset, describe
from connector.options import SourceOptions
from connector.partition_reader import SluicePartition, read_partition
from connector.planning import OffsetRange, split_ranges

log = logging.getLogger(__name__)

# The module PySpark runs (``python -m``) as the driver-side process that owns a stream reader (module docstring).
SOURCE_RUNNER_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"


class SluiceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._target: dict[QueueKey, int] | None = None  # Trigger.AvailableNow: never read past these
        self._snapshot: Snapshot = Snapshot()
        self._planned_end: dict[QueueKey, int] | None = None
        self._admission = AdmissionControl(options)
        self._committer = GroupCommitter(options.consumer_group)
        self._initial: dict | None = None  # initialOffset's answer, kept for Spark's second question
        # cluster: queues showing less than the query read, and since when (monotonic s): held, not lost, while a
        # failover may explain it (_settling)
        self._behind_since: dict[QueueKey, float] = {}

    # ------------------------------------------------------------------------------------------------ offsets

    @explains_refusals
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

    @explains_refusals
    def prepareForTriggerAvailableNow(self) -> None:
        link = link_for(self.options)
        snap = snapshot(link, current_topics(self.options, link), tolerate_gone=self.options.cluster)
        for broker, why in sorted(snap.gone.items()):  # what it holds is not available now: not part of the target
            broker_gone(self.options, broker, f"does not answer ({why})", [])
        self._target = {k: hi for k, (_, hi) in snap.items()}
        log.info("Trigger.AvailableNow: reading up to %s", self._target)

    @explains_refusals
    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        link = link_for(self.options)
        begin = self._parse(start)
        if self._planned_end is not None and begin == self._planned_end:
            self._committer.commit(link, begin)  # the batch this reader planned last is done (module docstring)
        topics = sorted(set(current_topics(self.options, link)) | {t for t, _, _ in begin})
        self._snapshot = snap = snapshot(link, topics, tolerate_gone=self.options.cluster)
        begin = self._skip_lost(begin, snap, link)
        latest = {k: max(hi, begin.get(k, hi)) for k, (_, hi) in snap.items()}  # a queue held behind: nothing new
        if self._target is not None:
            latest = {k: min(hi, self._target[k]) for k, hi in latest.items() if k in self._target}
        # Queues that appeared since the last trigger (new topic, more queues, a broker that joined) start at their
        # earliest offset.
        base = {k: begin.get(k, snap[k][0]) for k in latest}
        for key, lo in sorted(base.items()):
            if key not in begin and lo > 0:  # a queue starts at 0: its first messages expired unread
                data_lost(self.options, key, 0, f"from {lo} (a queue new to this query)", lo)
        end = self._admission.end_offsets(
            base, latest, limit, self._probe_bytes, available_now=self._target is not None
        )
        return self._json({**begin, **end})

    def reportLatestOffset(self) -> dict | None:
        if not self._snapshot:
            return None
        return self._json({k: hi for k, (_, hi) in self._snapshot.items()})

    @explains_refusals
    def commit(self, end: dict) -> None:
        self._committer.commit(link_for(self.options), self._parse(end))

    # ------------------------------------------------------------------------------------------------ planning

    @explains_refusals
    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, finish = self._parse(start), self._parse(end)
        missing = [k for k in finish if k not in begin]
        if missing and not all(k in self._snapshot for k in missing):
            link = link_for(self.options)
            more = snapshot(link, sorted({t for t, _, _ in missing}), tolerate_gone=self.options.cluster)
            self._snapshot = Snapshot({**self._snapshot, **more}, self._snapshot.gone)
        ranges = [
            OffsetRange(
                t, q, begin[(t, b, q)] if (t, b, q) in begin else self._snapshot.get((t, b, q), (0, 0))[0], e, b
            )
            for (t, b, q), e in finish.items()
        ]
        parts = split_ranges(
            [r for r in ranges if r.end > r.start],
            self.options.min_partitions,
            self.options.max_messages_per_partition,
        )
        self._planned_end = finish
        return [SluicePartition(r.topic, r.queue_id, r.start, r.end, r.broker) for r in parts]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SluicePartition), type(partition)
        return read_partition(self.options, partition)

    # ------------------------------------------------------------------------------------------------ stop

    def stop(self) -> None:
        """The query ended: close this reader's channels to its brokers; then, when Spark has already hung up on the
        runner process this runs in, end that process at once (``_spark_hung_up`` says when).

        PySpark's runner (pyspark/sql/streaming/python_streaming_source_runner.py, 4.3.0) has no stop request: it
        calls ``stop()`` from the ``finally`` around its request loop, so only as that loop unwinds, with the reason
        in flight. Stopping a query interrupts the query's thread, and an interrupted thread's I/O on the runner's
        NIO channel closes it, so the runner may find its socket closed before Spark's SIGTERM arrives (or with none
        to come, when the query stopped while Spark waited for the reader to be created): ``read_int`` (line 265)
        raises EOFError, the runner's ``except BaseException`` writes the error to the closed socket and flushes it
        (line 299), which raises again outside any handler, and Python prints the chained traceback to the driver's
        stderr unless a SIGTERM cuts it short. Exiting here, with nothing left to tell a Spark that has gone, ends the
        process before that path runs. A reader method's own error still takes it, so that Spark reports it.
        """
        try:
            release_link(self.options)
        finally:
            if _spark_hung_up():
                for stream in (sys.stdout, sys.stderr):
                    with contextlib.suppress(OSError, ValueError):  # the pipe to Spark may be gone as well
                        stream.flush()
                os._exit(0)

    # ------------------------------------------------------------------------------------------------ helpers

    def _parse(self, offset: Mapping) -> dict[QueueKey, int]:
        return dict(SourceOffset.from_json(self.options.broker_name, offset).positions)

    def _json(self, positions: Mapping[QueueKey, int]) -> dict:
        return SourceOffset(positions).to_json()

    def _skip_lost(self, begin: dict[QueueKey, int], snap: Snapshot, link: BrokerLink) -> dict[QueueKey, int]:
        """Queues whose next offset expired or that vanished: fail, or (failOnDataLoss=false) move past the loss.
        Queues of a broker that is gone (left the cluster, or does not answer): fail, or hold their offsets."""
        out = dict(begin)
        gone, unseen = self._missing_in_cluster([k for k in begin if k not in snap], snap, link)
        for broker, why in sorted(gone.items()):
            broker_gone(self.options, broker, why, sorted(k for k in begin if k[1] == broker and k not in snap))
        for key, off in sorted(begin.items()):
            lo_hi = snap.get(key)
            if lo_hi is None and (key[1] in gone or key in unseen):
                continue  # held where it is until its broker answers again, or the route shows the queue
            if lo_hi is None:
                data_lost(self.options, key, off, "none: the queue no longer exists", 0)
                del out[key]
            elif off < lo_hi[0]:
                data_lost(self.options, key, off, f"from {lo_hi[0]}", lo_hi[0] - off)
                out[key] = lo_hi[0]
            elif off > lo_hi[1]:
                if self._settling(key, off, lo_hi[1]):
                    continue  # held where it is: nothing is planned for it until it shows what was read
                data_lost(self.options, key, off, f"up to {lo_hi[1]} (the queue went back)", 0)
                out[key] = lo_hi[1]
            else:
                self._behind_since.pop(key, None)
        return out

    def _settling(self, key: QueueKey, read_to: int, shown: int) -> bool:
        """In a cluster, a queue that shows less than the query already read is held for up to the failover wait
        before it counts as gone back: during a failover the replica that answers (one just elected, or one serving
        reads while its group has no master) can show less than was confirmed until the in-sync replicas report
        to it (cluster_link.py's SHORT_TAIL_RECHECK_S, the executors' side of the same wait)."""
        if not self.options.cluster:
            return False
        since = self._behind_since.setdefault(key, time.monotonic())
        if time.monotonic() - since >= FAILOVER_WAIT_S:
            del self._behind_since[key]
            return False
        log.warning("%s shows offsets up to %d, below %d already read; held while its group may be failing over",
                    describe(key), shown, read_to)
        return True

    def _missing_in_cluster(
        self, missing: list[QueueKey], snap: Snapshot, link: BrokerLink
    ) -> tuple[dict[str, str], set[QueueKey]]:
        """Why queues the query reads are missing from a cluster's snapshot: (brokers that are gone, with why:
        not answering, or not listed by the name servers; queues their broker still reports, which the route
        this client cached did not show yet). Each broker is asked itself, never judged by a cached route: a
        broker that came back had its queues dropped as lost, and read again from 0. What is left (a broker
        that answers without the queue) lost the queue, not the broker: ordinary data loss."""
        if not missing or not self.options.cluster:
            return {}, set()
        gone: dict[str, str] = {}
        unseen: set[QueueKey] = set()
        for broker in sorted({b for _, b, _ in missing}):
            if broker in snap.gone:
                gone[broker] = f"does not answer ({snap.gone[broker]})"
                continue
            for topic in sorted({t for t, b, _ in missing if b == broker}):
                try:
                    reported = link.queues_on(broker, topic)
                except ServiceNotAvailableError as e:
                    gone[broker] = f"does not answer ({e.message})"
                    break
                if reported is None:
                    gone[broker] = ("left the cluster: no name server lists it (it was stopped, or its registration "
                                    "expired)")
                    break
                unseen |= {k for k in missing if k[0] == topic and k[1] == broker and k[2] in reported}
        return gone, unseen

    def _probe_bytes(self, key: QueueKey, start: int, cap: int, budget: int) -> int:
        topic, broker, queue_id = key
        return probe_bytes(link_for(self.options), self.options, topic, queue_id, start, cap, budget, broker=broker)


def _spark_hung_up() -> bool:
    """True only in PySpark's streaming-source runner process (never in a user's driver or an executor, where an
    exit would end the program or the worker), while it unwinds because its socket to Spark is closed: EOFError
    from reading it, or a ConnectionError from writing to it, raised by the runner's own I/O rather than by a
    method of this package, whose errors Spark must still be told."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is None or spec.name != SOURCE_RUNNER_MODULE:
        return False
    exc = sys.exc_info()[1]  # inside the runner's ``finally``: the exception that ended its loop
    if not isinstance(exc, (EOFError, ConnectionError)):
        return False
    frame = exc.__traceback__
    while frame is not None:
        if frame.tb_frame.f_globals.get("__name__", "").partition(".")[0] == __package__:
            return False
        frame = frame.tb_next
    return True


def probe_bytes(
    link: BrokerLink, options: SourceOptions, topic: str, queue_id: int, start: int, cap: int, budget: int,
    broker: str = "",
) -> int:
    """The end offset (exclusive, <= cap) such that the stored entries of [start, end) fit in ``budget`` bytes.
    ``broker``: the queue's ("" for the one broker of option 'endpoints')."""
    key = (topic, broker or options.broker_name or "", queue_id)
    at, used = start, 0
    while at < cap:
        try:
            # as every driver-side call: a broker restart during planning is ridden out, not fatal
            r = link.pull_raw(key, at, max_msgs=min(options.pull_batch_size, cap - at), tags=options.tag_expression)
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
