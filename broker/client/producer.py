"""Producer: single sends, batches encoded client-side into one buffer, and already-encoded batches, to one broker
or across a cluster's brokers.

Queues. A send picks a writable queue of the topic's route (broker/client/route.py) round-robin, starting at a
random queue per topic so that many short-lived producers (one ``sluice send`` each) do not all fill queue 0
(RocketMQ's producer starts its counter at random too). A sharding key picks ``abs(String.hashCode(key)) %
len(queues)`` of the route's writable queues in their fixed order, so every message with the same key lands in the
same queue, in order. The route comes from the broker itself (``endpoint=``) or from name servers (``namesrv=``),
auto-creating the topic when a broker allows it.

A batch is spread too: its messages of one topic are cut into as many contiguous runs as there are queues (fewer
for a batch smaller than that), the runs go to consecutive queues, and the next send starts after the last one.
The runs of one broker travel in the same SendBatch calls (an entry names its own queue), so a spread batch costs
no more calls than a batch for one queue: one per broker it reaches.

Failures (RocketMQ's retryTimesWhenSendFailed and latency fault tolerance, with one difference, below):

* A send the broker refused without storing (a refusal such as a full disk or a topic it no longer holds), or
  that could not reach the broker at all (connection refused), is retried on another broker, up to
  ``retry_times_when_send_failed`` (2) more times, and the failed broker is avoided for 30 s. Ordered sends (a
  sharding key or a chosen queue) are never moved to another broker: they fail with a clear error instead.
* A send whose outcome is unknown (no answer before the attempt deadline, or the connection broke mid-call) may
  have been stored. RocketMQ sends it again anywhere and may store it twice. Here it is sent again to the same
  broker only, marked ``retry``, and the broker answers with the first attempt's result when it stored it
  (broker/server/send_dedup.py, keyed by the UNIQ_KEY every message carries), so a message sent once is stored at
  most once. When no answer comes within ``timeout_s``, the send raises SendOutcomeUnknownError.
* A replicated group (broker/ha) answers FLUSH_SLAVE_TIMEOUT when its in-sync replicas did not confirm a send in
  time: stored on the master, it may or may not survive a failover, so that outcome is unknown too and handled as
  above. The retries of an unknown outcome go to the group's master as the name servers name it at each attempt
  (the route is fetched again), so a retry during a failover reaches the new master, whose deduplication state (the
  index) was built from the replicated log: it answers with the first attempt's result if that reached it, and
  stores the message once otherwise. Refusals that say nothing was done by that attempt (NOT_MASTER while the
  group elects, NOT_ENOUGH_REPLICAS) keep the outcome unknown and are retried the same way.

Every message gets a UNIQ_KEY (32 hex characters, as RocketMQ's client ids) unless it has one; ``SendResult``
carries it, with the storing broker's name.
"""

from __future__ import annotations

import functools
import itertools
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, overload

from broker.client.connection import Connection
from broker.client.half_batch import to_half_batch
from broker.client.outgoing_message import Message, body_bytes, encode_messages
from broker.client.results import SendResult, SendStatus
from broker.client.route import DIRECT_BROKER, MessageQueue
from broker.client.router import Router, RouterClient, first_available
from broker.errors import (
    BrokerError,
    BrokerUnreachableError,
    FlushDiskTimeoutError,
    FlushSlaveTimeoutError,
    InvalidArgumentError,
    ResponseCode,
    SendOutcomeUnknownError,
    ServiceNotAvailableError,
)
from broker.format.batch import split_entries
from broker.format.message import I32, POS_QUEUE_ID, Prop, java_string_hash, msg_id_at, validate_topic
from broker.format.transaction_codec import is_half_batch
from broker.proto import sluice_pb2 as pb
from broker.proto.wire import Data, Framed

T = TypeVar("T")

# The broker's store refuses batches above max_batch_bytes (4 MiB by default); send_batch splits below that.
DEFAULT_BATCH_LIMIT_BYTES = 4 * 1024 * 1024 - 64 * 1024
DEFAULT_RETRY_TIMES_WHEN_SEND_FAILED = 2  # RocketMQ's retryTimesWhenSendFailed
# One attempt's deadline. Short enough that a lost answer is retried within the send's budget (timeout_s); a
# retry never stores twice, so a slow broker costs a repeat, not a duplicate. A SYNC_FLUSH put answers within 5 s.
DEFAULT_ATTEMPT_TIMEOUT_S = 10.0
RETRY_BACKOFF_S = (0.05, 0.1, 0.25, 0.5, 1.0)  # between attempts at the same broker after an unknown outcome
# Refusals that say this broker would not take the message now, nothing stored: another broker may.
_MOVABLE_CODES = frozenset({
    ResponseCode.SYSTEM_BUSY, ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.NO_PERMISSION,
    ResponseCode.TOPIC_NOT_EXIST, ResponseCode.SLAVE_NOT_AVAILABLE, ResponseCode.NOT_MASTER,
    ResponseCode.NOT_ENOUGH_REPLICAS,
})
# After an unknown outcome, refusals that say this attempt did nothing: the first attempt's fate is still unknown.
_RETRY_UNKNOWN_CODES = frozenset({
    ResponseCode.SYSTEM_BUSY, ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.NOT_MASTER,
    ResponseCode.NOT_ENOUGH_REPLICAS, ResponseCode.FLUSH_SLAVE_TIMEOUT, ResponseCode.TOPIC_NOT_EXIST,
})


class SendResults(Sequence[SendResult]):
    """One SendResult per message of a batch, built on access: a 2,000-message batch costs no 2,000 objects
    unless the caller looks at them. Indexable, iterable and sized like the list it stands for."""

    def __init__(self, resp: pb.SendResponse, broker_name: str = DIRECT_BROKER,
                 uniq_keys: Sequence[str] | None = None) -> None:
        self.status = SendStatus[pb.SendStatus.Name(resp.status)]
        self.msg_id_prefix = resp.msg_id_prefix
        self.broker_name = broker_name
        self.commitlog_offsets: list[int] = list(resp.commitlog_offsets)
        self.queue_ids: list[int] = list(resp.queue_ids)
        self.queue_offsets: list[int] = list(resp.queue_offsets)
        self.uniq_keys: list[str] = list(uniq_keys) if uniq_keys is not None else []
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
        uniq = self.uniq_keys[index] if self.uniq_keys else ""
        return SendResult(self.status, msg_id_at(self.msg_id_prefix, self.commitlog_offsets[index]),
                          self.queue_ids[index], self.queue_offsets[index], self.broker_name, uniq)

    def __iter__(self) -> Iterator[SendResult]:
        return iter(self.to_list())

    def to_list(self) -> list[SendResult]:
        """Every SendResult at once: one comprehension, about a third of the cost of indexing each in turn."""
        status, prefix, broker = self.status, self.msg_id_prefix, self.broker_name
        uniq = self.uniq_keys or [""] * len(self)
        rows = zip(self.commitlog_offsets, self.queue_ids, self.queue_offsets, uniq, strict=True)
        return [SendResult(status, msg_id_at(prefix, offset), qid, qoff, broker, u) for offset, qid, qoff, u in rows]

    def __repr__(self) -> str:
        return f"SendResults({len(self)} messages, {self.status.value})"

    # What a list of results allowed before send_batch answered with this: compare with a list, add to one.
    def __eq__(self, other: object) -> bool:
        if isinstance(other, SendResults | list | tuple):
            return self.to_list() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to a list, so unhashable like one

    def __add__(self, other: Sequence[SendResult]) -> list[SendResult]:
        return self.to_list() + list(other)

    def __radd__(self, other: Sequence[SendResult]) -> list[SendResult]:
        return list(other) + self.to_list()

    def extend(self, other: SendResults) -> None:
        """Append another call's results (a batch sent in several calls to one broker); the worst status wins."""
        if other.status is not SendStatus.SEND_OK:
            self.status = other.status
        self.commitlog_offsets += other.commitlog_offsets
        self.queue_ids += other.queue_ids
        self.queue_offsets += other.queue_offsets
        self.uniq_keys += other.uniq_keys


class PartialSendError(BrokerError):
    """A send split into several all-or-nothing calls failed after some were stored. ``results``: one entry per
    message in the order given, its SendResult when stored, None when not; ``stored``: the stored ones' results.
    Resend only the messages whose result is None."""

    def __init__(self, cause: BrokerError, results: list[SendResult | None]) -> None:
        stored = [r for r in results if r is not None]
        prefix = all(r is not None for r in results[: len(stored)])
        which = f"the first {len(stored)}, in order" if prefix else "see .results for which"
        super().__init__(
            f"{len(stored)} of {len(results)} messages were stored ({which}) before a later part of the send "
            f"failed: {cause.message}; resend only the other {len(results) - len(stored)}",
            cause.code,
        )
        self.cause = cause
        self.results = results
        self.stored = stored


def _stored_so_far(results: Sequence[SendResult | None], send: Callable[[], T]) -> T:
    """``send()``; a failure after earlier parts were stored becomes a PartialSendError naming them."""
    try:
        return send()
    except BrokerError as e:
        if not any(r is not None for r in results):
            raise
        raise PartialSendError(e, list(results)) from e


def _confirmed(call: Callable[[], Any], broker_name: str, transaction_id: str) -> SendResults:
    """``call()``, a SendBatch of a transaction, as its SendResults. Entries answered FLUSH_SLAVE_TIMEOUT are on
    the master only, and a failover may take them away; entries answered FLUSH_DISK_TIMEOUT are not on disk yet,
    and a crash of the machine may take them away. Their writer must not count them (a commit expecting them would
    then find fewer and stay open for ever), so either answer is raised as the unknown outcome it is, as a call
    without an answer: the writer sends its rows again under a new attempt, and the commit names only that one."""
    results = SendResults(call(), broker_name)
    if results.status is SendStatus.FLUSH_SLAVE_TIMEOUT:
        raise FlushSlaveTimeoutError(
            f"{len(results)} messages of transaction {transaction_id!r} were stored on the master of broker "
            f"{results.broker_name!r} but its in-sync replicas did not confirm them in time: a failover may lose "
            "them; send them again under a new attempt"
        )
    if results.status is SendStatus.FLUSH_DISK_TIMEOUT:
        raise FlushDiskTimeoutError(
            f"{len(results)} messages of transaction {transaction_id!r} were stored by broker "
            f"{results.broker_name!r} but not flushed to its disk in time: a crash of its machine may lose them; "
            "send them again under a new attempt"
        )
    return results


def readdress(buffer: bytes, queue_id: int) -> bytes:
    """The entries of ``buffer`` with QUEUEID set to ``queue_id`` (a batch moved to another broker's queue; the
    CRC covers the body only, so nothing else changes)."""
    out = bytearray(buffer)
    pos = 0
    while pos < len(out):
        I32.pack_into(out, pos + POS_QUEUE_ID, queue_id)
        pos += I32.unpack_from(out, pos)[0]
    return bytes(out)


class UniqKeys:
    """RocketMQ-style client message ids: 32 upper-case hex characters, unique per producer and message: 16 of a
    random prefix per producer (with the process id mixed in) and 16 of a counter."""

    def __init__(self) -> None:
        self._prefix = f"{(random.getrandbits(48) << 16 | (os.getpid() & 0xFFFF)):016X}"
        self._counter = itertools.count(random.getrandbits(32))
        self._lock = threading.Lock()

    def next(self) -> str:
        with self._lock:
            n = next(self._counter)
        return f"{self._prefix}{n & 0xFFFF_FFFF_FFFF_FFFF:016X}"

    def take(self, n: int) -> list[str]:
        """``n`` ids at once (a batch's): the counter is taken in one step, under a lock so that two threads'
        blocks never overlap."""
        with self._lock:
            first = next(self._counter)
            if n > 1:
                self._counter = itertools.count(first + n)
        prefix = self._prefix
        return [f"{prefix}{c & 0xFFFF_FFFF_FFFF_FFFF:016X}" for c in range(first, first + n)]


def _movable(e: BrokerError) -> bool:
    """True when ``e`` says nothing was stored and another broker may take the message."""
    if isinstance(e, BrokerUnreachableError):
        return not e.request_sent
    return e.code in _MOVABLE_CODES


class Producer(RouterClient):
    def __init__(
        self, endpoint: str | None = None, group: str = "DEFAULT_PRODUCER", *, namesrv: str | None = None,
        timeout_s: float = 30.0, batch_limit_bytes: int = DEFAULT_BATCH_LIMIT_BYTES,
        retry_times_when_send_failed: int = DEFAULT_RETRY_TIMES_WHEN_SEND_FAILED,
        attempt_timeout_s: float = DEFAULT_ATTEMPT_TIMEOUT_S, router: Router | None = None,
        tls_ca: str | None = None, tls_cert: str | None = None, tls_key: str | None = None,
        access_key: str | None = None, secret_key: str | None = None,
    ) -> None:
        if retry_times_when_send_failed < 0 or attempt_timeout_s <= 0 or timeout_s <= 0:
            raise InvalidArgumentError("retry_times_when_send_failed must be >= 0, the timeouts > 0")
        super().__init__(endpoint, namesrv, timeout_s, router, tls_ca, tls_cert, tls_key, access_key, secret_key)
        self.group = group
        self.timeout_s = timeout_s
        self.attempt_timeout_s = min(attempt_timeout_s, timeout_s)
        self.batch_limit_bytes = batch_limit_bytes
        self.retry_times_when_send_failed = retry_times_when_send_failed
        self.uniq_keys = UniqKeys()
        self._next: dict[str, int] = {}  # topic -> where round-robin goes next over its writable queues (random first)
        self._lock = threading.Lock()

    @property
    def conn(self) -> Connection:
        """The broker's connection, for a producer of one broker (``endpoint=``)."""
        return self.router.direct

    # ------------------------------------------------------------------------------------------------ queues
    def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's writable queues over every broker, in route order (auto-creating it when allowed)."""
        validate_topic(topic)
        queues = self.router.route(topic, auto_create=True).write_queues()
        if not queues:
            self.router.refresh(topic)
            queues = self.router.route(topic, auto_create=True).write_queues()
        if not queues:
            raise ServiceNotAvailableError(
                f"topic {topic!r} has no writable queue in {self.router.describe()} (no live master holds it, or "
                "its permission forbids writes)"
            )
        return queues

    def queue_count(self, topic: str) -> int:
        """Writable queues of ``topic`` (on one broker: its write queue count)."""
        return len(self.queues(topic))

    def select_queue(self, topic: str, sharding_key: str | None = None,
                     exclude: frozenset[str] = frozenset()) -> MessageQueue:
        """The next queue round-robin (skipping brokers that failed recently, and ``exclude``), or the sharding
        key's queue."""
        queues = self.queues(topic)
        if sharding_key is not None:
            return queues[abs(java_string_hash(sharding_key)) % len(queues)]
        start = self._take_queues(topic, len(queues), 1)
        return first_available(queues, start, self.router.available, exclude)

    def _take_queues(self, topic: str, n: int, runs: int) -> int:
        """The first of ``runs`` consecutive queues (of ``n``) for ``topic``; the next caller starts after them."""
        with self._lock:
            first = self._next.get(topic)
            if first is None:
                first = random.randrange(n)
            self._next[topic] = (first + runs) % n
            return first % n

    def spread(self, msgs: Sequence[Message]) -> list[MessageQueue]:
        """Queues for a batch without a given queue or key: per topic, contiguous runs of nearly equal size on
        consecutive writable queues, one run per queue, leaving out brokers that failed recently while others are
        left (see the module docstring)."""
        counts: dict[str, int] = {}
        for m in msgs:
            counts[m.topic] = counts.get(m.topic, 0) + 1
        plans: dict[str, tuple[list[MessageQueue], int, int, int]] = {}  # topic -> (queues, first, runs, messages)
        for topic, total in counts.items():
            queues = self.queues(topic)
            healthy = [q for q in queues if self.router.available(q.broker_name)]
            queues = healthy or queues
            runs = min(total, len(queues))
            plans[topic] = (queues, self._take_queues(topic, len(queues), runs), runs, total)
        if len(plans) == 1:  # the usual batch, one topic: no per-message lookups
            queues, first, runs, total = next(iter(plans.values()))
            n = len(queues)
            return [queues[(first + i * runs // total) % n] for i in range(total)]
        seen: dict[str, int] = {}
        out = []
        for m in msgs:
            queues, first, runs, total = plans[m.topic]
            i = seen.get(m.topic, 0)
            out.append(queues[(first + i * runs // total) % len(queues)])
            seen[m.topic] = i + 1
        return out

    def _resolve_queue(self, topic: str, queue: MessageQueue | None, queue_id: int | None) -> MessageQueue | None:
        if queue is not None:
            if queue.topic != topic:
                raise InvalidArgumentError(f"queue {queue} is not of topic {topic!r}")
            return queue
        if queue_id is None:
            return None
        if self.router.cluster_mode:
            raise InvalidArgumentError(
                "a bare queue_id is ambiguous in a cluster: name the queue with queue=MessageQueue(topic, broker, id)"
            )
        return MessageQueue(topic, DIRECT_BROKER, queue_id)

    # ------------------------------------------------------------------------------------------------ sends
    def send(
        self, msg: Message, *, queue_id: int | None = None, sharding_key: str | None = None,
        queue: MessageQueue | None = None,
    ) -> SendResult:
        body = body_bytes(msg)
        fixed = self._resolve_queue(msg.topic, queue, queue_id)
        properties = msg.all_properties()
        uniq = properties.setdefault(Prop.UNIQ_KEY, self.uniq_keys.next())
        born = int(time.time() * 1000)

        def request(mq: MessageQueue) -> pb.SendMessageRequest:
            return pb.SendMessageRequest(producer_group=self.group, topic=msg.topic, queue_id=mq.queue_id, body=body,
                                         properties=properties, flag=msg.flag, born_timestamp=born)

        ordered = fixed is not None or sharding_key is not None
        first = fixed or self.select_queue(msg.topic, sharding_key)
        mq, response = self._send_with_failover(msg.topic, first, ordered, request, "SendMessage")
        return SendResults(response, mq.broker_name, [uniq])[0]

    def send_batch(
        self, msgs: Sequence[Message], queue_id: int | None = None, *, sharding_key: str | None = None,
        queue: MessageQueue | None = None,
    ) -> Sequence[SendResult]:
        """Encode and send; each call of up to ``batch_limit_bytes`` is stored all-or-nothing, in order.

        ``queue`` (or ``queue_id``, with one broker): every message there. ``sharding_key``: every message of a topic
        to the key's queue. Neither: the messages are spread over the topic's queues (module docstring), one call
        per broker (more when over ``batch_limit_bytes``). Results come back one per message, in the order given
        (a batch stored by one call answers with SendResults, which makes each SendResult when it is read: 0.1
        against 1 ms for 1,000); a failure after some calls were stored raises PartialSendError saying which
        messages were stored."""
        if not msgs:
            return []
        for msg in msgs:  # every body checked before a route is looked up (encode_messages checks the rest)
            body_bytes(msg)
        if queue is not None and any(m.topic != queue.topic for m in msgs):
            raise InvalidArgumentError(f"queue {queue} is not of the topic of every message")
        ordered = queue is not None or queue_id is not None or sharding_key is not None
        pinned: dict[str, MessageQueue] = {}  # ordered: each topic's one queue
        if ordered:
            for topic in dict.fromkeys(m.topic for m in msgs):
                pinned[topic] = self._resolve_queue(topic, queue, queue_id) or self.select_queue(topic, sharding_key)
            targets = [pinned[m.topic] for m in msgs]
        else:
            targets = self.spread(msgs)
        born = int(time.time() * 1000)
        fresh = iter(self.uniq_keys.take(len(msgs)))
        uniq = [m.properties.get(Prop.UNIQ_KEY) or next(fresh) for m in msgs]
        # every message encoded (and so checked) before anything is sent; a move to another queue patches queue ids
        entries = encode_messages(msgs, [t.queue_id for t in targets], born, uniq)
        groups: dict[tuple[str, str], list[int]] = {}  # (topic, broker) -> its messages, in order of appearance
        if ordered and len(pinned) == 1:  # one topic to one queue: one group, without a look at each message
            groups[(msgs[0].topic, targets[0].broker_name)] = list(range(len(msgs)))
        else:
            for i, (msg, target) in enumerate(zip(msgs, targets, strict=True)):
                groups.setdefault((msg.topic, target.broker_name), []).append(i)
        results: list[SendResult | None] = [None] * len(msgs)
        for (topic, broker_name), indexes in groups.items():
            for part in self._size_parts(entries, indexes):

                def request(mq: MessageQueue, part: list[int] = part, home: str = broker_name) -> Framed:
                    parts = entries if len(part) == len(entries) else [entries[i] for i in part]
                    data: Data = parts
                    if mq.broker_name != home:  # moved to another broker: every entry to its one queue
                        data = readdress(b"".join(parts), mq.queue_id)
                    return Framed(pb.SendBatchRequest(producer_group=self.group, count=len(part)), "entries", data)

                first = targets[part[0]]
                send = functools.partial(self._send_with_failover, topic, first, ordered, request, "SendBatch")
                mq, response = _stored_so_far(results, send)
                if len(part) == len(msgs):  # the whole batch in one call: its results in order, made when read
                    whole = SendResults(response, mq.broker_name, uniq)
                    if len(whole) == len(msgs):
                        return whole
                stored = SendResults(response, mq.broker_name, [uniq[i] for i in part]).to_list()
                for i, r in zip(part, stored, strict=True):
                    results[i] = r
        return [r for r in results if r is not None]

    def _size_parts(self, entries: list[bytes], indexes: list[int]) -> list[list[int]]:
        """Split one topic's messages into calls of at most ``batch_limit_bytes``."""
        if len(indexes) == len(entries) and sum(map(len, entries)) <= self.batch_limit_bytes:
            return [indexes]  # the whole batch fits one call (the common case): no look at each entry
        parts: list[list[int]] = [[]]
        size = 0
        for i in indexes:
            n = len(entries[i])
            if parts[-1] and size + n > self.batch_limit_bytes:
                parts.append([])
                size = 0
            parts[-1].append(i)
            size += n
        return parts

    def send_encoded(
        self, buffer: bytes, count: int, transaction_id: str | None = None, *, attempt: str = "",
        coordinator: str = "", as_halves: bool = False, broker_name: str = DIRECT_BROKER, topic: str | None = None,
    ) -> SendResults:
        """Send entries already encoded with ``encode_entry`` (the fast path) to one broker; stored all-or-nothing.

        ``broker_name``: the broker group whose queue ids the entries carry (cluster mode), found through
        ``topic``'s route; a client of one broker leaves both out. The entries are never moved to another broker
        (their queue ids are that broker's).

        With ``transaction_id`` the entries join that batch transaction, invisible until
        ``Admin.end_transaction(transaction_id, commit=True)``; any number of calls from any number of processes
        may join one transaction. They are stored once, in their queues (broker.semantics.txn_in_place), under
        ``attempt`` (a commit may keep only some writers' attempts: ``committed_attempts``); ``coordinator`` names
        the broker that decides a transaction spanning several brokers.

        ``as_halves``: send half messages instead (the buffer is re-addressed as halves here with
        ``half_batch.to_half_batch``, unless it already is: ``encode_half_entry``): the broker copies them at the
        commit. Halves are bigger, so the buffer may go in several calls (each all-or-nothing).

        Returns a lazy sequence of SendResult (one per entry, in order; for halves, the halves' positions). In a
        transaction, entries the master stored but its in-sync replicas did not confirm in time raise
        FlushSlaveTimeoutError (their outcome is unknown: a failover may take them away), never a result to count."""
        conn = self._connection(topic, broker_name)
        if not transaction_id:
            if as_halves or attempt or coordinator:
                raise InvalidArgumentError("as_halves, attempt and coordinator need a transaction_id")
            request = Framed(pb.SendBatchRequest(producer_group=self.group, count=count), "entries", buffer)
            return SendResults(self._send_call(conn, "SendBatch", request), broker_name)
        if not as_halves:
            # Not retried after an unknown outcome: a task that failed sends again under a new attempt instead.
            head = pb.SendBatchRequest(producer_group=self.group, count=count, transaction_id=transaction_id,
                                       attempt=attempt, coordinator=coordinator)
            request = Framed(head, "entries", buffer)
            return _confirmed(functools.partial(conn.call, conn.stub.SendBatch, request, self.timeout_s),
                              broker_name, transaction_id)
        if attempt or coordinator:
            raise InvalidArgumentError("half messages name their attempt and coordinator in their own properties")
        half = buffer if is_half_batch(buffer) else to_half_batch(buffer, self.group, transaction_id)
        chunks = [(half, count)] if len(half) <= self.batch_limit_bytes else split_entries(half, self.batch_limit_bytes)
        results: SendResults | None = None
        done: list[SendResult | None] = []
        for chunk, n in chunks:
            request = Framed(pb.SendBatchRequest(producer_group=self.group, count=n, transaction_id=transaction_id),
                             "entries", chunk)
            # A transaction's halves are not retried after an unknown outcome: their commit names the attempts
            # whose halves it keeps, so a task that failed sends again under a new attempt instead.
            call = functools.partial(conn.call, conn.stub.SendBatch, request, self.timeout_s)
            part = _stored_so_far(done, functools.partial(_confirmed, call, broker_name, transaction_id))
            done += list(part)
            if results is None:
                results = part
            else:
                results.extend(part)
        assert results is not None
        return results

    def _connection(self, topic: str | None, broker_name: str) -> Connection:
        if not self.router.cluster_mode:
            if broker_name != DIRECT_BROKER:
                raise InvalidArgumentError(f"broker {broker_name!r} named, but this producer talks to one broker")
            return self.router.direct
        if topic is None:
            raise InvalidArgumentError("in a cluster, send_encoded needs the topic whose route names the broker")
        return self.router.broker_connection(topic, broker_name, write=True)

    # ------------------------------------------------------------------------------------------------ attempts
    def _send_with_failover(
        self, topic: str, first: MessageQueue, ordered: bool, request: Callable[[MessageQueue], Any], method: str
    ) -> tuple[MessageQueue, Any]:
        """Send to ``first``; when it certainly stored nothing and the send is not ordered, to another broker's
        queue, up to retry_times_when_send_failed more times."""
        mq, tried = first, [first.broker_name]
        for attempt in range(1 + (0 if ordered else self.retry_times_when_send_failed)):
            try:
                connect = functools.partial(self.router.queue_connection, mq, write=True)
                response = self._send_call(connect, method, request(mq), topic)
            except BrokerError as e:
                if not _movable(e):
                    raise
                self.router.mark_failed(mq.broker_name, topic)
                if ordered:
                    refused = type(e)(
                        f"{e.message} (an ordered send to {mq} is never moved to another queue; it stored nothing)",
                        e.code,
                    )
                    if isinstance(e, BrokerUnreachableError) and isinstance(refused, BrokerUnreachableError):
                        refused.request_sent = e.request_sent  # never reached the broker: safe to send again
                    raise refused from e
                if attempt == self.retry_times_when_send_failed:
                    raise
                nxt = self.select_queue(topic, exclude=frozenset(tried))
                if nxt.broker_name in tried:
                    raise  # no other broker holds the topic
                mq = nxt
                tried.append(mq.broker_name)
                continue
            self.router.mark_ok(mq.broker_name)
            return mq, response
        raise AssertionError("unreachable")

    def _send_call(self, conn: Connection | Callable[[], Connection], method: str, request: Any,
                   topic: str | None = None) -> Any:
        """One send to one broker group: sent again, marked retry, while its outcome is unknown, until
        ``timeout_s``; SendOutcomeUnknownError when no answer came by then. ``conn``: the connection, or how to
        find the group's master (asked again, after a route refresh of ``topic``, for each retry)."""
        connect: Callable[[], Connection] = conn if callable(conn) else (lambda: conn)
        deadline = time.monotonic() + self.timeout_s
        unknown: BrokerError | None = None
        where = "the broker"
        for attempt in itertools.count():
            remaining = deadline - time.monotonic()
            if unknown is not None and remaining <= 0:
                raise SendOutcomeUnknownError(
                    f"no answer from {where} within {self.timeout_s:.0f} s ({unknown.message}): the message may or "
                    "may not be stored (a retry never stores it twice); look it up by its UNIQ_KEY",
                ) from unknown
            try:
                if unknown is not None and topic is not None:
                    self.router.refresh(topic)  # the group's master may have changed: ask the name servers again
                target = connect()
                where = f"broker {target.endpoint}"
                timeout_s = max(0.05, min(self.attempt_timeout_s, remaining))
                if method == "SendMessage" and not self.router.cluster_mode:  # one broker: on its stream
                    response = target.send_message(request, timeout_s)  # (call_stream.py: why not in a cluster)
                else:
                    response = target.call(getattr(target.stub, method), request, timeout_s=timeout_s)
            except BrokerUnreachableError as e:
                if unknown is None and not e.request_sent:
                    raise  # never reached the broker: nothing stored, another broker may take it
                unknown = unknown or e
                request.retry = True
            except BrokerError as e:
                if unknown is None:
                    raise
                if e.code not in _RETRY_UNKNOWN_CODES:  # the first attempt's fate stays unknown whatever this says
                    raise SendOutcomeUnknownError(
                        f"the first attempt got no answer ({unknown.message}) and a retry was refused ({e.message}): "
                        "the message may or may not be stored; look it up by its UNIQ_KEY"
                    ) from e
                # this attempt did nothing (the group elects, the first attempt is still being stored): ask again
            else:
                if getattr(response, "status", pb.SEND_OK) != pb.FLUSH_SLAVE_TIMEOUT:
                    return response
                # stored on the master, not confirmed by its replicas in time: unknown until a retry says
                unknown = unknown or BrokerError("the in-sync replicas did not confirm it in time",
                                                 ResponseCode.FLUSH_SLAVE_TIMEOUT)
                request.retry = True
            time.sleep(RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S) - 1)])
        raise AssertionError("unreachable")

