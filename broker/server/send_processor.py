"""Sends: one message with separate fields, or a client-encoded batch buffer appended whole.

The batch path touches each entry only to read its topic and queue id (so that unknown topics are auto-created
and queue ids checked against the topic's queue count); the store validates framing, sizes and CRCs and writes
the buffer with one copy. Nothing is written unless every entry is acceptable.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np

from broker.errors import (
    BrokerError,
    FlushDiskTimeoutError,
    InvalidArgumentError,
    MessageIllegalError,
    ResponseCode,
    ServiceNotAvailableError,
)
from broker.semantics import ScheduleMessageService, TransactionService
from broker.semantics.system_topics import is_system_topic
from broker.semantics.timer import TimerService
from broker.semantics.transaction_codec import is_half_batch
from broker.server.metrics import BrokerMetrics
from broker.server.topic_config import TopicConfigManager
from broker.store import MessageStore, PutStatus
from broker.store.batch import SmallBatch, ValidatedBatch, queue_ranges, walk
from broker.store.message import (
    BODY_START,
    I32,
    MAX_TOPIC_BYTES,
    POS_BODY_LENGTH,
    POS_QUEUE_ID,
    POS_RECONSUME_TIMES,
    POS_SYS_FLAG,
    SysFlag,
    validate_topic,
)
from broker.store.results import PutResult

# Put statuses that mean "stored, but durability not confirmed": answered with a SendStatus, not an error.
_ARANGE4 = np.arange(4, dtype=np.int64)
STORED_STATUSES = {PutStatus.PUT_OK: "SEND_OK", PutStatus.FLUSH_DISK_TIMEOUT: "FLUSH_DISK_TIMEOUT"}


@dataclass
class SendOutcome:
    status: str  # a SendStatus name
    result: PutResult
    transaction_id: str = ""  # half messages: the transaction they joined


def raise_for_put(result: PutResult, what: str) -> None:
    """Turn a failed PutResult into the matching BrokerError (stored outcomes pass through)."""
    if result.status in STORED_STATUSES:
        return
    detail = result.error or result.status.value
    if result.status in (PutStatus.MESSAGE_ILLEGAL, PutStatus.PROPERTIES_SIZE_EXCEEDED):
        raise MessageIllegalError(f"{what} refused, nothing stored: {detail}")
    if result.status is PutStatus.SERVICE_NOT_AVAILABLE:
        raise ServiceNotAvailableError(f"{what} refused, nothing stored: {detail}; retry later or free disk space")
    if result.status is PutStatus.FLUSH_DISK_TIMEOUT:
        raise FlushDiskTimeoutError(detail)
    raise BrokerError(f"{what} failed: {detail}", ResponseCode.SYSTEM_ERROR)


def _gather_i32(arr: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Big-endian int32 fields at byte positions ``idx``."""
    return arr[idx[:, None] + _ARANGE4].view(">i4").ravel().astype(np.int64)


def _walk(buffer: bytes) -> np.ndarray:
    """Entry start positions, following TOTALSIZE (the store's walk: proven in bulk for same-sized or small
    entries); MessageIllegalError naming where the framing breaks."""
    positions, stop, reason = walk(buffer, 0, len(buffer))
    if reason or stop != len(buffer):
        raise MessageIllegalError(
            f"SendBatch entry {positions.size} at byte {stop} is not a valid entry ({reason or 'trailing bytes'}, "
            f"{len(buffer) - stop} bytes left); encode messages with broker.store.message.encode_entry"
        )
    return positions


def scan_batch(buffer: bytes, count: int) -> dict[str, tuple[int, int]]:
    """Topic -> (min, max) queue id over the batch's entries; checks framing enough to find them and the count.

    Vectorised except for the hop from entry to entry; deeper validation (lengths, CRCs) is the store's.
    """
    if not buffer:
        raise MessageIllegalError("SendBatch buffer is empty; encode at least one message with encode_entry")
    p = _walk(buffer)
    if count and count != p.size:
        raise MessageIllegalError(f"SendBatch declares {count} messages but the buffer holds {p.size}; nothing stored")
    arr = np.frombuffer(buffer, np.uint8)
    ends = np.append(p[1:], len(buffer))
    body_len = _gather_i32(arr, p + POS_BODY_LENGTH)
    topic_len_at = p + BODY_START + body_len
    bad = np.flatnonzero((body_len < 0) | (topic_len_at + 3 > ends))
    if bad.size:
        i = int(bad[0])
        raise MessageIllegalError(f"SendBatch entry {i}: BODY length {int(body_len[i])} overruns the entry")
    topic_len = arr[topic_len_at].astype(np.int64)
    bad = np.flatnonzero((topic_len > MAX_TOPIC_BYTES) | (topic_len == 0) | (topic_len_at + 1 + topic_len + 2 > ends))
    if bad.size:
        i = int(bad[0])
        raise MessageIllegalError(f"SendBatch entry {i}: TOPIC length {int(topic_len[i])} is invalid")
    queue_ids = _gather_i32(arr, p + POS_QUEUE_ID)
    first_topic = arr[int(topic_len_at[0]) + 1 : int(topic_len_at[0]) + 1 + int(topic_len[0])]
    same_length = bool((topic_len == topic_len[0]).all())
    rows = arr[(topic_len_at + 1)[:, None] + np.arange(int(topic_len[0]))] if same_length else None
    if rows is not None and (rows == first_topic).all():  # the usual case, vectorised: one topic
        topics, ids = [first_topic.tobytes()], np.zeros(p.size, np.int64)
    else:
        raw = [bytes(buffer[s + 1 : s + 1 + n]) for s, n in zip(topic_len_at.tolist(), topic_len.tolist(), strict=True)]
        topics = sorted(set(raw))
        index = {t: i for i, t in enumerate(topics)}
        ids = np.array([index[t] for t in raw], dtype=np.int64)
    out: dict[str, tuple[int, int]] = {}
    for i, raw_topic in enumerate(topics):
        try:
            name = raw_topic.decode("ascii")
        except UnicodeDecodeError:
            raise MessageIllegalError(f"SendBatch has a non-ASCII topic {raw_topic[:40]!r}") from None
        qids = queue_ids[ids == i]
        out[name] = (int(qids.min()), int(qids.max()))
    return out


def _sys_flags(validated: SmallBatch | ValidatedBatch) -> list[int] | np.ndarray:
    if isinstance(validated, ValidatedBatch):
        return validated.run.sys_flags
    return [I32.unpack_from(validated.data, p + POS_SYS_FLAG)[0] for p in validated.positions]


def _refuse_transaction_bits(sys_flags: list[int] | np.ndarray, what: str) -> None:
    """Transaction types in SYSFLAG are the broker's to set: a plain send marked PREPARED or ROLLBACK would be
    stored but never reach a consume queue (acknowledged, never delivered), and one marked COMMIT would pass for
    the end of a transaction that never was."""
    bad = np.flatnonzero(np.asarray(sys_flags, np.int64) & SysFlag.TRANSACTION_MASK)
    if bad.size:
        i = int(bad[0])
        raise MessageIllegalError(
            f"{what} refused, nothing stored: message {i} sets transaction type bits in SYSFLAG "
            f"({int(sys_flags[i]):#x}); plain sends must leave them 0 (send transactional messages as halves: "
            "TransactionProducer, or Producer.send_encoded(transaction_id=...))"
        )


def _reconsume_times(validated: SmallBatch | ValidatedBatch) -> list[int] | np.ndarray:
    if isinstance(validated, ValidatedBatch):
        arr = np.frombuffer(validated.data, np.uint8)
        return _gather_i32(arr, validated.run.positions.astype(np.int64) + POS_RECONSUME_TIMES)
    return [I32.unpack_from(validated.data, p + POS_RECONSUME_TIMES)[0] for p in validated.positions]


def _refuse_negative_reconsume_times(times: list[int] | np.ndarray, what: str) -> None:
    """A count is how often consumers failed the message: a negative one made its send-back skip the retry delay
    and allowed extra attempts before the dead-letter queue."""
    bad = np.flatnonzero(np.asarray(times, np.int64) < 0)
    if bad.size:
        i = int(bad[0])
        raise MessageIllegalError(
            f"{what} refused, nothing stored: message {i}: reconsume_times={int(times[i])} is negative; send 0 "
            "(the broker counts redeliveries itself)"
        )


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
    ) -> SendOutcome:  # fmt: skip
        validate_topic(topic)
        if is_system_topic(topic):
            raise MessageIllegalError(f"topic {topic!r} is a system topic written by the broker only; send elsewhere")
        if not (transactional or transaction_id):
            _refuse_transaction_bits([sys_flag], "SendMessage")
        _refuse_negative_reconsume_times([reconsume_times], "SendMessage")
        if queue_id < 0:
            queue_id = next(self._round_robin) % self.topics.writable_queue_nums(topic)
        self.topics.check_write(topic, queue_id, queue_id)  # creates nothing: a refused send leaves no topic
        started = time.perf_counter()
        kwargs = {"flag": flag, "sys_flag": sys_flag, "born_timestamp": born_timestamp or int(time.time() * 1000),
                  "reconsume_times": reconsume_times}  # fmt: skip
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

    def send_batch(self, buffer: bytes, count: int, transaction_id: str = "", producer_group: str = "") -> SendOutcome:
        started = time.perf_counter()
        if transaction_id:
            limit = self.store.config.batch_limit_bytes
            if len(buffer) > limit:  # before any scan: a batch's half form is only bigger
                raise MessageIllegalError(
                    f"SendBatch refused, nothing stored: MESSAGE_SIZE_EXCEEDED: the batch is {len(buffer)} bytes, "
                    f"over the {limit}-byte batch limit; send smaller transactional batches"
                )
            # Halves, checked by the transaction service: the client's topics are checked on the buffer as sent,
            # unless the entries are in half form (all of the half topic, or the transaction service refuses
            # them), whose real topics the service reports to admit() before anything is stored.
            real: dict[str, tuple[int, int]] = {}
            if not is_half_batch(buffer):
                real = scan_batch(buffer, count)
                self._check_topics(real)  # the half topic too: such entries would be committed into it
            if self.transactions is None:
                raise ServiceNotAvailableError("transactions are not enabled on this broker")

            def admit(half_real: dict[str, tuple[int, int]]) -> None:
                self._check_topics(half_real)
                real.update(half_real)

            result = self.transactions.put_half_batch(
                buffer, producer_group, transaction_id, admit=admit, declared=count
            )
            return self._finish(
                result, started, "SendBatch (half messages)", transaction_id, created=_max_queue_ids(real)
            )
        try:  # one scan serves the checks here and the store's append
            validated = self.store.validate_batch(buffer)
        except MessageIllegalError as e:
            raise MessageIllegalError(f"SendBatch refused, nothing stored: {e.message}") from None
        entries, ranges = queue_ranges(validated)
        if count and count != entries:
            raise MessageIllegalError(
                f"SendBatch declares {count} messages but the buffer holds {entries}; nothing stored"
            )
        _refuse_transaction_bits(_sys_flags(validated), "SendBatch")
        _refuse_negative_reconsume_times(_reconsume_times(validated), "SendBatch")
        self._check_topics(ranges)
        timed = self.timers is not None and self.timers.batch_has_timer(buffer)
        if self.timers is not None and timed:
            buffer = self.timers.rewrite_batch(buffer)  # timer entries re-addressed; checked as sent above
            if self.schedule is None:
                return self._finish(self.store.put_batch(buffer), started, "SendBatch", created=_max_queue_ids(ranges))
        if self.schedule is not None and (timed or self.schedule.batch_has_delay(buffer, validated)):
            # entries with DELAY are re-addressed to the schedule topic (validated above as sent, CRCs included)
            delayed = self.schedule.rewrite_batch_for_delay(buffer)
            return self._finish(self.store.put_batch(delayed), started, "SendBatch", created=_max_queue_ids(ranges))
        result = self.store.put_batch(buffer, validated=validated)
        return self._finish(result, started, "SendBatch", created=_max_queue_ids(ranges))

    def _check_topics(self, ranges: dict[str, tuple[int, int]]) -> None:
        """The topics and queues a batch's entries go to (for a transaction: their real ones). A batch in half form
        never comes here with its half topic: the transaction service checks it and admits its real queues."""
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
