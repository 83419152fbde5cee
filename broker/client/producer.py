"""Producer: single sends, batches encoded client-side into one buffer, and already-encoded batches.

Queue selection, as RocketMQ's producer: round-robin per topic from a random first queue (each producer starts
elsewhere, so many short-lived producers, one ``sluice send`` each, do not all fill queue 0), or by a sharding key
(``abs(String.hashCode(key)) % queues``) so that every message with the same key lands in the same queue, in order.

A batch is spread too: its messages of one topic are cut into as many contiguous runs as there are queues (fewer
for a batch smaller than that), the runs go to consecutive queues, and the next send starts after the last one.
All runs travel in the same SendBatch calls (an entry names its own queue), so a spread batch costs no more calls
than a batch for one queue. Queue counts come from the broker (GetTopicRoute, auto-creating the topic when the
broker allows) and are cached per topic.
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar, overload

from broker.client.connection import Connection
from broker.client.half_batch import to_half_batch
from broker.client.message import Message, encode_message
from broker.client.results import SendResult, SendStatus
from broker.errors import BrokerError, InvalidArgumentError, MessageIllegalError
from broker.proto import sluice_pb2 as pb
from broker.store.batch import split_entries
from broker.store.message import java_string_hash, validate_topic

T = TypeVar("T")

# The broker's store refuses batches above max_batch_bytes (4 MiB by default); send_batch splits below that.
DEFAULT_BATCH_LIMIT_BYTES = 4 * 1024 * 1024 - 64 * 1024


class SendResults(Sequence[SendResult]):
    """One SendResult per message of a batch, built on access: a 2,000-message batch costs no 2,000 objects
    unless the caller looks at them. Indexable, iterable and sized like the list it stands for."""

    def __init__(self, resp: pb.SendResponse) -> None:
        self.status = SendStatus[pb.SendStatus.Name(resp.status)]
        self.msg_id_prefix = resp.msg_id_prefix
        self.commitlog_offsets: list[int] = list(resp.commitlog_offsets)
        self.queue_ids: list[int] = list(resp.queue_ids)
        self.queue_offsets: list[int] = list(resp.queue_offsets)
        if not len(self.commitlog_offsets) == len(self.queue_ids) == len(self.queue_offsets):
            raise BrokerError("broker answered a send with mismatched result lists; this is a broker bug")

    def __len__(self) -> int:
        return len(self.commitlog_offsets)

    @overload
    def __getitem__(self, index: int) -> SendResult: ...
    @overload
    def __getitem__(self, index: slice) -> list[SendResult]: ...
    def __getitem__(self, index: int | slice) -> SendResult | list[SendResult]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return SendResult(self.status, f"{self.msg_id_prefix}{self.commitlog_offsets[index]:016X}",
                          self.queue_ids[index], self.queue_offsets[index])  # fmt: skip

    def __iter__(self) -> Iterator[SendResult]:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return f"SendResults({len(self)} messages, {self.status.value})"

    def extend(self, other: SendResults) -> None:
        """Append another call's results (a batch sent in several calls); the worst status wins."""
        if other.status is not SendStatus.SEND_OK:
            self.status = other.status
        self.commitlog_offsets += other.commitlog_offsets
        self.queue_ids += other.queue_ids
        self.queue_offsets += other.queue_offsets


class PartialSendError(BrokerError):
    """A send split into several all-or-nothing calls failed after the first ones were stored. ``stored``: the
    results of the messages that were (the first ``len(stored)``, in order); resend only the others."""

    def __init__(self, cause: BrokerError, stored: list[SendResult], total: int) -> None:
        super().__init__(
            f"{len(stored)} of {total} messages were stored (the first {len(stored)}, in order) before a later "
            f"part of the send failed: {cause.message}; resend only the other {total - len(stored)}",
            cause.code,
        )
        self.cause = cause
        self.stored = stored


def _stored_so_far(stored: Sequence[SendResult], total: int, send: Callable[[], T]) -> T:
    """``send()``; a failure after earlier parts were stored becomes a PartialSendError naming them."""
    try:
        return send()
    except BrokerError as e:
        if not stored:
            raise
        raise PartialSendError(e, list(stored), total) from e


class Producer:
    def __init__(
        self, endpoint: str | None = None, group: str = "DEFAULT_PRODUCER", *, timeout_s: float = 30.0,
        batch_limit_bytes: int = DEFAULT_BATCH_LIMIT_BYTES,
    ) -> None:  # fmt: skip
        self.conn = Connection(endpoint, timeout_s)
        self.group = group
        self.batch_limit_bytes = batch_limit_bytes
        self._queue_nums: dict[str, int] = {}
        self._next_queue: dict[str, int] = {}  # topic -> where round-robin goes next (random at first)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------------------ queues
    def queue_count(self, topic: str) -> int:
        n = self._queue_nums.get(topic)
        if n is None:
            validate_topic(topic)
            info = self.conn.call(self.conn.stub.GetTopicRoute, pb.GetTopicRouteRequest(topic=topic, auto_create=True))
            n = self._queue_nums[topic] = info.write_queue_nums
        return n

    def select_queue(self, topic: str, sharding_key: str | None = None) -> int:
        n = self.queue_count(topic)
        if sharding_key is not None:
            return abs(java_string_hash(sharding_key)) % n
        return self._take_queues(topic, n, 1)

    def _take_queues(self, topic: str, n: int, runs: int) -> int:
        """The first of ``runs`` consecutive queues (mod ``n``) for ``topic``; the next caller starts after them."""
        with self._lock:
            first = self._next_queue.get(topic)
            if first is None:
                first = random.randrange(n)
            self._next_queue[topic] = (first + runs) % n
            return first % n

    def spread(self, msgs: Sequence[Message]) -> list[int]:
        """Queue ids for a batch without a given queue or key: per topic, contiguous runs of nearly equal size on
        consecutive queues, one run per queue (see the module docstring)."""
        counts = Counter(m.topic for m in msgs)
        plans: dict[str, tuple[int, int, int, int]] = {}  # topic -> (first queue, queues, runs, messages)
        for topic, total in counts.items():
            n = self.queue_count(topic)
            runs = min(total, n)
            plans[topic] = (self._take_queues(topic, n, runs), n, runs, total)
        if len(plans) == 1:  # the usual batch, one topic: no per-message lookups
            first, n, runs, total = next(iter(plans.values()))
            return [(first + i * runs // total) % n for i in range(total)]
        seen: Counter[str] = Counter()
        out = []
        for m in msgs:
            first, n, runs, total = plans[m.topic]
            out.append((first + seen[m.topic] * runs // total) % n)
            seen[m.topic] += 1
        return out

    # ------------------------------------------------------------------------------------------------ sends
    def send(self, msg: Message, *, queue_id: int | None = None, sharding_key: str | None = None) -> SendResult:
        qid = queue_id if queue_id is not None else self.select_queue(msg.topic, sharding_key)
        if not isinstance(msg.body, bytes | bytearray | memoryview):
            raise MessageIllegalError(f"message body must be bytes, got {type(msg.body).__name__}; encode text first")
        request = pb.SendMessageRequest(
            producer_group=self.group, topic=msg.topic, queue_id=qid, body=bytes(msg.body),
            properties=msg.all_properties(), flag=msg.flag, born_timestamp=int(time.time() * 1000),
        )  # fmt: skip
        return SendResults(self.conn.call(self.conn.stub.SendMessage, request))[0]

    def send_batch(
        self, msgs: Sequence[Message], queue_id: int | None = None, *, sharding_key: str | None = None
    ) -> list[SendResult]:
        """Encode and send; each chunk of up to ``batch_limit_bytes`` is stored all-or-nothing, in order.

        ``queue_id``: every message to that queue. ``sharding_key``: every message of a topic to the key's queue.
        Neither: the messages are spread over the topic's queues (module docstring).
        """
        if not msgs:
            return []
        born = int(time.time() * 1000)
        results: list[SendResult] = []
        chunk: list[bytes] = []
        chunk_bytes = 0
        if queue_id is not None:
            qids: Sequence[int] = [queue_id] * len(msgs)
        elif sharding_key is not None:
            by_topic = {t: self.select_queue(t, sharding_key) for t in {m.topic for m in msgs}}
            qids = [by_topic[m.topic] for m in msgs]
        else:
            qids = self.spread(msgs)
        # every message encoded (and so checked here) before any chunk is sent
        entries = [encode_message(msg, qid, born) for msg, qid in zip(msgs, qids, strict=True)]
        for entry in entries:
            if chunk and chunk_bytes + len(entry) > self.batch_limit_bytes:
                results += _stored_so_far(results, len(msgs), functools.partial(self._send_entries, chunk))
                chunk, chunk_bytes = [], 0
            chunk.append(entry)
            chunk_bytes += len(entry)
        results += _stored_so_far(results, len(msgs), functools.partial(self._send_entries, chunk))
        return results

    def send_encoded(
        self, buffer: bytes, count: int, transaction_id: str | None = None, *, as_halves: bool = False
    ) -> SendResults:
        """Send entries already encoded with ``encode_entry`` (the fast path); stored all-or-nothing.

        With ``transaction_id`` the entries are sent as half messages of that batch transaction (invisible until
        ``Admin.end_transaction(transaction_id, commit=True)``); any number of calls from any number of processes
        may join one transaction. The entries are re-addressed as halves here (``half_batch.to_half_batch``) so the
        broker only checks them; halves are bigger, so the buffer may go in several calls (each all-or-nothing).

        ``as_halves``: the entries are already half entries of ``transaction_id`` (``encode_half_entry``, or the
        Spark sink's encoder), so the re-addressing is skipped; the broker checks them all the same.

        Returns a lazy sequence of SendResult (one per entry, in order; for halves, the halves' positions)."""
        if as_halves and not transaction_id:
            raise InvalidArgumentError("as_halves=True needs the transaction_id the halves were encoded for")
        if not transaction_id:
            request = pb.SendBatchRequest(producer_group=self.group, entries=buffer, count=count)
            return SendResults(self.conn.call(self.conn.stub.SendBatch, request))
        half = buffer if as_halves else to_half_batch(buffer, self.group, transaction_id)
        chunks = [(half, count)] if len(half) <= self.batch_limit_bytes else split_entries(half, self.batch_limit_bytes)
        results: SendResults | None = None
        for chunk, n in chunks:
            request = pb.SendBatchRequest(producer_group=self.group, entries=chunk, count=n,
                                          transaction_id=transaction_id)  # fmt: skip
            done: Sequence[SendResult] = results if results is not None else ()
            part = _stored_so_far(done, count, functools.partial(self._send_request, request))
            if results is None:
                results = part
            else:
                results.extend(part)
        assert results is not None
        return results

    def _send_entries(self, entries: list[bytes]) -> SendResults:
        return self.send_encoded(b"".join(entries), len(entries))

    def _send_request(self, request: pb.SendBatchRequest) -> SendResults:
        return SendResults(self.conn.call(self.conn.stub.SendBatch, request))

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
