"""Sends: one message with separate fields, or a client-encoded batch buffer appended whole.

The batch path touches each entry only to read its topic and queue id (so that unknown topics are auto-created
and queue ids checked against the topic's queue count); the store validates framing, sizes and CRCs and writes
the buffer with one copy. Nothing is written unless every entry is acceptable.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from broker.errors import (
    BrokerError,
    FlushDiskTimeoutError,
    InvalidArgumentError,
    MessageIllegalError,
    ResponseCode,
    ServiceNotAvailableError,
)
from broker.server.metrics import BrokerMetrics
from broker.server.topic_config import TopicConfigManager
from broker.store import MessageStore, PutStatus
from broker.store.message import (
    BODY_START,
    I32,
    MESSAGE_MAGIC,
    POS_BODY_LENGTH,
    POS_QUEUE_ID,
    PREFIX,
    validate_topic,
)
from broker.store.results import PutResult

# Put statuses that mean "stored, but durability not confirmed": answered with a SendStatus, not an error.
STORED_STATUSES = {PutStatus.PUT_OK: "SEND_OK", PutStatus.FLUSH_DISK_TIMEOUT: "FLUSH_DISK_TIMEOUT"}


@dataclass
class SendOutcome:
    status: str  # a SendStatus name
    result: PutResult


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


def scan_batch(buffer: bytes, count: int) -> dict[tuple[bytes, int], int]:
    """Walk the entries' framing to collect (topic bytes, queue id) -> messages; checks the declared count.

    Only lengths needed to hop from entry to entry are read; deeper validation is the store's.
    """
    if not buffer:
        raise MessageIllegalError("SendBatch buffer is empty; encode at least one message with encode_entry")
    seen: dict[tuple[bytes, int], int] = {}
    pos, n, end = 0, 0, len(buffer)
    unpack_prefix, unpack_i32 = PREFIX.unpack_from, I32.unpack_from
    while pos < end:
        if pos + BODY_START + 1 > end:
            raise MessageIllegalError(
                f"SendBatch entry {n} at byte {pos} is truncated: fewer bytes than an entry header; "
                "encode messages with broker.store.message.encode_entry"
            )
        total, magic = unpack_prefix(buffer, pos)
        body_len = unpack_i32(buffer, pos + POS_BODY_LENGTH)[0]
        topic_at = pos + BODY_START + body_len
        if magic != MESSAGE_MAGIC or total <= BODY_START or pos + total > end or not 0 <= body_len < total - BODY_START:
            raise MessageIllegalError(
                f"SendBatch entry {n} at byte {pos} is not a valid entry (magic {magic & 0xFFFFFFFF:#x}, "
                f"size {total}, {end - pos} bytes left); encode messages with broker.store.message.encode_entry"
            )
        topic_len = buffer[topic_at]
        key = (buffer[topic_at + 1 : topic_at + 1 + topic_len], unpack_i32(buffer, pos + POS_QUEUE_ID)[0])
        seen[key] = seen.get(key, 0) + 1
        pos += total
        n += 1
    if count and count != n:
        raise MessageIllegalError(f"SendBatch declares {count} messages but the buffer holds {n}; nothing stored")
    return seen


class SendProcessor:
    def __init__(
        self, store: MessageStore, topics: TopicConfigManager, metrics: BrokerMetrics, *, sync_flush: bool = False
    ) -> None:
        self.store = store
        self.sync_flush = sync_flush
        self.topics = topics
        self.metrics = metrics
        self._round_robin = itertools.count()

    def send_message(
        self, topic: str, queue_id: int, body: bytes, properties: dict[str, str], *, flag: int = 0,
        sys_flag: int = 0, born_timestamp: int = 0, reconsume_times: int = 0,
    ) -> SendOutcome:  # fmt: skip
        validate_topic(topic)
        config = self.topics.get_or_create(topic)
        if queue_id < 0:
            queue_id = next(self._round_robin) % config.write_queue_nums
        self.topics.check_queue(topic, queue_id, for_write=True)
        started = time.perf_counter()
        result = self.store.put_message(
            topic, queue_id, body, properties, flag=flag, sys_flag=sys_flag,
            born_timestamp=born_timestamp or int(time.time() * 1000), reconsume_times=reconsume_times,
        )  # fmt: skip
        return self._finish(result, started, "message")

    def send_batch(self, buffer: bytes, count: int) -> SendOutcome:
        for (topic_raw, queue_id), _ in scan_batch(buffer, count).items():
            try:
                topic = topic_raw.decode("ascii")
            except UnicodeDecodeError:
                raise MessageIllegalError(f"SendBatch entry has a non-ASCII topic {topic_raw[:40]!r}") from None
            validate_topic(topic)
            try:
                self.topics.check_queue(topic, queue_id, for_write=True)
            except InvalidArgumentError as e:
                raise MessageIllegalError(f"SendBatch refused, nothing stored: {e}") from None
        started = time.perf_counter()
        result = self.store.put_batch(buffer)
        return self._finish(result, started, "SendBatch")

    def _finish(self, result: PutResult, started: float, what: str) -> SendOutcome:
        elapsed = time.perf_counter() - started
        raise_for_put(result, what)
        self.metrics.put_messages.inc(len(result.commitlog_offsets))
        self.metrics.put_bytes.inc(result.wrote_bytes)
        self.metrics.put_latency.observe(elapsed)
        if self.sync_flush:
            self.metrics.flush_latency.observe(elapsed)
        return SendOutcome(STORED_STATUSES[result.status], result)
