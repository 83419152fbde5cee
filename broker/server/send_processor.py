"""Sends: one message with separate fields, or a client-encoded batch buffer appended whole.

Every batch, plain or transactional, is validated once as the client sent it (``_validated``: the store's scan,
whose result the append reuses, and ``semantics.send_checks``); then its topics and queue ids are checked against
the topic table (unknown topics are auto-created, within the table's bounds, once the batch is stored). Nothing
is written unless every entry is acceptable.
"""

from __future__ import annotations

import itertools
import time
from contextlib import ExitStack
from dataclasses import dataclass

from broker.auth.operations import Operation, authorize
from broker.errors import (
    BrokerError,
    FlushDiskTimeoutError,
    InvalidArgumentError,
    MessageIllegalError,
    ResponseCode,
    ServiceNotAvailableError,
)
from broker.format.batch import SmallBatch, ValidatedBatch, batch_properties, queue_ranges
from broker.format.message import ENTRY_HEADER, I32, validate_topic
from broker.format.send_checks import check_entries, check_message
from broker.format.system_topics import is_system_topic
from broker.format.transaction_codec import ATTEMPT, is_half_batch, raw_property
from broker.semantics import ScheduleMessageService, TransactionService
from broker.semantics.timer import TimerService
from broker.server.metrics import BrokerMetrics
from broker.server.topic_config import TopicConfigManager
from broker.store import MessageStore, PutStatus
from broker.store.store_results import CANNOT_WRITE_NOW, PutResult

# Put statuses that mean "stored, but durability not confirmed": answered with a SendStatus, not an error.
STORED_STATUSES = {PutStatus.PUT_OK: "SEND_OK", PutStatus.FLUSH_DISK_TIMEOUT: "FLUSH_DISK_TIMEOUT"}


@dataclass
class SendOutcome:
    status: str  # a SendStatus name
    result: PutResult
    transaction_id: str = ""  # half messages: the transaction they joined


def raise_for_put(result: PutResult, what: str) -> None:
    """Turn a failed PutResult into the matching BrokerError (stored outcomes pass through). A store that cannot
    write (shut down, disk full, a file it cannot create, an I/O error that made it read-only) is
    SERVICE_NOT_AVAILABLE, not INTERNAL: none of these is a broker bug, and the sender should retry elsewhere or
    later."""
    if result.status in STORED_STATUSES:
        return
    detail = result.error or result.status.value
    if result.status in (PutStatus.MESSAGE_ILLEGAL, PutStatus.PROPERTIES_SIZE_EXCEEDED):
        raise MessageIllegalError(f"{what} refused, nothing stored: {detail}")
    if result.status in CANNOT_WRITE_NOW:
        raise ServiceNotAvailableError(f"{what} refused, nothing stored: {detail}; retry later or free disk space")
    if result.status is PutStatus.FLUSH_DISK_TIMEOUT:
        raise FlushDiskTimeoutError(detail)
    raise BrokerError(f"{what} failed: {detail}", ResponseCode.SYSTEM_ERROR)


def _names_its_attempt(buffer: bytes, attempt: str) -> bool:
    """A writer that names its attempt in each message (TRAN_ATTEMPT, as half messages carry it) rather than in
    the call: its batch is stored as half messages, which keep the property per message and are committed by it.
    The first entry speaks for the batch (a writer sends one attempt per call)."""
    if attempt or len(buffer) < ENTRY_HEADER.size:
        return False
    return raw_property(buffer[: I32.unpack_from(buffer, 0)[0]], ATTEMPT) is not None


def _max_queue_ids(ranges: dict[str, tuple[int, int]]) -> dict[str, int]:
    return {topic: max_queue_id for topic, (_, max_queue_id) in ranges.items()}


class SendProcessor:
    def __init__(
        self, store: MessageStore, topics: TopicConfigManager, metrics: BrokerMetrics, *, sync_flush: bool = False
    ) -> None:
        self.store = store
        self.sync_flush = sync_flush
        self.topics = topics
        self.metrics = metrics
        self._round_robin = itertools.count()
        # Broker semantics (set by the controller): delay-level rewriting and transactional half messages.
        self.schedule: ScheduleMessageService | None = None
        self.transactions: TransactionService | None = None
        self.timers: TimerService | None = None  # TIMER_DELIVER_MS: delivery at a time

    def send_message(
        self, topic: str, queue_id: int, body: bytes, properties: dict[str, str], *, flag: int = 0,
        sys_flag: int = 0, born_timestamp: int = 0, reconsume_times: int = 0, producer_group: str = "",
        transactional: bool = False, transaction_id: str = "",
    ) -> SendOutcome:
        authorize(Operation.PUBLISH, topics=[topic])  # a transaction's group: decided by the transaction service
        validate_topic(topic)
        if is_system_topic(topic):
            raise MessageIllegalError(f"topic {topic!r} is a system topic written by the broker only; send elsewhere")
        check_message(sys_flag, reconsume_times, properties)  # the checks every send path makes (send_checks)
        if queue_id < 0:
            queue_id = next(self._round_robin) % self.topics.writable_queue_nums(topic)
        self.topics.check_write(topic, queue_id, queue_id)  # creates nothing: a refused send leaves no topic
        started = time.perf_counter()
        kwargs = {"flag": flag, "sys_flag": sys_flag, "born_timestamp": born_timestamp or int(time.time() * 1000),
                  "reconsume_times": reconsume_times}
        with self.topics.reserving([topic]):
            if transactional or transaction_id:
                if self.transactions is None:
                    raise ServiceNotAvailableError("transactions are not enabled on this broker")
                result, txn_id = self.transactions.prepare_half(
                    topic, queue_id, body, properties, producer_group, txn_id=transaction_id or None, **kwargs
                )
                return self._finish(result, started, "half message", txn_id, created={topic: queue_id})
            real_topic, real_queue_id = topic, queue_id
            if self.timers is not None:
                topic, queue_id, properties = self.timers.rewrite(topic, queue_id, properties)
            if self.schedule is not None and topic == real_topic:
                topic, queue_id, properties = self.schedule.rewrite_for_delay(topic, queue_id, properties)
            result = self.store.put_message(topic, queue_id, body, properties, **kwargs)  # type: ignore[arg-type]
            return self._finish(result, started, "message", created={real_topic: real_queue_id})

    def _validated(self, buffer: bytes, count: int) -> tuple[SmallBatch | ValidatedBatch, dict[str, tuple[int, int]]]:
        """The one validation of a SendBatch buffer, plain or transactional, as the client sent it: the store's
        (framing, sizes, CRCs, queue ids, topic names; one scan, which the append then uses), the declared count,
        and send_checks. Returns it with each topic's (lowest, highest) queue id."""
        try:
            validated = self.store.validate_batch(buffer)
        except MessageIllegalError as e:
            raise MessageIllegalError(f"SendBatch refused, nothing stored: {e.message}") from None
        entries, ranges = queue_ranges(validated)
        if count and count != entries:
            raise MessageIllegalError(
                f"SendBatch declares {count} messages but the buffer holds {entries}; nothing stored"
            )
        check_entries(validated)
        return validated, ranges

    def send_batch(
        self, buffer: bytes, count: int, transaction_id: str = "", producer_group: str = "", *, attempt: str = "",
        coordinator: str = "",
    ) -> SendOutcome:
        started = time.perf_counter()
        validated, ranges = self._validated(buffer, count)
        if transaction_id and not is_half_batch(buffer) and not _names_its_attempt(buffer, attempt):
            return self._send_in_place(validated, ranges, count, transaction_id, producer_group, attempt, coordinator,
                                       started)
        if transaction_id:
            return self._send_halves(buffer, validated, ranges, count, transaction_id, producer_group, started)
        self._check_topics(ranges)
        with self.topics.reserving(ranges):
            properties = batch_properties(buffer, validated)
            timed = self.timers is not None and self.timers.batch_has_timer(properties)
            if self.timers is not None and timed:
                buffer = self.timers.rewrite_batch(buffer)  # timer entries re-addressed; checked as sent above
            if self.schedule is not None and (timed or self.schedule.batch_has_delay(properties)):
                # entries with DELAY are re-addressed to the schedule topic (validated above as sent, CRCs included)
                result = self.store.put_batch(self.schedule.rewrite_batch_for_delay(buffer))
            elif timed:
                result = self.store.put_batch(buffer)
            else:
                result = self.store.put_batch(buffer, validated=validated)
            return self._finish(result, started, "SendBatch", created=_max_queue_ids(ranges))

    @staticmethod
    def authorize_deduplicated_send(topic: str) -> None:
        """A send whose retries are answered with the first attempt's result (send_dedup.py) needs what storing it
        needs, before its key is held and a retry looked up: the answer says where the message is stored."""
        authorize(Operation.PUBLISH, topics=[topic])

    def authorize_deduplicated_batch(self, buffer: bytes, count: int) -> None:
        """A retried SendBatch, which may be answered with the first attempt's result (send_dedup.py), needs what
        storing it needs before it is looked up: the caller's Pub on every topic it names, for the answer says
        where those messages are stored."""
        _, ranges = self._validated(buffer, count)
        authorize(Operation.PUBLISH_BATCH, topics=ranges)

    def _send_in_place(
        self, validated: SmallBatch | ValidatedBatch, ranges: dict[str, tuple[int, int]], count: int,
        transaction_id: str, producer_group: str, attempt: str, coordinator: str, started: float,
    ) -> SendOutcome:
        """A SendBatch in a transaction whose entries are encoded for their real topics: stored once, in place
        (broker/semantics/txn_in_place.py); topics and queues checked as any send's."""
        if self.transactions is None:
            raise ServiceNotAvailableError("transactions are not enabled on this broker")
        self._check_topics(ranges)
        with self.topics.reserving(ranges):
            result = self.transactions.put_in_place(
                validated.data, producer_group, transaction_id, attempt=attempt, coordinator=coordinator,
                declared=count, validated=validated,
            )
            return self._finish(result, started, "SendBatch (in a transaction)", transaction_id,
                                created=_max_queue_ids(ranges))

    def _send_halves(
        self, buffer: bytes, validated: SmallBatch | ValidatedBatch, ranges: dict[str, tuple[int, int]], count: int,
        transaction_id: str, producer_group: str, started: float,
    ) -> SendOutcome:
        """A SendBatch in a transaction stored as half messages, validated as any other (send_batch). The real
        topics are checked as any send's: those of plain entries (which name their attempt themselves) on the
        buffer as sent; those of entries already in half form (all of the half topic, or the transaction service
        refuses them) as the service reports them to admit(), before anything is stored."""
        if self.transactions is None:
            raise ServiceNotAvailableError("transactions are not enabled on this broker")
        real: dict[str, tuple[int, int]] = {}
        if not is_half_batch(buffer):
            real = ranges
            self._check_topics(real)  # the half topic too: such entries would be committed into it
        with ExitStack() as reservations:

            def admit(half_real: dict[str, tuple[int, int]]) -> None:
                self._check_topics(half_real)
                reservations.enter_context(self.topics.reserving(half_real))
                real.update(half_real)

            if real:
                reservations.enter_context(self.topics.reserving(real))
            result = self.transactions.put_half_batch(
                buffer, producer_group, transaction_id, admit=admit, declared=count, validated=validated
            )
            return self._finish(
                result, started, "SendBatch (half messages)", transaction_id, created=_max_queue_ids(real)
            )

    def _check_topics(self, ranges: dict[str, tuple[int, int]]) -> None:
        """The topics and queues a batch's entries go to (for a transaction: their real ones). A batch in half form
        never comes here with its half topic: the transaction service checks it and admits its real queues."""
        authorize(Operation.PUBLISH_BATCH, topics=ranges)  # the caller's Pub on each (broker/auth/operations.py)
        for topic, (min_queue_id, max_queue_id) in ranges.items():
            validate_topic(topic)
            if is_system_topic(topic):
                raise MessageIllegalError(f"SendBatch refused, nothing stored: {topic!r} is a system topic")
            try:
                self.topics.check_write(topic, min_queue_id, max_queue_id)
            except InvalidArgumentError as e:
                raise MessageIllegalError(f"SendBatch refused, nothing stored: {e}") from None

    def _finish(
        self, result: PutResult, started: float, what: str, transaction_id: str = "", *, created: dict[str, int]
    ) -> SendOutcome:
        """Answer a put; ``created``: the topics it wrote to and the highest queue id in each, registered
        (auto-created, or grown to cover that queue) once the put is stored."""
        elapsed = time.perf_counter() - started
        raise_for_put(result, what)
        for topic, max_queue_id in created.items():
            self.topics.register_sent(topic, max_queue_id)
        self.metrics.put_messages.inc(len(result.commitlog_offsets))
        self.metrics.put_bytes.inc(result.wrote_bytes)
        self.metrics.put_latency.observe(elapsed)
        if self.sync_flush:
            self.metrics.flush_latency.observe(elapsed)
        return SendOutcome(STORED_STATUSES[result.status], result, transaction_id)
