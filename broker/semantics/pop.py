"""Pop consumption (RocketMQ 5's consumption model): receive with an invisible time, ack, change invisible time.

A consumer of a group asks for messages of a topic (one queue, or every queue of the topic on this broker). Each
message it gets stays invisible to the rest of the group for the invisible time; an ack ends it; when the time
passes without an ack it is delivered again, to any consumer of the group, with its delivery attempt + 1. Once a
message was delivered ``max attempts`` times (the group's retryMaxTimes + 1, 17 by default) and the last delivery
expired too, it goes to ``%DLQ%{group}`` instead. A group whose ``consumeMessageOrderly`` is set is FIFO: a message
group's next message is not delivered while an earlier one of it is out (pop_book.py says how).

Bookkeeping is ``PopBook`` (pop_book.py); every change to it is appended to the pop journal (journal.py, in
``config/pop/``) before the request is answered, so a broker restart or crash neither loses a message nor forgets
one in flight: a received message stays invisible until its time across a restart, and a message acked before the
crash is never delivered again. In a replicated group the records go into the replicated commit log instead, and a
request is answered once the in-sync replicas hold them, so the same holds across a failover (pop_log.py).

Receipt handles are signed (receipt_handle.py) and checked against the book: one that is expired, acked, or
superseded by a later delivery or change of invisible time is refused.

Differences from RocketMQ, on purpose:

* a message is delivered again from where it lies (RocketMQ does so for FIFO groups only, and copies other
  messages into a retry topic first): same message, same ids, no copy, and no duplicate if the broker stops
  between a copy and its ack. The group's consume offset stays at its lowest outstanding message;
* the messages a FIFO group holds back wait per message group, not per queue.

A dead-lettered message is stored in ``%DLQ%{group}`` before its record is removed: a crash between the two
stores it there a second time on the next expiry (at least once, as RocketMQ's revive).

Long polling: a pop that finds nothing waits for a message to arrive on one of its queues (the store's arrival
listener, as pulls), for a held-back or invisible message to become due, or for its timeout.

Auto-renew (RocketMQ 5 PushConsumers): a delivery made with ``auto_renew_owner`` stays invisible, extended by the
broker every time it comes within ``RENEW_AHEAD_MS`` of its end, while its owner is alive, for at most
``MAX_RENEW_MS`` from the delivery; when the owner goes away its messages become due within a second. Renewal
state is in memory: after a restart such messages simply expire at their last extended time.

Attempt ids (RocketMQ 5's retried receives): a receive repeated with the attempt id of one that delivered messages
gets those same deliveries (same handles) while all of them are still out, so a receive whose answer was lost
does not leave its messages invisible (the newest ``MAX_ATTEMPT_IDS`` are remembered, in memory).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from broker.errors import (
    BrokerError,
    FlushSlaveTimeoutError,
    InvalidArgumentError,
    InvalidReceiptHandleError,
    ServiceNotAvailableError,
)
from broker.format.message import Prop, StoredMessage, delivered_sys_flag
from broker.format.subscription import parse_tags, tag_codes, tag_matches
from broker.format.system_topics import dlq_topic
from broker.semantics import pop_ack_undo as acks
from broker.semantics.journal import DEFAULT_COMPACT_BYTES, Journal
from broker.semantics.pop_book import PopBook, QueueKey
from broker.semantics.pop_log import PopLog
from broker.semantics.receipt_handle import Handle, HandleCodec, load_secret
from broker.semantics.retry import DLQ_ORIGIN_MESSAGE_ID, DLQ_ORIGIN_TOPIC
from broker.semantics.subscription_group import SubscriptionGroupManager
from broker.store import GetStatus, MessageStore, PutStatus

log = logging.getLogger(__name__)

POP_FOLDER = "pop"
MAX_BATCH = 1024  # messages one pop returns: its answer is built in memory (RocketMQ's gRPC proxy allows 32)
DEFAULT_MIN_INVISIBLE_MS = 10_000  # RocketMQ proxy's minInvisibleTimeMillsForRecv
DEFAULT_MAX_INVISIBLE_MS = 12 * 3_600_000  # RocketMQ proxy's maxInvisibleTimeMills (12 h)
DEFAULT_MAX_INFLIGHT_PER_QUEUE = 65_536  # outstanding messages per queue and group (about 150 B of memory each)
DEFAULT_AUTO_RENEW_INVISIBLE_MS = 60_000  # RocketMQ proxy's defaultInvisibleTimeMills for auto-renew receives
RENEW_AHEAD_MS = 10_000  # extend an auto-renewed delivery this long before it ends (RocketMQ: 10 s)
MAX_RENEW_MS = 3 * 3_600_000  # and for at most this long after the delivery (RocketMQ: 3 h)
RELEASE_MS = 1_000  # a gone owner's messages become due this soon (RocketMQ: 1 s)
MAX_ATTEMPT_IDS = 10_000  # receives remembered by attempt id (the newest; a PushConsumer repeats only its last)
HOLD_RECHECK_MS = 5_000  # a held pop looks again at least this often even without a wake-up
READ_CHUNK = 256  # new messages read from a queue per store call
DISPATCH_LAG_WAIT_S = 0.2  # how long a pop that found nothing waits for a dispatcher behind the commit log


@dataclass
class PopDelivery:
    message: StoredMessage
    handle: str
    attempt: int  # delivery attempt, from 1 (stored reconsume times included)
    invisible_until_ms: int
    entry: bytes | None = None  # the commit-log entry as stored, when the pop read it from the queue


@dataclass
class PopRequest:
    group: str
    topic: str
    queue_id: int = -1  # < 0: every readable queue of the topic on this broker
    max_msgs: int = 32
    invisible_ms: int = 30_000
    expression_type: str = "TAG"
    expression: str = "*"
    long_poll_ms: int = 0
    auto_renew_owner: str = ""  # non-empty: renewed by the broker while this client is alive
    attempt_id: str = ""  # a receive repeated with the same id gets the same messages while they are still out


class PopService:
    """Thread-safe; one per broker. ``start`` recovers the book from the journal."""

    def __init__(
        self, store: MessageStore, groups: SubscriptionGroupManager, config_dir: str, *,
        read_queue_nums: Callable[[str], int], committed_offset: Callable[[str, str, int], int | None],
        commit_offset: Callable[[str, str, int, int], None], create_dlq: Callable[[str], None],
        admit: Callable[[str, str], None] | None = None,
        message_filter: Callable[[str, str], Callable[[StoredMessage], bool] | None] | None = None,
        sync: bool = False, min_invisible_ms: int = DEFAULT_MIN_INVISIBLE_MS,
        max_invisible_ms: int = DEFAULT_MAX_INVISIBLE_MS, max_inflight_per_queue: int = DEFAULT_MAX_INFLIGHT_PER_QUEUE,
        auto_renew_invisible_ms: int = DEFAULT_AUTO_RENEW_INVISIBLE_MS, compact_bytes: int = DEFAULT_COMPACT_BYTES,
        can_hold: Callable[[], bool] = lambda: True, client_alive: Callable[[str], bool] = lambda owner: True,
        replicated: Callable[[str], PopLog] | None = None,
    ) -> None:
        self.store, self.groups = store, groups
        self.folder = os.path.join(config_dir, POP_FOLDER)
        self.read_queue_nums, self.committed_offset = read_queue_nums, committed_offset
        self.commit_offset = commit_offset
        self.create_dlq, self.admit, self.message_filter = create_dlq, admit, message_filter
        self.min_invisible_ms, self.max_invisible_ms = min_invisible_ms, max_invisible_ms
        self.max_inflight_per_queue = max_inflight_per_queue
        self.auto_renew_invisible_ms = auto_renew_invisible_ms
        self.can_hold, self.client_alive = can_hold, client_alive
        self.book = PopBook()
        # replicated: (this service's folder) -> its journal in the commit log (pop_log.py)
        self.log = replicated(self.folder) if replicated is not None else None
        self.journal: Journal | PopLog = self.log or Journal(self.folder, sync=sync, compact_bytes=compact_bytes)
        self.codec: HandleCodec | None = None
        self._lock = threading.RLock()
        self._turn: dict[tuple[str, str], itertools.count[int]] = {}
        # attempt id -> the deliveries it got: (queue, offset, seq); RocketMQ's retried FIFO receive gets them again
        self._attempts: OrderedDict[tuple[str, str, str], list[tuple[QueueKey, int, int]]] = OrderedDict()
        # auto-renew: (queue, offset) -> (seq, owner, renew until)
        self._renew: dict[tuple[QueueKey, int], tuple[int, str, int]] = {}
        self._waiters: dict[str, set[threading.Event]] = {}  # topic -> held pops
        self._waiters_lock = threading.Lock()
        self._holding = 0
        self._stopped = False
        self._draining = False
        self.dead_lettered = 0

    # ------------------------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        with self._lock:
            self.journal.recover(self.book.restore, self.book.apply)
            if self.log is not None:
                self.log.checkpoint(self.book.to_state())  # the slaves get the book and the handle secret now
        self.codec = HandleCodec(self.log.secret() if self.log is not None else load_secret(self.folder))
        outstanding = sum(len(q.records) for q in self.book.queues.values())
        log.info("pop: %d queues, %d messages outstanding after recovery", len(self.book.queues), outstanding)
        self.store.add_arrival_listener(self._on_arrival)

    def release_held(self) -> None:
        """Shutdown begins: held pops answer now and no pop holds from here on."""
        self._draining = True
        self._wake_all()

    def shutdown(self) -> None:
        self._stopped = self._draining = True
        self._wake_all()
        with self._lock:
            if self.journal.behind:  # changes made while the disk was full: their last chance to be written
                try:
                    self.journal.checkpoint(self.book.to_state())
                except OSError as e:
                    log.error("pop: checkpoint at shutdown failed: %s", e)
            self.journal.close()

    def held_count(self) -> int:
        return self._holding

    # ------------------------------------------------------------------------------------------ pop
    def _check_invisible(self, invisible_ms: int, minimum: int) -> None:
        if not minimum <= invisible_ms <= self.max_invisible_ms:
            raise InvisibleTimeError(
                f"invisible time {invisible_ms} ms is outside {minimum}..{self.max_invisible_ms} ms"
            )

    def pop(self, req: PopRequest, time_remaining_s: float | None = None) -> list[PopDelivery]:
        """Up to ``max_msgs`` messages, each invisible to the group for ``invisible_ms`` (or auto-renewed); waits up
        to ``long_poll_ms`` when none is there."""
        self._admit()
        found = self._pop(req, time_remaining_s)
        self._settle()
        return found

    def _admit(self) -> None:
        """Replicated: refused before anything changes while too few replicas are in sync (pop_log.py)."""
        if self.log is not None:
            self.log.admit()

    def _settle(self) -> None:
        """Replicated: answered only once every in-sync replica holds this request's records (pop_log.py)."""
        if self.log is not None:
            self.log.settle()

    def _pop(self, req: PopRequest, time_remaining_s: float | None) -> list[PopDelivery]:
        if self._stopped or self.codec is None:
            raise ServiceNotAvailableError("the broker is shutting down; receive from another broker or later")
        if req.auto_renew_owner:
            req.invisible_ms = self.auto_renew_invisible_ms
        else:
            self._check_invisible(req.invisible_ms, self.min_invisible_ms)
        if not 1 <= req.max_msgs <= MAX_BATCH:
            raise InvalidArgumentError(f"batch size {req.max_msgs} is outside 1..{MAX_BATCH}")
        if req.long_poll_ms < 0:
            raise InvalidArgumentError(f"long polling time {req.long_poll_ms} ms is negative")
        if self.admit is not None:
            self.admit(req.group, req.topic)  # group exists and may consume; DLQ topics refused
        queue_count = self.read_queue_nums(req.topic)
        if req.queue_id >= queue_count:
            raise InvalidArgumentError(f"queue {req.queue_id} does not exist: {req.topic!r} has 0..{queue_count - 1}")
        selector = self.message_filter(req.expression_type, req.expression) if self.message_filter else None
        tags = None if selector is not None else parse_tags(req.expression)
        wait_ms = req.long_poll_ms
        if time_remaining_s is not None:
            wait_ms = min(wait_ms, int(time_remaining_s * 1000) - 200)  # answer before the caller's deadline
        if req.attempt_id:
            again = self._same_attempt(req)
            if again:
                return again
        deadline = time.monotonic() + max(wait_ms, 0) / 1000
        waited_for_dispatch = False
        while True:
            event = threading.Event()
            self._watch(req.topic, event)  # before looking: an arrival after the look wakes this pop
            try:
                found, next_due_ms = self._pop_once(req, queue_count, selector, tags)
                if not found and not waited_for_dispatch and self._dispatch_behind():
                    # A send that just returned may not be in its consume queue yet: wait for the dispatcher once
                    # (as pulls do) rather than answer "nothing" to a consumer that follows its producer.
                    waited_for_dispatch = True
                    self.store.wait_dispatched(DISPATCH_LAG_WAIT_S, self.store.max_phys_offset())
                    continue
                remaining_ms = int((deadline - time.monotonic()) * 1000)
                if found and req.attempt_id:
                    self._remember_attempt(req, found)
                if found or remaining_ms <= 0 or self._draining or not self.can_hold():
                    return found
                sleep_ms = min(remaining_ms, HOLD_RECHECK_MS)
                if next_due_ms is not None:
                    sleep_ms = max(1, min(sleep_ms, next_due_ms - _now_ms()))
                with self._waiters_lock:
                    self._holding += 1
                try:
                    event.wait(sleep_ms / 1000)
                finally:
                    with self._waiters_lock:
                        self._holding -= 1
            finally:
                self._unwatch(req.topic, event)

    def _remember_attempt(self, req: PopRequest, found: list[PopDelivery]) -> None:
        assert self.codec is not None
        batch = []
        for p in found:
            h = self.codec.decode(req.group, req.topic, p.handle)
            batch.append(((req.group, req.topic, h.queue_id), h.offset, h.seq))
        with self._lock:
            self._attempts[(req.group, req.topic, req.attempt_id)] = batch
            while len(self._attempts) > MAX_ATTEMPT_IDS:
                self._attempts.popitem(last=False)

    def _same_attempt(self, req: PopRequest) -> list[PopDelivery]:
        """The deliveries an earlier receive with this attempt id got, when every one is still current (its answer
        was lost and the client asks again); else nothing, and the receive goes on as a new one."""
        with self._lock:
            batch = self._attempts.get((req.group, req.topic, req.attempt_id))
            if not batch:
                return []
            now, out = _now_ms(), []
            for key, offset, seq in batch:
                q = self.book.queues.get(key)
                r = q.records.get(offset) if q else None
                msg = self._lookup(key, offset, r.commitlog_offset) if r is not None else None
                if r is None or r.seq != seq or r.visible_at_ms <= now or msg is None:
                    return []
                out.append(self._popped(key, offset, msg))
            return out

    def _dispatch_behind(self) -> bool:
        return self.store.dispatched_offset() < self.store.max_phys_offset()

    def _queues(self, req: PopRequest, queue_count: int) -> list[int]:
        if req.queue_id >= 0:
            return [req.queue_id]
        turn = self._turn.setdefault((req.group, req.topic), itertools.count())
        start = next(turn) % max(queue_count, 1)
        return [(start + i) % queue_count for i in range(queue_count)]

    def _pop_once(
        self, req: PopRequest, queue_count: int, selector: Callable[[StoredMessage], bool] | None,
        tags: frozenset[str] | None,
    ) -> tuple[list[PopDelivery], int | None]:
        cfg = self.groups.get(req.group)
        fifo, max_attempts = cfg.consume_message_orderly, cfg.retry_max_times + 1
        out: list[PopDelivery] = []
        next_due: int | None = None
        with self._lock:
            for queue_id in self._queues(req, queue_count):
                if len(out) >= req.max_msgs:
                    break
                key = (req.group, req.topic, queue_id)
                self._ensure_queue(key, cfg.consume_from_min_enable)
                now = _now_ms()
                self._dead_letter_due(key, now, fifo, max_attempts)
                out += self._redeliver(key, req, now, fifo)
                if len(out) < req.max_msgs:
                    out += self._read_new(key, req, now, fifo, selector, tags, req.max_msgs - len(out))
                due = self.book.next_visible_ms(key)
                if due is not None and due > 0:
                    next_due = due if next_due is None else min(next_due, due)
        return out, next_due

    def _ensure_queue(self, key: QueueKey, from_min: bool) -> None:
        if self.book.queue(key) is not None:
            return
        group, topic, queue_id = key
        start = self.committed_offset(group, topic, queue_id)
        if start is None:
            start = self.store.min_offset(topic, queue_id) if from_min else self.store.max_offset(topic, queue_id)
        self.journal.append(self.book.start(key, start))

    def _handle(self, key: QueueKey, offset: int) -> tuple[str, int]:
        assert self.codec is not None
        r = self.book.queues[key].records[offset]
        return self.codec.encode(key[0], key[1], Handle(key[2], offset, r.seq, r.visible_at_ms)), r.visible_at_ms

    def _popped(self, key: QueueKey, offset: int, msg: StoredMessage, entry: bytes | None = None) -> PopDelivery:
        handle, until = self._handle(key, offset)
        attempts = self.book.queues[key].records[offset].attempts
        return PopDelivery(msg, handle, max(msg.reconsume_times, 0) + attempts, until, entry)

    def _lookup(self, key: QueueKey, offset: int, clo: int) -> StoredMessage | None:
        msg = self.store.lookup_message(clo)
        if msg is None or msg.topic != key[1] or msg.queue_id != key[2] or msg.queue_offset != offset:
            return None  # expired (or the topic was deleted and made again)
        return msg

    def _redeliver(self, key: QueueKey, req: PopRequest, now: int, fifo: bool) -> list[PopDelivery]:
        due = self.book.due(key, now, fifo)[: req.max_msgs]
        if not due:
            return []
        q = self.book.queues[key]
        found: list[tuple[int, StoredMessage]] = []
        gone: list[int] = []
        for offset in due:
            msg = self._lookup(key, offset, q.records[offset].commitlog_offset)
            if msg is None:
                gone.append(offset)
            else:
                found.append((offset, msg))
        if gone:
            log.warning("pop %s: %d outstanding messages no longer exist (expired); dropped", key, len(gone))
            self.journal.append(self.book.remove(key, gone))
        if not found:
            return []
        self.journal.append(self.book.deliver(key, [o for o, _ in found], now, req.invisible_ms))
        self._track_renewal(key, [o for o, _ in found], req, now)
        return [self._popped(key, o, m) for o, m in found]

    def _read_new(
        self, key: QueueKey, req: PopRequest, now: int, fifo: bool, selector: Callable[[StoredMessage], bool] | None,
        tags: frozenset[str] | None, limit: int,
    ) -> list[PopDelivery]:
        q = self.book.queues[key]
        room = self.max_inflight_per_queue - len(q.records)
        if room <= 0:
            return []  # the queue's window is full: what is outstanding must be acked first
        group, topic, queue_id = key
        # FIFO reads ahead (messages held behind their group are skipped over); otherwise what will be delivered
        want = min(room, READ_CHUNK) if fifo else min(room, limit)
        res = self.store.get_message(group, topic, queue_id, q.next_offset, want, None, tag_codes(tags),
                                     message_filter=selector)
        if res.status is GetStatus.OFFSET_TOO_SMALL or (
            res.status in (GetStatus.NO_MATCHED_MESSAGE, GetStatus.OFFSET_FOUND_NULL)
            and res.next_begin_offset > q.next_offset
        ):
            self.journal.append(self.book.admit(key, [], res.next_begin_offset, now, req.invisible_ms, fifo, 0)[0])
            return []
        if res.status is not GetStatus.FOUND:
            return []
        decoded = res.messages()
        ends = [*res.entry_positions[1:], len(res.buffer)]
        entries = {m.queue_offset: res.buffer[p:e] for m, p, e in zip(decoded, res.entry_positions, ends, strict=True)}
        messages = {m.queue_offset: m for m in decoded}
        candidates = []
        for offset, msg in sorted(messages.items()):
            if tags is not None and not tag_matches(tags, msg.tags):
                continue  # a tag whose hash only collided: done for this group, as RocketMQ acks it
            candidates.append((offset, msg.commitlog_offset, msg.properties.get(Prop.SHARDING_KEY, "")))
        record, delivered = self.book.admit(key, candidates, res.next_begin_offset, now, req.invisible_ms, fifo, limit)
        self.journal.append(record)
        self._track_renewal(key, delivered, req, now)
        return [self._popped(key, o, messages[o], entries[o]) for o in delivered]

    def _track_renewal(self, key: QueueKey, offsets: list[int], req: PopRequest, now: int) -> None:
        if not req.auto_renew_owner:
            return
        q = self.book.queues[key]
        for offset in offsets:
            self._renew[(key, offset)] = (q.records[offset].seq, req.auto_renew_owner, now + MAX_RENEW_MS)

    # ------------------------------------------------------------------------------------------ ack, change
    def _decode(self, group: str, topic: str, handle: str) -> tuple[QueueKey, Handle]:
        if self.codec is None:
            raise ServiceNotAvailableError("the pop service is not started")
        h = self.codec.decode(group, topic, handle)
        return (group, topic, h.queue_id), h

    def ack(self, group: str, topic: str, handle: str) -> None:
        key, h = self._decode(group, topic, handle)
        self._admit()
        with self._lock:
            taken = {key: {h.offset: self.book.check(key, h.offset, h.seq, _now_ms())}}
            acks.remove(self.book, self.journal, taken)
            self._renew.pop((key, h.offset), None)
        self._settle_acks(taken)
        self._wake(topic)  # a FIFO group's next message may be due now

    def _settle_acks(self, taken: acks.Taken) -> None:
        """Answered once the replicas hold the acks; refused, they are undone first (pop_ack_undo.py)."""
        try:
            self._settle()
        except FlushSlaveTimeoutError as e:
            with self._lock:
                acks.undo(self.book, self.journal, taken)
            raise FlushSlaveTimeoutError(
                "the in-sync replicas did not confirm the ack in time; it is undone on this master (the message is "
                "delivered again after its invisible time, and its handle may ack again), but a master elected "
                "meanwhile may hold it"
            ) from e

    def ack_many(self, group: str, topic: str, handles: list[str]) -> list[BrokerError | None]:
        """Ack several deliveries with one journal record per queue; per handle None (acked) or why not."""
        results: list[BrokerError | None] = []
        done: acks.Taken = {}
        self._admit()
        with self._lock:
            now = _now_ms()
            for handle in handles:
                try:
                    key, h = self._decode(group, topic, handle)
                    if h.offset in done.get(key, ()):
                        raise InvalidReceiptHandleError(f"{topic}/{h.queue_id}@{h.offset} is acked twice in one call")
                    done.setdefault(key, {})[h.offset] = self.book.check(key, h.offset, h.seq, now)
                except BrokerError as e:
                    results.append(e)
                    continue
                self._renew.pop((key, h.offset), None)
                results.append(None)
            acks.remove(self.book, self.journal, done)
        self._settle_acks(done)
        if done:
            self._wake(topic)
        return results

    def release(self, handles: list[tuple[str, str, str]]) -> None:
        """Deliveries whose answer never reached the consumer (its call ended first): due again within a second
        (RocketMQ's proxy does the same). Best effort: a handle no longer current is left as it is."""
        for group, topic, handle in handles:
            try:
                self.change_invisible(group, topic, handle, RELEASE_MS)
            except BrokerError as e:
                log.info("releasing an undelivered message of %s/%s: %s", group, topic, e.message)

    def change_invisible(self, group: str, topic: str, handle: str, invisible_ms: int) -> PopDelivery:
        """A new invisible time from now; returns the message's new handle (the old one is superseded)."""
        self._check_invisible(invisible_ms, 0)
        key, h = self._decode(group, topic, handle)
        self._admit()
        with self._lock:
            record, _ = self.book.change(key, h.offset, h.seq, _now_ms(), invisible_ms)
            self.journal.append(record)
            self._renew.pop((key, h.offset), None)
            r = self.book.queues[key].records[h.offset]
            msg = self._lookup(key, h.offset, r.commitlog_offset)
            new_handle, until = self._handle(key, h.offset)
        self._settle()
        if msg is None:
            raise InvalidArgumentError(f"message {topic}/{h.queue_id}@{h.offset} no longer exists (expired)")
        return PopDelivery(msg, new_handle, max(msg.reconsume_times, 0) + r.attempts, until)

    def forward_to_dlq(self, group: str, topic: str, handle: str) -> str:
        """Store the message a current handle names in %DLQ%{group}, then end it (RocketMQ 5's
        ForwardMessageToDeadLetterQueue). Returns the DLQ topic."""
        key, h = self._decode(group, topic, handle)
        self._admit()
        with self._lock:
            r = self.book.check(key, h.offset, h.seq, _now_ms())
            msg = self._lookup(key, h.offset, r.commitlog_offset)
            if msg is not None:
                self._store_dead_letter(group, msg, r.attempts)
            self.journal.append(self.book.remove(key, [h.offset]))
            self._renew.pop((key, h.offset), None)
        self._settle()
        self._wake(topic)
        return dlq_topic(group)

    # ------------------------------------------------------------------------------------------ dead letters
    def _dead_letter_due(self, key: QueueKey, now: int, fifo: bool, max_attempts: int) -> None:
        q = self.book.queues.get(key)
        if q is None:
            return
        done = [o for o in self.book.due(key, now, fifo) if q.records[o].attempts >= max_attempts]
        for offset in done:
            r = q.records[offset]
            msg = self._lookup(key, offset, r.commitlog_offset)
            if msg is not None:
                self._store_dead_letter(key[0], msg, r.attempts)
        if done:
            self.journal.append(self.book.remove(key, done))

    def _store_dead_letter(self, group: str, msg: StoredMessage, attempts: int) -> None:
        props = dict(msg.properties)
        message_id = props.get(Prop.UNIQ_KEY) or msg.msg_id
        props[DLQ_ORIGIN_TOPIC] = msg.topic
        props[DLQ_ORIGIN_MESSAGE_ID] = message_id
        props.setdefault(Prop.ORIGIN_MESSAGE_ID, message_id)
        props.pop(Prop.DELAY, None)
        topic = dlq_topic(group)
        self.create_dlq(topic)
        ip, _, port = msg.born_host.rpartition(":")
        put = self.store.put_message(
            topic, 0, msg.body, props, flag=msg.flag,
            sys_flag=delivered_sys_flag(msg.sys_flag, msg.prepared_transaction_offset),
            born_timestamp=msg.born_timestamp,
            born_host=(ip or "127.0.0.1", int(port) if port.isdigit() else 0),
            reconsume_times=max(msg.reconsume_times, 0) + attempts, wait_store_ok=None,
        )
        if put.status not in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
            raise ServiceNotAvailableError(f"dead letter of {message_id} not stored ({put.status.name}: {put.error})")
        self.dead_lettered += 1
        log.info("message %s of group %s delivered %d times: moved to %s", message_id, group, attempts, topic)

    # ------------------------------------------------------------------------------------------ periodic
    def revive(self) -> None:
        """Periodic (about every second): dead letters that nobody popped, auto-renewals, group offsets, and a
        journal checkpoint when one is due."""
        now = _now_ms()
        with self._lock:
            for key in self.book.queue_keys():
                cfg = self.groups.find(key[0])
                if cfg is not None:
                    self._dead_letter_due(key, now, cfg.consume_message_orderly, cfg.retry_max_times + 1)
            self._renew_due(now)
            bases = [(k, q.base) for k, q in self.book.queues.items()]
            if self.journal.due:
                self.journal.checkpoint(self.book.to_state())
        for (group, topic, queue_id), base in bases:
            self.commit_offset(group, topic, queue_id, base)

    def _renew_due(self, now: int) -> None:
        for (key, offset), (seq, owner, until) in list(self._renew.items()):
            q = self.book.queues.get(key)
            r = q.records.get(offset) if q else None
            if r is None or r.seq != seq or now >= until:
                del self._renew[(key, offset)]
                continue
            if not self.client_alive(owner):
                del self._renew[(key, offset)]
                self.journal.append(self.book.renew(key, offset, min(r.visible_at_ms, now + RELEASE_MS)))
            elif r.visible_at_ms - now < RENEW_AHEAD_MS:
                self.journal.append(self.book.renew(key, offset, min(now + self.auto_renew_invisible_ms, until)))

    def release_client(self, owner: str) -> None:
        """A client went away (NotifyClientTermination): its auto-renewed messages become due within a second."""
        now = _now_ms()
        with self._lock:
            for (key, offset), (_seq, who, _until) in list(self._renew.items()):
                if who == owner:
                    del self._renew[(key, offset)]
                    r = self.book.queues[key].records.get(offset)
                    if r is not None:
                        self.journal.append(self.book.renew(key, offset, min(r.visible_at_ms, now + RELEASE_MS)))

    def forget_topic(self, topic: str) -> None:
        """The topic was deleted: its bookkeeping goes with it."""
        with self._lock:
            self.book.forget([k for k in self.book.queue_keys() if k[1] == topic])
            self.journal.checkpoint(self.book.to_state())

    def stats(self) -> dict[str, float]:
        with self._lock:
            return {"pop_outstanding": float(sum(len(q.records) for q in self.book.queues.values())),
                    "pop_dead_lettered": float(self.dead_lettered)}

    # ------------------------------------------------------------------------------------------ long polling
    def _watch(self, topic: str, event: threading.Event) -> None:
        with self._waiters_lock:
            self._waiters.setdefault(topic, set()).add(event)

    def _unwatch(self, topic: str, event: threading.Event) -> None:
        with self._waiters_lock:
            events = self._waiters.get(topic)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiters[topic]

    def _wake(self, topic: str) -> None:
        with self._waiters_lock:
            events = list(self._waiters.get(topic, ()))
        for e in events:
            e.set()

    def _wake_all(self) -> None:
        with self._waiters_lock:
            events = [e for es in self._waiters.values() for e in es]
        for e in events:
            e.set()

    def _on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        if topic in self._waiters:  # a dict lookup without the lock: the dispatcher thread must stay cheap
            self._wake(topic)


class InvisibleTimeError(InvalidArgumentError):
    """An invisible time outside what the broker allows (RocketMQ 5: ILLEGAL_INVISIBLE_TIME)."""


def _now_ms() -> int:
    return int(time.time() * 1000)
