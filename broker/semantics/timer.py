"""Timer messages: delivery at an absolute time (RocketMQ 5's timer messages), not only at the 18 delay levels.

A message sent with property ``TIMER_DELIVER_MS`` (ms since the epoch; or ``TIMER_DELAY_SEC`` / ``TIMER_DELAY_MS``,
a delay from the send that the broker makes absolute) is stored in ``rmq_sys_wheel_timer`` queue 0 with its real
topic and queue in ``REAL_TOPIC`` / ``REAL_QID``, as RocketMQ's timer store does; when its time comes the timer
thread stores it in its real topic (new msgId, same UNIQ_KEY, body, properties and born time; ``TIMER_DELIVER_MS``
is kept, so a RocketMQ 5 consumer sees the delivery timestamp). A time already past is stored in the real topic at
once. A time further ahead than ``max_delay_ms`` (RocketMQ's timerMaxDelaySec, 3 days) is refused: nothing stored.

Accuracy: the thread sleeps until the earliest pending time (or a new message's arrival), so a message is stored
in its topic within milliseconds of its time on an idle broker (the target is 1 s).

Durability: a timer message is a message in the commit log, acknowledged like any other. Which of them were
delivered is kept in a journal (journal.py, ``config/timer/``): the lowest offset of the timer queue not yet
delivered, and the offsets above it that were. At start the queue is read from that offset and every message not
delivered is scheduled again, so a restart or crash loses none. A delivery made before a crash and missing from the
journal is found at start in the log itself (its copy in the real topic, by UNIQ_KEY: timer_delivered.py) and not
made again, so a timer message is delivered once (RocketMQ's timer delivers it again: at least once). The master also
keeps a copy of that progress in ``config/timerProgress.json`` for its slaves (timer_progress.py), so a promoted
slave does not deliver again what the old master delivered.

Memory: every pending timer message costs some 150 B (its time and offsets, in a heap); ``max_pending`` bounds them
and a send past it is refused with SYSTEM_BUSY (the messages already accepted are always loaded).

Recall (RocketMQ 5's RecallMessage): a send of a timer message is answered with a recall handle (signed as
receipt handles are, receipt_handle.py, with this store's timer secret); ``recall`` with it before the message's
time removes it for good (journaled as if delivered), after it is refused.
"""

from __future__ import annotations

import heapq
import logging
import os
import struct
import threading
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from broker.errors import CorruptionError, InvalidReceiptHandleError, MessageIllegalError, SystemBusyError
from broker.format.message import (
    Prop,
    StoredMessage,
    decode_properties,
    encode_entry,
    encode_properties,
    parse_layout,
    validate_topic,
)
from broker.format.system_topics import TIMER_READER_GROUP, TIMER_TOPIC
from broker.semantics import timer_delivered, timer_progress
from broker.semantics.journal import DEFAULT_COMPACT_BYTES, Journal
from broker.semantics.receipt_handle import Handle, HandleCodec, load_secret
from broker.store import GetStatus, MessageStore, PutStatus

log = logging.getLogger(__name__)

TIMER_FOLDER = "timer"
DEFAULT_MAX_DELAY_MS = 3 * 86_400_000  # RocketMQ's timerMaxDelaySec: 3 days
DEFAULT_MAX_PENDING = 1_000_000  # about 150 MB of heap entries at the most
READ_BATCH = 256  # timer-queue messages read per store call
DELIVER_BATCH = 256  # deliveries per journal record
IDLE_WAIT_S = 5.0  # look at the queue this often even without an arrival notice
RETRY_AFTER_FAILURE_S = 1.0
TIMER_PROPERTIES = (Prop.TIMER_DELIVER_MS, Prop.TIMER_DELAY_SEC, Prop.TIMER_DELAY_MS)
_MARKS = tuple(("\x02" + name + "\x01").encode() for name in TIMER_PROPERTIES)


class TimerDelayError(MessageIllegalError):
    """A timer message whose time is not a number or is further ahead than the broker's maximum delay."""


class TimerRewrite(NamedTuple):
    topic: str
    queue_id: int
    properties: dict[str, str]


def _int_property(props: Mapping[str, str], name: str) -> int | None:
    raw = props.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise TimerDelayError(f"property {name}={raw!r} is not an integer") from None


def deliver_time_ms(props: Mapping[str, str], now_ms: int) -> int | None:
    """The absolute delivery time a message asks for (None: not a timer message)."""
    deliver = _int_property(props, Prop.TIMER_DELIVER_MS)
    if deliver is not None:
        return deliver
    delay_s = _int_property(props, Prop.TIMER_DELAY_SEC)
    if delay_s is not None:
        return now_ms + delay_s * 1000
    delay_ms = _int_property(props, Prop.TIMER_DELAY_MS)
    return None if delay_ms is None else now_ms + delay_ms


class TimerService:
    """Thread-safe; one timer thread while started."""

    def __init__(
        self, store: MessageStore, config_dir: str, *, max_delay_ms: int = DEFAULT_MAX_DELAY_MS,
        max_pending: int = DEFAULT_MAX_PENDING, sync: bool = False, compact_bytes: int = DEFAULT_COMPACT_BYTES,
    ) -> None:
        self.store = store
        self.max_delay_ms, self.max_pending = max_delay_ms, max_pending
        self.folder = os.path.join(config_dir, TIMER_FOLDER)
        self.journal = Journal(self.folder, sync=sync, compact_bytes=compact_bytes)
        self.progress_path = timer_progress.path_in(config_dir)
        self._progress_dirty = False  # deliveries or recalls not yet in the progress file
        self._progress_saved_at = 0.0  # time.monotonic() of the last save
        self.codec: HandleCodec | None = None
        self._lock = threading.Lock()
        self._delivering = threading.Lock()  # one delivery or one recall at a time: a recall never races a delivery
        self._heap: list[tuple[int, int, int]] = []  # (deliver ms, timer-queue offset, commit-log offset)
        self._pending: dict[int, int] = {}  # timer-queue offset -> commit-log offset; insertion (offset) order
        self._done: set[int] = set()  # delivered offsets at or above ``_low``
        self._low = 0  # every timer-queue offset below it is delivered
        self._scanned = 0  # the next timer-queue offset to read
        self._unchecked_from = self._unchecked_below = 0  # see start()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.delivered = 0

    # ------------------------------------------------------------------------------------------ send side
    def rewrite(self, topic: str, queue_id: int, properties: Mapping[str, str] | None) -> TimerRewrite:
        """Where a new message must be stored: unchanged unless it is a timer message whose time is still ahead.
        TimerDelayError past the maximum delay; SystemBusyError when too many are pending."""
        if not properties or not any(name in properties for name in TIMER_PROPERTIES):
            return TimerRewrite(topic, queue_id, dict(properties or {}))
        props = dict(properties)
        now = int(time.time() * 1000)
        deliver = deliver_time_ms(props, now)
        if deliver is None:
            return TimerRewrite(topic, queue_id, props)
        if deliver - now > self.max_delay_ms:
            raise TimerDelayError(
                f"timer message due at {deliver} ms is {deliver - now} ms ahead, more than the broker's maximum delay "
                f"of {self.max_delay_ms} ms (timer_max_delay_ms); nothing stored"
            )
        props.pop(Prop.TIMER_DELAY_SEC, None)
        props.pop(Prop.TIMER_DELAY_MS, None)
        props.pop(Prop.DELAY, None)  # a time wins over a delay level
        props[Prop.TIMER_DELIVER_MS] = str(deliver)
        if deliver <= now:
            return TimerRewrite(topic, queue_id, props)
        if len(self._pending) >= self.max_pending:
            raise SystemBusyError(
                f"{len(self._pending)} timer messages are pending, the broker's limit (timer_max_pending); send "
                "again later"
            )
        props[Prop.REAL_TOPIC] = topic
        props[Prop.REAL_QID] = str(queue_id)
        return TimerRewrite(TIMER_TOPIC, 0, props)

    @staticmethod
    def batch_has_timer(properties: bytes | bytearray) -> bool:
        """Whether any entry may carry a timer property, given the batch's ``batch_properties`` (a cheap search;
        rewrite_batch checks entry by entry)."""
        return any(mark[1:] in properties for mark in _MARKS)

    def rewrite_batch(self, buffer: bytes) -> bytes:
        """A client batch with every timer entry re-addressed (the others unchanged, order kept)."""
        out: list[bytes] = []
        pos, end = 0, len(buffer)
        while pos < end:
            try:
                lay = parse_layout(buffer, pos, end)
            except (CorruptionError, struct.error, IndexError) as e:
                raise MessageIllegalError(f"batch entry {len(out)} (at byte {pos}) is malformed: {e}") from None
            h = lay.header
            raw_props = buffer[lay.props_start : lay.props_start + lay.props_len]
            entry = buffer[pos : pos + h.total_size]
            if any(mark in b"\x02" + raw_props for mark in _MARKS):
                topic = buffer[lay.topic_start : lay.topic_start + lay.topic_len].decode("ascii", "replace")
                t, q, props = self.rewrite(topic, h.queue_id, decode_properties(raw_props))
                body = buffer[lay.body_start : lay.body_start + h.body_length]
                entry = encode_entry(
                    validate_topic(t), q, body, encode_properties(props), flag=h.flag, sys_flag=h.sys_flag,
                    born_timestamp=h.born_timestamp, born_ip=h.born_ip, born_port=h.born_port,
                    reconsume_times=h.reconsume_times,
                )
            out.append(entry)
            pos += h.total_size
        return b"".join(out)

    # ------------------------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.codec = HandleCodec(load_secret(self.folder))
        self.journal.recover(self._restore, self._apply)
        # A promoted slave's journal is older than the old master's copy of the progress (or empty): the newer wins.
        copy = timer_progress.load(self.progress_path)
        self._low, self._done = timer_progress.merge(self._low, self._done, copy, self.store.max_phys_offset())
        self._scanned = self._low
        self._scan()
        self._done = {o for o in self._done if o >= self._low}
        # Deliveries made after the last records (a crash, a failover) are in the log: found, not made again.
        due_by = int(time.time() * 1000) + timer_delivered.CLOCK_SLACK_MS  # the old master's clock may run ahead
        found = timer_delivered.delivered(self.store, (e for e in sorted(self._heap) if e[0] <= due_by))
        if found:
            self._record(found)
        # timer-queue offsets from here on, stored below this log end, were not looked at above: at their time
        self._unchecked_from, self._unchecked_below = self._scanned, self.store.max_phys_offset()
        log.info("timer: %d messages pending after recovery (queue offsets from %d)", len(self._pending), self._low)
        self.store.add_arrival_listener(self._on_arrival)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="timer", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._save_progress(force=True)
        with self._lock:
            if self.journal.behind:  # changes made while the disk was full: their last chance to be written
                try:
                    self.journal.checkpoint({"low": self._low, "done": sorted(self._done)})
                except OSError as e:
                    log.error("timer: checkpoint at shutdown failed: %s", e)
        self.journal.close()

    def pending_count(self) -> int:
        return len(self._pending)

    def _restore(self, state: dict[str, Any] | None) -> None:
        if state is not None:
            self._low = int(state["low"])
            self._done = {int(o) for o in state.get("done", ())}

    def _apply(self, record: dict[str, Any]) -> None:
        self._done.update(int(o) for o in record.get("d", ()))

    # ------------------------------------------------------------------------------------------ recall
    def recall_handle(self, topic: str, timer_offset: int, deliver_ms: int) -> str:
        """The handle a send of a timer message is answered with (its timer-queue offset, signed)."""
        assert self.codec is not None
        return self.codec.encode("", topic, Handle(0, timer_offset, 0, deliver_ms))

    def recall(self, topic: str, handle: str) -> str:
        """Remove a timer message before its time; returns its message id (UNIQ_KEY). InvalidReceiptHandleError
        for a handle not issued here for ``topic``, or a message already delivered or recalled."""
        if self.codec is None:
            raise InvalidReceiptHandleError("the timer service is not started")
        offset = self.codec.decode("", topic, handle).offset
        with self._delivering:
            with self._lock:
                clo = self._pending.get(offset)
            if clo is None:
                raise InvalidReceiptHandleError(
                    f"timer message {offset} of {topic!r} is already delivered or recalled: nothing to recall"
                )
            msg = self.store.lookup_message(clo)
            self._record([offset])
        self._wake.set()  # the timer thread saves the progress file, which the slaves copy: the recall is in it
        return (msg.properties.get(Prop.UNIQ_KEY) or msg.msg_id) if msg is not None else ""

    # ------------------------------------------------------------------------------------------ timer thread
    def _on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        if topic == TIMER_TOPIC:
            self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._scan()
                wait_s = self._deliver_due()
            except Exception:
                # Broad on purpose: the timer thread must outlive any one failure, or no timer message is ever
                # delivered again until a restart.
                log.exception("timer: delivery failed; retrying in %.1f s", RETRY_AFTER_FAILURE_S)
                wait_s = RETRY_AFTER_FAILURE_S
            self._save_progress()
            if self._progress_dirty:  # saved at most every SAVE_INTERVAL_S: come back for the rest
                wait_s = min(wait_s, timer_progress.SAVE_INTERVAL_S)
            self._wake.wait(wait_s)
            self._wake.clear()

    def _scan(self) -> None:
        """Schedule the timer queue's messages from ``_scanned`` on (skipping those already delivered)."""
        while True:
            res = self.store.get_message(TIMER_READER_GROUP, TIMER_TOPIC, 0, self._scanned, READ_BATCH)
            if res.status is not GetStatus.FOUND:
                if res.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_FOUND_NULL) and \
                        res.next_begin_offset > self._scanned:
                    log.error("timer: queue offsets %d..%d expired before delivery", self._scanned,
                              res.next_begin_offset)
                    self._scanned = res.next_begin_offset
                    continue
                return
            with self._lock:
                for msg in res.messages():
                    self._schedule(msg)
                self._scanned = max(self._scanned, res.next_begin_offset)
                if not self._pending:
                    self._advance_low()

    def _schedule(self, msg: StoredMessage) -> None:
        offset = msg.queue_offset
        if offset in self._done or offset < self._low:
            return
        try:
            deliver = int(msg.properties.get(Prop.TIMER_DELIVER_MS, ""))
        except ValueError:
            deliver = 0  # stored by hand without a time: deliver it now rather than never
        self._pending[offset] = msg.commitlog_offset
        heapq.heappush(self._heap, (deliver, offset, msg.commitlog_offset))

    def _deliver_due(self) -> float:
        done: list[int] = []
        wait_s = IDLE_WAIT_S
        try:
            while self._heap and not self._stop.is_set():
                deliver, offset, clo = self._heap[0]
                now = int(time.time() * 1000)
                if deliver > now:
                    wait_s = min(IDLE_WAIT_S, (deliver - now) / 1000)
                    break
                with self._delivering:
                    if offset not in self._pending:  # recalled
                        heapq.heappop(self._heap)
                        continue
                    if offset >= self._unchecked_from and clo < self._unchecked_below and \
                            timer_delivered.has_copy(self.store, deliver, clo):
                        pass  # delivered before the last records (a failover): recorded now, not made again
                    elif not self._deliver(clo):
                        wait_s = RETRY_AFTER_FAILURE_S
                        break
                    heapq.heappop(self._heap)
                    self._pending.pop(offset, None)  # delivered: no recall from here on
                done.append(offset)
                if len(done) >= DELIVER_BATCH:
                    self._record(done)
                    done = []
        finally:
            if done:
                self._record(done)
        return wait_s

    def _record(self, offsets: list[int]) -> None:
        self.journal.append({"d": offsets})
        with self._lock:
            for o in offsets:
                self._pending.pop(o, None)
                self._done.add(o)
            self._advance_low()
            self._progress_dirty = True
            if self.journal.due:
                self.journal.checkpoint({"low": self._low, "done": sorted(self._done)})

    def _save_progress(self, force: bool = False) -> None:
        """The progress file, when deliveries changed it and SAVE_INTERVAL_S passed since the last save (``force``:
        whenever it changed). A failed save is tried again next time: the journal holds the truth meanwhile."""
        now = time.monotonic()
        if not self._progress_dirty or (not force and now - self._progress_saved_at < timer_progress.SAVE_INTERVAL_S):
            return
        with self._lock:
            low, done = self._low, set(self._done)
            self._progress_dirty = False
        log_end = self.store.max_phys_offset()  # read after them: past every delivery they name
        try:
            timer_progress.save(self.progress_path, low, done, log_end)
        except OSError as e:
            self._progress_dirty = True
            log.warning("timer: could not save %s: %s", self.progress_path, e)
        self._progress_saved_at = now

    def _advance_low(self) -> None:
        low = next(iter(self._pending), self._scanned)
        if low > self._low:
            self._low = low
            self._done = {o for o in self._done if o >= low}

    def _deliver(self, commitlog_offset: int) -> bool:
        """Store one due message in its real topic. False: retry later (the store refused for now)."""
        msg = self.store.lookup_message(commitlog_offset)
        if msg is None:
            log.error("timer message at commit-log offset %d expired before its time; skipped", commitlog_offset)
            return True
        real_topic = msg.properties.get(Prop.REAL_TOPIC)
        real_qid = msg.properties.get(Prop.REAL_QID, "")
        if not real_topic or not real_qid.isdigit():
            log.error("timer message %s has no valid REAL_TOPIC/REAL_QID (%r, %r); skipped", msg.msg_id, real_topic,
                      real_qid)
            return True
        if self.store.deleted_generation(real_topic, msg.commitlog_offset):
            # timed before its topic was deleted: it went with it (a topic made again under the name is another)
            log.info("timer message %s: topic %r was deleted since; dropped", msg.msg_id, real_topic)
            return True
        ip, _, port = msg.born_host.rpartition(":")
        res = self.store.put_message(
            real_topic, int(real_qid), msg.body, msg.properties, flag=msg.flag, sys_flag=msg.sys_flag,
            born_timestamp=msg.born_timestamp, born_host=(ip or "127.0.0.1", int(port) if port.isdigit() else 0),
            reconsume_times=msg.reconsume_times,
            wait_store_ok=None,  # SYNC_FLUSH: on disk before the journal says delivered
        )
        if res.status in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
            self.delivered += 1
            return True
        if res.status in (PutStatus.MESSAGE_ILLEGAL, PutStatus.PROPERTIES_SIZE_EXCEEDED):
            log.error("timer message %s refused by %s: %s; skipped", msg.msg_id, real_topic, res.error)
            return True
        log.warning("timer: storing %s: %s %s; will retry", msg.msg_id, res.status.name, res.error)
        return False
