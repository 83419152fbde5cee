"""The ``sluice`` sink: Arrow batches -> SendBatch, exactly once through the broker's batch transactions.

Exactly-once protocol (``deliveryGuarantee=exactly-once``, the default):

* One transaction per (query, micro-batch, query run): ``spark:<queryId>:<batchId>:<runId>``. Tasks learn the ids
  from the local properties Spark gives every task of a micro-batch (``sql.streaming.queryId``,
  ``streaming.sql.batchId``, and the job group, which Spark sets to the run id). A new run of the query (a restart
  from the checkpoint) gets a new run id, so a transaction an earlier run rolled back is never reused.
* A task first asks whether any run already committed this (query, batch): Spark re-runs the last batch after a
  crash between the sink's commit and its own commit log, and those rows must not be sent again. Otherwise it sends
  its rows into the transaction under the task attempt's id; the broker stores each row once, in its queue, unseen
  until the commit (broker/semantics/txn_in_place.py). The task reports the attempt, message and byte counts in its
  commit message.
* The driver's ``commit(messages, batchId)`` ends the transaction with COMMIT, naming the attempts that succeeded:
  rows of failed or speculative attempts are rolled back, so no row is committed twice. The broker makes that one
  atomic decision (finished by its recovery after a crash). Then it rolls back the query's older open transactions,
  which only a crashed earlier run can have left. ``abort`` rolls the transaction back.

In a cluster (option ``namesrv``) rows go to the queues of every broker that holds the topic, and a batch's
transaction spans brokers: its one decision is kept by a coordinator broker, and the protocol that keeps a batch
all-or-nothing across brokers, a dying driver included, is in cluster_commit.py.

``at-least-once`` sends plain batches: a batch re-run after a crash is sent again.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from broker.client import Admin, Producer
from broker.client.route import MessageQueue
from broker.errors import (
    BrokerError,
    BrokerUnreachableError,
    FlushDiskTimeoutError,
    FlushSlaveTimeoutError,
    MessageIllegalError,
    ServiceNotAvailableError,
    SystemBusyError,
)
from broker.format.transaction_codec import MAX_ATTEMPTS_PROPERTY_CHARS
from broker.format.txn_decision import Share
from connector.arrow_encoder import EncodedChunk, RowEncoder, check_columns
from connector.auth_options import explains_refusals, refusals_explained
from connector.cluster_commit import ClusterCommit, choose_coordinator, live_masters, query_prefix
from connector.failover import nothing_stored, until_master
from connector.sink_options import SinkOptions

log = logging.getLogger(__name__)

# The commit call answers once every message of the batch is re-stored in its topic (1M messages: 4-8 s here);
# one that timed out would fail the query though the broker finishes the commit.
COMMIT_TIMEOUT_S = 600.0
ADMIN_TIMEOUT_S = 30.0  # the sink's other calls to a broker (listing and rolling back transactions)
# An unanswered call inside a transaction sends the task's rows again under a new attempt; more than this many in
# one task is not a failover but a broker that keeps failing, and the task fails (Spark may retry it).
MAX_SLICE_RESENDS = 3
# Rows a task holds to send again (Arrow bytes): a larger slice is not held, so an unanswered call of it fails the
# task (Spark retries it under a new attempt).
MAX_KEPT_SLICE_BYTES = 256 << 20


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    transaction_id: str | None
    attempt: str
    messages: int
    bytes: int
    skipped: bool = False  # the batch was already committed by an earlier run: nothing sent
    per_broker: dict[str, int] = field(default_factory=dict)  # a cluster: messages sent to each broker
    earlier: str | None = None  # a cluster, skipped: the earlier run's transaction that committed the batch


def _task_ids() -> tuple[str, int, str, str]:
    """(query id, batch id, run id, attempt id) of the running streaming task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise BrokerError("the sluice sink's write() must run inside a Spark task")
    query_id = ctx.getLocalProperty("sql.streaming.queryId") or ""
    batch_id = ctx.getLocalProperty("streaming.sql.batchId")
    run_id = ctx.getLocalProperty("spark.jobGroup.id") or uuid.uuid4().hex
    if not query_id or batch_id is None:
        raise BrokerError("no streaming query id / batch id in the task's local properties; is this a stream write?")
    return query_id, int(batch_id), run_id, _attempt_id(ctx)


def _attempt_id(ctx: Any) -> str:
    """The task attempt's id, unique within the application (so within the run a transaction id names), and
    short: the commit lists every attempt in one property of at most MAX_ATTEMPTS_PROPERTY_CHARS."""
    return str(ctx.taskAttemptId()) if ctx is not None else uuid.uuid4().hex


def _check_attempts(attempts: list[str], what: str) -> None:
    """Refuse, before the broker does, a commit whose attempt list is over the broker's property limit."""
    if len(",".join(attempts)) > MAX_ATTEMPTS_PROPERTY_CHARS:
        raise BrokerError(
            f"{what}: {len(attempts)} task attempts are too many for one commit ({MAX_ATTEMPTS_PROPERTY_CHARS} "
            f"characters of attempt ids); write with fewer partitions (coalesce) or smaller micro-batches"
        )


_STRING = StringType()
# column -> (what it must be, the Spark types that are that, a cast that makes it so)
_COLUMN_TYPES: dict[str, tuple[str, tuple[DataType, ...], str]] = {
    "body": ("binary or string", (BinaryType(), _STRING), ".cast('binary')"),
    "topic": ("string", (_STRING,), ".cast('string')"),
    "tags": ("string", (_STRING,), ".cast('string')"),
    "keys": (
        "array<string> or a space-separated string",
        (ArrayType(_STRING, True), ArrayType(_STRING, False), _STRING),
        ".cast('array<string>')",
    ),
    "properties": (
        "map<string,string>",
        (MapType(_STRING, _STRING, True), MapType(_STRING, _STRING, False)),
        ".cast('map<string,string>')",
    ),
    "sharding_key": ("string", (_STRING,), ".cast('string')"),
    "queue_id": ("an integer type", (ByteType(), ShortType(), IntegerType(), LongType()), ".cast('int')"),
}


def check_column_types(schema: StructType) -> None:
    """At query start, the sink's columns must have the types the encoder reads: a long sharding_key or a string
    queue_id would otherwise fail every task with a bare TypeError naming neither column nor row."""
    for f in schema.fields:
        wanted = _COLUMN_TYPES.get(f.name)
        if wanted is not None and f.dataType not in wanted[1]:
            what, _, cast = wanted
            raise MessageIllegalError(
                f"column {f.name!r} is {f.dataType.simpleString()}; the sluice sink needs {what} there "
                f"(e.g. col({f.name!r}){cast})"
            )


def _admin(opts: SinkOptions, timeout_s: float = ADMIN_TIMEOUT_S) -> Admin:
    return Admin(opts.endpoints, timeout_s=timeout_s, **opts.tls.client_args(), **opts.auth.client_args())


def _cluster_commit(namesrv: str, opts: SinkOptions) -> ClusterCommit:
    return ClusterCommit(namesrv, opts.tls, opts.auth)


class _KeptRows:
    """A task's rows as Spark hands them, kept (up to MAX_KEPT_SLICE_BYTES) so that they can be sent again under a
    new attempt when a call inside the transaction got no answer."""

    def __init__(self, batches: Iterator[pa.RecordBatch], keep: bool) -> None:
        self.kept: list[pa.RecordBatch] = []
        self.kept_bytes = 0
        self.whole = keep  # every row read so far is in ``kept``
        self._rest = self._read(batches)

    def _read(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if self.whole:
                self.kept.append(batch)
                self.kept_bytes += batch.nbytes
                if self.kept_bytes > MAX_KEPT_SLICE_BYTES:
                    self.whole, self.kept = False, []
            yield batch

    def rows(self) -> Iterator[pa.RecordBatch]:
        """From the first row: those read so far, then the rest as Spark gives them."""
        return itertools.chain(list(self.kept), self._rest)


def _outcome_unknown(e: BrokerError) -> bool:
    """A call of a transaction that may or may not have stored its rows for good (no answer; or stored, but not
    confirmed by the master's replicas or by its disk in time)."""
    unconfirmed = isinstance(e, (FlushSlaveTimeoutError, FlushDiskTimeoutError))
    return (isinstance(e, BrokerUnreachableError) and e.request_sent) or unconfirmed


def _send_all(
    opts: SinkOptions, batches: Iterator[pa.RecordBatch], txn_id: str | None, attempt: str,
    coordinator: str | None = None,
) -> tuple[int, int, dict[str, int], str]:
    """Encode and send every row; returns (messages, bytes, messages per broker, the attempt that sent them).

    Inside a transaction, a call without an answer (its rows may be stored, or not) sends the whole slice again
    under a new attempt id (``<attempt>.<n>``): the commit names only that attempt, so rows the earlier one may
    have stored are rolled back, never committed twice. Raises on any other failure, naming the row.
    ``coordinator``: the broker that decides ``txn_id`` (a cluster), named in every half."""
    rows = _KeptRows(batches, keep=txn_id is not None)
    for resend in range(MAX_SLICE_RESENDS + 1):
        sent_as = attempt if resend == 0 else f"{attempt}.{resend}"
        try:
            n, nbytes, per = _send_slice(opts, rows.rows(), txn_id, sent_as, coordinator)
            return n, nbytes, per, sent_as
        except BrokerError as e:
            if txn_id is None or not _outcome_unknown(e) or not rows.whole or resend == MAX_SLICE_RESENDS:
                raise
            log.warning("a call of transaction %s got no answer (%s); sending the task's rows again as attempt %s",
                        txn_id, e.message, f"{attempt}.{resend + 1}")
    raise AssertionError("unreachable")


def _send_slice(
    opts: SinkOptions, batches: Iterator[pa.RecordBatch], txn_id: str | None, attempt: str, coordinator: str | None,
) -> tuple[int, int, dict[str, int]]:
    producer = Producer(opts.endpoints, group=opts.producer_group, namesrv=opts.namesrv, **opts.tls.client_args(),
                        **opts.auth.client_args())
    router = producer.router if opts.namesrv else None

    def queues(topic: str) -> list[MessageQueue]:
        # the writable queues of a group electing a new master are none for a moment: looked up again meanwhile
        return until_master(lambda: producer.queues(topic), router, f"the writable queues of topic {topic!r}",
                            topic=topic)

    encoder = RowEncoder(
        default_topic=opts.topic,
        queue_count=None if opts.namesrv else producer.queue_count,
        queues=queues if opts.namesrv else None,
        max_message_size=opts.max_message_size,
        batch_messages=opts.batch_messages,
        batch_bytes=opts.batch_bytes,
    )
    nbytes = rows = 0
    per_broker: dict[str, int] = {}
    inflight: list[Future[EncodedChunk]] = []
    window = opts.max_inflight

    def done(chunk: EncodedChunk) -> None:
        per_broker[chunk.broker] = per_broker.get(chunk.broker, 0) + chunk.count

    try:
        with ThreadPoolExecutor(max_workers=opts.max_inflight, thread_name_prefix="sluice-sink") as pool:
            for batch in batches:
                check_columns(batch.schema.names, opts.ignore_extra_columns, cluster=opts.namesrv is not None)
                if {"sharding_key", "queue_id"} & set(batch.schema.names):
                    window = 1  # concurrent calls could land out of order: keyed rows keep their order per queue
                for chunk in encoder.encode(batch, first_row=rows):
                    if len(inflight) >= window:
                        done(inflight.pop(0).result())
                    inflight.append(pool.submit(_send_chunk, producer, opts, chunk, txn_id, attempt, coordinator))
                    nbytes += len(chunk.buffer)
                rows += batch.num_rows
            for f in inflight:
                done(f.result())
    finally:
        producer.close()
    return sum(per_broker.values()), nbytes, per_broker


def _send_chunk(
    producer: Producer, opts: SinkOptions, chunk: EncodedChunk, txn_id: str | None, task_attempt: str,
    coordinator: str | None,
) -> EncodedChunk:
    """One SendBatch. A call that certainly stored nothing (NOT_MASTER, a refused connection, no live master) is
    made again while a master moves (failover.py). A busy broker, and for plain sends an unanswered call, are
    retried ``sendRetries`` times. Inside a transaction an unanswered call is not: ``_send_all`` sends the slice
    again under a new attempt."""
    # In a cluster the broker is found through the route of a topic the chunk writes (any: each routes to it).
    topic = next(iter(chunk.topics)) if opts.namesrv else None
    retries = 0

    def send() -> EncodedChunk:
        producer.send_encoded(chunk.buffer, chunk.count, txn_id, attempt=task_attempt if txn_id else "",
                              coordinator=(coordinator or "") if txn_id else "", broker_name=chunk.broker,
                              topic=topic)
        return chunk

    def retry_if(e: BrokerError) -> bool:
        nonlocal retries
        if nothing_stored(e):
            return True
        if isinstance(e, SystemBusyError) or (txn_id is None and isinstance(e, ServiceNotAvailableError)):
            retries += 1  # plain sends may repeat a batch (at-least-once)
            return retries <= opts.send_retries
        return False

    what = f"SendBatch of {chunk.count} rows to broker {chunk.broker!r}"
    return until_master(send, producer.router if opts.namesrv else None, what, retry_if=retry_if, topic=topic)


def _shares(done: list[SinkCommitMessage], txn_id: str, what: str) -> list[Share]:
    """Each broker that received rows of ``txn_id``: the attempts that wrote there and their message count."""
    brokers = sorted({b for m in done if m.transaction_id == txn_id for b, n in m.per_broker.items() if n})
    shares = []
    for broker in brokers:
        wrote = [m for m in done if m.transaction_id == txn_id and m.per_broker.get(broker)]
        attempts = sorted({m.attempt for m in wrote})
        _check_attempts(attempts, f"{what} (broker {broker})")
        shares.append(Share(broker, tuple(attempts), sum(m.per_broker[broker] for m in wrote)))
    return shares


class SluiceStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        check_columns(schema.names, opts.ignore_extra_columns, opts.topic, cluster=opts.namesrv is not None)
        check_column_types(schema)
        self.options = opts
        # A cluster's masters when the query (re)starts: every task of this run chooses its batches' coordinator
        # among the same brokers (cluster_commit.py).
        self.masters: list[str] = []
        if opts.namesrv and opts.exactly_once:
            with refusals_explained(opts):
                self.masters = live_masters(opts.namesrv, opts.tls, opts.auth)
            choose_coordinator("", self.masters)  # no live master at all: refused now, not in every task

    @explains_refusals
    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        query_id, batch_id, run_id, attempt = _task_ids()
        if not self.options.exactly_once:
            n, b, per, _ = _send_all(self.options, iterator, None, attempt)
            return SinkCommitMessage(None, attempt, n, b, per_broker=per)
        prefix = f"spark:{query_id}:{batch_id}:"
        if self.options.namesrv is not None:
            return self._write_to_cluster(self.options.namesrv, iterator, prefix, query_id, run_id, attempt)
        with _admin(self.options) as admin:
            if any(t.status == "COMMITTED" for t in admin.list_transactions(prefix)):
                log.info(
                    "batch %d of query %s was committed by an earlier run; not sending it again", batch_id, query_id
                )
                return SinkCommitMessage(None, attempt, 0, 0, skipped=True)
        txn_id = prefix + run_id
        n, b, _, attempt = _send_all(self.options, iterator, txn_id, attempt)
        return SinkCommitMessage(txn_id, attempt, n, b)

    def _write_to_cluster(
        self, namesrv: str, iterator: Iterator[pa.RecordBatch], prefix: str, query_id: str, run_id: str, attempt: str
    ) -> SinkCommitMessage:
        coordinator = choose_coordinator(query_id, self.masters)
        txn_id = f"{prefix}{run_id}@{coordinator}"
        with _cluster_commit(namesrv, self.options) as cc:
            earlier = cc.earlier_commit(prefix, own=txn_id)
        if earlier is not None:
            log.info("%s was committed by an earlier run (%s); not sending it again", prefix, earlier)
            return SinkCommitMessage(None, attempt, 0, 0, skipped=True, earlier=earlier)
        n, b, per, attempt = _send_all(self.options, iterator, txn_id, attempt, coordinator)
        return SinkCommitMessage(txn_id, attempt, n, b, per_broker=per)

    @explains_refusals
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        done = [m for m in messages if isinstance(m, SinkCommitMessage)]
        total, nbytes = sum(m.messages for m in done), sum(m.bytes for m in done)
        txn_ids = {m.transaction_id for m in done if m.transaction_id is not None}
        if len(txn_ids) > 1:
            raise BrokerError(f"batch {batchId}: tasks wrote under different transactions {sorted(txn_ids)}")
        if self.options.namesrv is not None and self.options.exactly_once:
            self._commit_in_cluster(self.options.namesrv, done, txn_ids, batchId)
        elif self.options.exactly_once:
            self._commit_on_broker(done, txn_ids, batchId)
        log.info("sluice sink batch %d: %d messages, %d bytes committed", batchId, total, nbytes)

    def _commit_on_broker(self, done: list[SinkCommitMessage], txn_ids: set[str], batchId: int) -> None:
        with _admin(self.options, COMMIT_TIMEOUT_S) as admin:
            for txn_id in txn_ids:
                attempts = [m.attempt for m in done if m.transaction_id == txn_id]
                _check_attempts(attempts, f"batch {batchId}")
                sent = sum(m.messages for m in done if m.transaction_id == txn_id)
                # record_unknown: a batch whose tasks sent nothing has no halves, and its empty commit is recorded
                outcome = admin.end_transaction(txn_id, commit=True, committed_attempts=attempts,
                                                expected_messages=sent, record_unknown=True,
                                                producer_group=self.options.producer_group)
                if outcome != "COMMITTED":
                    raise BrokerError(f"batch {batchId}: transaction {txn_id} ended as {outcome}, not COMMITTED")
                # Open ones of this query can only be a crashed earlier run's (this batch's is committed now).
                # One call ending only open transactions, not a listing of every outcome the broker remembers.
                admin.end_transactions(txn_id.rsplit(":", 2)[0] + ":", commit=False)

    def _commit_in_cluster(
        self, namesrv: str, done: list[SinkCommitMessage], txn_ids: set[str], batchId: int
    ) -> None:
        earlier = {m.earlier for m in done if m.earlier}
        if len(earlier) > 1 or (earlier and txn_ids):
            raise BrokerError(
                f"batch {batchId}: tasks disagree on whether an earlier run committed it ({sorted(earlier)}, "
                f"{sorted(txn_ids)}); the batch is not committed"
            )
        what = f"batch {batchId}"
        with _cluster_commit(namesrv, self.options) as cc:
            if earlier:
                txn_id = earlier.pop()
                cc.finish_earlier(txn_id, what)
            elif txn_ids:
                txn_id = next(iter(txn_ids))
                shares = _shares(done, txn_id, what)
                if shares:
                    cc.commit(txn_id, shares, what)
            else:
                return
            cc.resolve_leftovers(query_prefix(txn_id))

    @explains_refusals
    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        txn_ids = {m.transaction_id for m in messages if isinstance(m, SinkCommitMessage) and m.transaction_id}
        if self.options.namesrv is not None:
            with _cluster_commit(self.options.namesrv, self.options) as cc:  # fences ABORT unless a decision stands
                for prefix in sorted({query_prefix(t) for t in txn_ids if t}):
                    cc.resolve_leftovers(prefix)
        else:
            with _admin(self.options) as admin:
                for txn_id in txn_ids:  # recorded even before any half arrived: a straggling task's are refused
                    admin.end_transaction(txn_id, commit=False, record_unknown=True,
                                          producer_group=self.options.producer_group)
        log.warning("sluice sink batch %d aborted; rolled back %s", batchId, sorted(t for t in txn_ids if t))


class SluiceBatchWriter(DataSourceArrowWriter):
    """``df.write.format("sluice")``: one transaction for the whole job (exactly-once) or plain sends."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        check_columns(schema.names, opts.ignore_extra_columns, opts.topic, cluster=opts.namesrv is not None)
        check_column_types(schema)
        self.options = opts
        self.transaction_id: str | None = None
        self.coordinator: str | None = None
        if opts.exactly_once:
            job = uuid.uuid4().hex
            self.transaction_id = f"spark-batch:{job}"
            if opts.namesrv is not None:
                with refusals_explained(opts):
                    self.coordinator = choose_coordinator(job, live_masters(opts.namesrv, opts.tls, opts.auth))
                self.transaction_id += f"@{self.coordinator}"

    @explains_refusals
    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        from pyspark import TaskContext

        attempt = _attempt_id(TaskContext.get())
        n, b, per, attempt = _send_all(self.options, iterator, self.transaction_id, attempt, self.coordinator)
        return SinkCommitMessage(self.transaction_id, attempt, n, b, per_broker=per)

    @explains_refusals
    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, SinkCommitMessage)]
        if self.transaction_id and self.options.namesrv is not None:
            with _cluster_commit(self.options.namesrv, self.options) as cc:
                shares = _shares(done, self.transaction_id, "batch write")
                if shares:
                    cc.commit(self.transaction_id, shares, "batch write")
                cc.resolve_leftovers(self.transaction_id)  # halves of failed attempts on brokers no share names
        elif self.transaction_id:
            attempts = [m.attempt for m in done]
            _check_attempts(attempts, "batch write")
            with _admin(self.options, COMMIT_TIMEOUT_S) as admin:
                outcome = admin.end_transaction(self.transaction_id, commit=True, committed_attempts=attempts,
                                                expected_messages=sum(m.messages for m in done),
                                                record_unknown=True,
                                                producer_group=self.options.producer_group)
            if outcome != "COMMITTED":
                raise BrokerError(f"transaction {self.transaction_id} ended as {outcome}, not COMMITTED")
        log.info("sluice sink: %d messages committed", sum(m.messages for m in done))

    @explains_refusals
    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.transaction_id and self.options.namesrv is not None:
            with _cluster_commit(self.options.namesrv, self.options) as cc:
                cc.resolve_leftovers(self.transaction_id)
        elif self.transaction_id:
            with _admin(self.options) as admin:
                admin.end_transaction(self.transaction_id, commit=False, record_unknown=True,
                                      producer_group=self.options.producer_group)


__all__ = ["MessageIllegalError", "SinkCommitMessage", "SluiceBatchWriter", "SluiceStreamWriter"]
