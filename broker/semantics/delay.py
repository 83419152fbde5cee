"""Delay levels: RocketMQ's ``ScheduleMessageService``.

A message sent with property ``DELAY`` = level (1..N) is not stored in its topic. ``rewrite_for_delay`` (or the
``put_message`` wrapper) stores it in ``SCHEDULE_TOPIC_XXXX``, queue ``level - 1``, with its real topic and queue
in ``REAL_TOPIC`` / ``REAL_QID``; levels above the highest are clamped to it. One timer thread per level reads
its queue in order (every message of a queue has the same delay and store timestamps never go back, so due times
are ordered too) and, once ``store_timestamp + delay`` has passed, re-stores the message in its real topic: new
msgId, same body, flag, keys, properties (minus ``DELAY``), born time/host and reconsume count. The next queue
offset to deliver per level is kept in ``config/delayOffset.json`` (RocketMQ's file and shape), written atomically
after every delivered batch. A crash (or a failover: the file reaches the slaves by the metadata sync, seconds
behind) between a delivery and the write would deliver that batch again, as RocketMQ does; instead, a level starting
(or a replica taking office) first asks the message index, for each message it is about to deliver, whether a copy
with its UNIQ_KEY was already stored in the real topic after it (the delivered copy is in the commit log, so in
every in-sync replica's log and index, as timer_delivered.py explains for timers), and skips it if so, until
``RECHECK_MISSES`` in a row had none; only messages the log held at that start are looked up (the same message
sent back twice has one UNIQ_KEY: a later retry must not take an earlier one's copy for its own). Two retries of
one message both stored before a crash, the first delivered and recorded nowhere, are the case this still gets
wrong: the second is taken as delivered. Without a message index (or a message without UNIQ_KEY) delivery stays at
least once.

Server wiring::

    schedule = ScheduleMessageService(store, store_config.config_dir, levels="1s 5s ...")
    schedule.start()                                   # after store.start(), before serving
    topic, qid, props = schedule.rewrite_for_delay(topic, qid, props)   # before every single put
    # or: schedule.put_message(topic, qid, body, props, **put_kwargs)
    schedule.shutdown()                                # before store.shutdown()

The consume-queue units of ``SCHEDULE_TOPIC_XXXX`` carry the due time in their tag field, as RocketMQ's do (the
store's dispatcher writes it: ``StoreConfig.delay_level_ms``, which the broker fills from the same level table), so
the files read the same. The timer here reads the messages themselves (their store timestamp gives the due time,
``due_time_ms``), so a level table changed between restarts applies to the messages already waiting too.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import threading
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from broker.errors import CorruptionError, InvalidArgumentError, MessageIllegalError
from broker.format.message import (
    Prop,
    StoredMessage,
    decode_properties,
    encode_entry,
    encode_properties,
    parse_layout,
    validate_topic,
)
from broker.format.numbers import MAX_NUMBER_DIGITS, is_ascii_digits
from broker.format.properties import property_number
from broker.format.system_topics import SCHEDULE_READER_GROUP, SCHEDULE_TOPIC
from broker.ha.metadata_sync import LOG_END_KEY
from broker.json_file import load_json, write_json_atomic
from broker.semantics.timer_delivered import CLOCK_SLACK_MS
from broker.store import GetStatus, MessageStore, PutResult, PutStatus

log = logging.getLogger(__name__)

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
DELAY_OFFSET_FILE = "delayOffset.json"
# RocketMQ's timeUnitTable, plus "ms" (a Sluice extension, so that tests and demos need not wait whole seconds)
UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
MAX_LEVELS = 64  # a thread per level: bound them
DELIVER_BATCH = 32  # messages read per get: bounds the work between two progress writes
IDLE_POLL_S = 0.5  # re-check an idle level this often even if no arrival was signalled
RETRY_AFTER_FAILURE_S = 1.0  # after the store refused a re-store (disk full, shutting down)
# Due messages in a row without a delivered copy after which a starting level stops asking the index: the ones its
# progress file missed are the first it reads (a level delivers in order), so a few batches cover them.
RECHECK_MISSES = 4 * DELIVER_BATCH

_DELAY_MARK = ("\x02" + Prop.DELAY + "\x01").encode()  # how a DELAY property starts inside a \x02-led list
_LEVEL_TOKEN = re.compile(r"([1-9][0-9]*)(ms|s|m|h|d)\Z")


class DelayLevels:
    """The level table parsed from RocketMQ's ``messageDelayLevel`` string (``"1s 5s 10s ..."``)."""

    def __init__(self, spec: str = DEFAULT_DELAY_LEVELS) -> None:
        delays: list[int] = []
        for token in spec.split():
            m = _LEVEL_TOKEN.match(token)
            if m is None:
                raise InvalidArgumentError(
                    f"delay level {token!r} in {spec!r}: write a positive integer and a unit ms, s, m, h or d (e.g. 5s)"
                )
            delays.append(int(m.group(1)) * UNIT_MS[m.group(2)])
        if not 1 <= len(delays) <= MAX_LEVELS:
            raise InvalidArgumentError(f"delay levels {spec!r}: give between 1 and {MAX_LEVELS} levels")
        self.spec = spec
        self.delays_ms = delays

    @property
    def max_level(self) -> int:
        return len(self.delays_ms)

    def delay_ms(self, level: int) -> int:
        assert 1 <= level <= self.max_level, level
        return self.delays_ms[level - 1]

    def clamp(self, level: int) -> int:
        return min(level, self.max_level)


class DelayRewrite(NamedTuple):
    topic: str
    queue_id: int
    properties: dict[str, str]


def parse_delay_level(props: Mapping[str, str]) -> int:
    """The DELAY property as an int (0 when absent, or "0": no delay); MessageIllegalError unless it is ASCII
    digits (format.numbers: "-5" was stored as no delay and " 3" taken as 3)."""
    raw = props.get(Prop.DELAY)
    return 0 if raw is None else property_number(Prop.DELAY, raw)


def due_time_ms(store_timestamp_ms: int, delay_ms: int, now_ms: int) -> int:
    """When a scheduled message is due; a due time further away than the delay itself (the clock went back
    since it was stored) counts as due now, as RocketMQ's ``correctDeliverTimestamp`` does."""
    due = store_timestamp_ms + delay_ms
    return now_ms if due > now_ms + delay_ms else due


def _host_tuple(host: str) -> tuple[str, int]:
    ip, _, port = host.rpartition(":")
    return (ip or "127.0.0.1", int(port) if port.isdigit() else 0)


def restore_properties(msg: StoredMessage) -> dict[str, str]:
    """Properties of the message re-stored in its real topic: all of them except DELAY (RocketMQ keeps
    REAL_TOPIC/REAL_QID for tracing)."""
    props = dict(msg.properties)
    props.pop(Prop.DELAY, None)
    return props


class ScheduleMessageService:
    """Delivers delayed messages when due. Thread-safe; one timer thread per level while started."""

    def __init__(
        self,
        store: MessageStore,
        config_dir: str,
        levels: str | DelayLevels = DEFAULT_DELAY_LEVELS,
    ) -> None:
        self.store = store
        self.levels = levels if isinstance(levels, DelayLevels) else DelayLevels(levels)
        self.path = os.path.join(config_dir, DELAY_OFFSET_FILE)
        self._lock = threading.Lock()
        self._offsets: dict[int, int] = {}  # level -> next schedule-queue offset to deliver
        self._extra: dict[str, Any] = {}  # levels present in the file but not configured now: kept as they were
        self._wake = {level: threading.Event() for level in range(1, self.levels.max_level + 1)}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._delivered = 0
        self._listening = False  # the store has no way to remove a listener: add ours once
        self._recheck: dict[int, int] = {}  # level -> due messages still to look up before delivering (module doc)
        self._recheck_below = 0  # commit-log offset: only messages stored before it are looked up
        self._load()

    # ------------------------------------------------------------------------------------------ send side

    def rewrite_for_delay(self, topic: str, queue_id: int, properties: Mapping[str, str] | None) -> DelayRewrite:
        """Where a message must be stored: unchanged without DELAY (or DELAY <= 0), else the schedule queue of its
        (clamped) level with REAL_TOPIC / REAL_QID recorded. Call before the store put of a new message."""
        props = dict(properties or {})
        level = parse_delay_level(props)
        if level <= 0:
            return DelayRewrite(topic, queue_id, props)
        level = self.levels.clamp(level)
        props[Prop.DELAY] = str(level)
        props[Prop.REAL_TOPIC] = topic
        props[Prop.REAL_QID] = str(queue_id)
        return DelayRewrite(SCHEDULE_TOPIC, level - 1, props)

    @staticmethod
    def batch_has_delay(properties: bytes | bytearray) -> bool:
        """Whether any entry may carry a DELAY property, given the batch's ``batch_properties``. A hit may be
        spurious (a value that merely contains the bytes); rewrite_batch_for_delay checks entry by entry."""
        return _DELAY_MARK[1:] in properties

    def rewrite_batch_for_delay(self, buffer: bytes) -> bytes:
        """A client batch with every entry that has DELAY > 0 re-encoded for the schedule queue of its level (the
        others unchanged, order kept). Without any DELAY property the buffer is returned as is, after one substring
        search. MessageIllegalError for a malformed entry or DELAY value. (RocketMQ refuses delayed messages in a
        batch; Sluice delays them one by one.)"""
        if _DELAY_MARK[1:] not in buffer:  # no "DELAY\x01" anywhere: nothing to do (the common case)
            return buffer
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
            if _DELAY_MARK in b"\x02" + raw_props:
                props = decode_properties(raw_props)
                topic = buffer[lay.topic_start : lay.topic_start + lay.topic_len].decode("ascii", "replace")
                t, q, new_props = self.rewrite_for_delay(topic, h.queue_id, props)
                if t != topic:
                    body = buffer[lay.body_start : lay.body_start + h.body_length]
                    entry = encode_entry(
                        validate_topic(t), q, body, encode_properties(new_props), flag=h.flag, sys_flag=h.sys_flag,
                        born_timestamp=h.born_timestamp, born_ip=h.born_ip, born_port=h.born_port,
                        reconsume_times=h.reconsume_times,
                    )
            out.append(entry)
            pos += h.total_size
        return b"".join(out)

    def put_message(
        self, topic: str, queue_id: int, body: bytes, properties: Mapping[str, str] | None = None, **kwargs: Any
    ) -> PutResult:
        """``store.put_message`` after ``rewrite_for_delay``; keyword arguments go to the store unchanged."""
        t, q, props = self.rewrite_for_delay(topic, queue_id, properties)
        return self.store.put_message(t, q, body, props, **kwargs)

    def deliver_tag_code(self, properties: Mapping[str, str], store_timestamp_ms: int) -> int:
        """What RocketMQ writes in the consume-queue tag field of a SCHEDULE_TOPIC_XXXX unit: the due time in ms
        (``computeDeliverTimestamp``). For a dispatcher hook; the timers here do not depend on it."""
        level = self.levels.clamp(max(1, parse_delay_level(properties)))
        return store_timestamp_ms + self.levels.delay_ms(level)

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        assert not self._threads, "already started"
        self._stop.clear()
        if not self._listening:
            self.store.add_arrival_listener(self._on_arrival)
            self._listening = True
        self._recheck_all()
        for level in range(1, self.levels.max_level + 1):
            t = threading.Thread(target=self._run_level, args=(level,), name=f"schedule-level-{level}", daemon=True)
            self._threads.append(t)
            t.start()

    def shutdown(self) -> None:
        self._stop.set()
        for ev in self._wake.values():
            ev.set()
        for t in self._threads:
            t.join(timeout=10)
        self._threads.clear()
        self.persist()

    # ------------------------------------------------------------------------------------------ state

    def offsets(self) -> dict[int, int]:
        """Next schedule-queue offset to deliver, per level."""
        with self._lock:
            return dict(self._offsets)

    @property
    def delivered_count(self) -> int:
        return self._delivered

    def reload(self) -> None:
        """Read the progress file again (a replica taking office: the file is its old master's copy)."""
        with self._lock:
            self._load()
        self._recheck_all()

    def _recheck_all(self) -> None:
        with self._lock:
            self._recheck = {level: RECHECK_MISSES for level in range(1, self.levels.max_level + 1)}
            # Only what the log held at this start can have been delivered by a run before it: a message stored
            # since is delivered by this run alone, and the same message sent back twice (one UNIQ_KEY, two
            # retries) must not take the first retry's copy for its own.
            self._recheck_below = self.store.max_phys_offset()

    def _delivered_before(self, level: int, msg: StoredMessage) -> bool:
        """Whether ``msg`` was delivered by a run whose progress was not recorded (only while rechecking)."""
        with self._lock:
            if self._recheck.get(level, 0) <= 0 or msg.commitlog_offset >= self._recheck_below:
                return False
        found = has_delivered_copy(self.store, msg)
        with self._lock:
            self._recheck[level] = RECHECK_MISSES if found else self._recheck.get(level, 0) - 1
        if found:
            log.warning("schedule level %d: %s was delivered before its progress was recorded (a crash or "
                        "failover); not delivered again", level, msg.msg_id)
        return found

    def _load(self) -> None:
        """Read the file (the caller holds the lock, or is the constructor)."""
        loaded = load_json(self.path, self._parse)
        if loaded is None:
            return
        self._offsets, self._extra, log_end = loaded
        log_now = self.store.max_phys_offset()
        if log_end is not None and log_end > log_now:
            self._cut_back(log_end, log_now)

    def _cut_back(self, log_end: int, log_now: int) -> None:
        """The file was saved when the log reached ``log_end``, and the log now ends before: it was cut back (a
        replica truncated to where it agrees with its new master, or an ASYNC_FLUSH log that lost its unflushed
        tail in a crash). Deliveries the file counts past a level's queue end were of the entries cut away, and
        the queue will grow again with other entries at those offsets: each offset comes down to its queue's end
        now, at start-up, before anything is appended (once the queue has grown again, the file's offsets would
        pass over entries never delivered)."""
        for level, offset in sorted(self._offsets.items()):
            end = self.store.queue_end(SCHEDULE_TOPIC, level - 1)
            if offset > end:
                log.warning("schedule level %d: progress %d names deliveries past the queue end %d (saved at "
                            "commit-log offset %d, the log ends at %d): moving back", level, offset, end, log_end,
                            log_now)
                self._offsets[level] = end
        self._write()

    def _parse(self, data: dict[str, Any]) -> tuple[dict[int, int], dict[str, Any], int | None]:
        """``{"offsetTable": {level: offset}, "log_end": n}``: the offsets of this broker's levels, the rest kept as
        they are (levels a changed messageDelayLevel no longer has), and the log end it was saved at (None in a
        file from before the key); ValueError etc. when it is not that."""
        table = data.get("offsetTable", {})
        if not isinstance(table, dict):
            raise ValueError("expected {'offsetTable': {level: offset}}")
        offsets: dict[int, int] = {}
        extra: dict[str, Any] = {}
        for key, value in table.items():
            level = int(key)
            if 1 <= level <= self.levels.max_level:
                offsets[level] = int(value)
            else:
                extra[str(key)] = value
        log_end = data.get(LOG_END_KEY)
        return offsets, extra, None if log_end is None else int(log_end)

    def persist(self) -> None:
        with self._lock:
            self._write()

    def _write(self) -> None:
        """The file from the offsets (the caller holds the lock, or is the constructor)."""
        table: dict[str, Any] = dict(self._extra)
        table.update({str(level): off for level, off in sorted(self._offsets.items())})
        # the log's end: every delivery the table names lies below it (a slave's copy waits for it, metadata_sync)
        write_json_atomic(self.path, {"offsetTable": table, LOG_END_KEY: self.store.max_phys_offset()})

    # ------------------------------------------------------------------------------------------ timers

    def _on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        if topic == SCHEDULE_TOPIC:
            ev = self._wake.get(queue_id + 1)
            if ev is not None:
                ev.set()

    def _run_level(self, level: int) -> None:
        wake = self._wake[level]
        while not self._stop.is_set():
            try:
                wait_s = self._deliver_due(level)
            except Exception:
                log.exception("schedule level %d: delivery failed; retrying in %.1f s", level, RETRY_AFTER_FAILURE_S)
                wait_s = RETRY_AFTER_FAILURE_S
            wake.wait(wait_s)
            wake.clear()

    def _deliver_due(self, level: int) -> float:
        """Deliver every due message of one level; return how long to sleep before the next one is due."""
        delay_ms = self.levels.delay_ms(level)
        while not self._stop.is_set():
            with self._lock:
                start = self._offsets.get(level, 0)
            offset = start
            res = self.store.get_message(SCHEDULE_READER_GROUP, SCHEDULE_TOPIC, level - 1, offset, DELIVER_BATCH)
            if res.status is not GetStatus.FOUND:
                offset = self._corrected_offset(level, offset, res.status, res.next_begin_offset, res.max_offset)
                if offset != start:
                    self._advance(level, offset)
                    continue
                return IDLE_POLL_S
            wait_s: float | None = None
            for msg in res.messages():
                now = int(time.time() * 1000)
                due = due_time_ms(msg.store_timestamp, delay_ms, now)
                if due > now:
                    wait_s = (due - now) / 1000
                    break
                if not self._delivered_before(level, msg) and not self._deliver(msg):
                    wait_s = RETRY_AFTER_FAILURE_S
                    break
                offset = msg.queue_offset + 1
            else:
                offset = max(offset, res.next_begin_offset)
            if offset != start:
                self._advance(level, offset)
            if wait_s is not None:
                return wait_s
        return 0.0

    def _corrected_offset(self, level: int, offset: int, status: GetStatus, next_begin: int, max_offset: int) -> int:
        if status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_FOUND_NULL, GetStatus.MESSAGE_WAS_REMOVING):
            if next_begin != offset:
                log.warning("schedule level %d: offset %d unreadable (%s); moving to %d", level, offset, status.name,
                            next_begin)
            return next_begin
        if status is GetStatus.OFFSET_OVERFLOW_BADLY and offset > max_offset:
            log.warning("schedule level %d: offset %d past the queue end %d; moving back", level, offset, max_offset)
            return max_offset
        return offset

    def _advance(self, level: int, offset: int) -> None:
        with self._lock:
            self._offsets[level] = offset
        self.persist()

    def _deliver(self, msg: StoredMessage) -> bool:
        """Re-store one due message in its real topic. False: retry later (the store refused for now)."""
        real_topic = msg.properties.get(Prop.REAL_TOPIC)
        real_qid = msg.properties.get(Prop.REAL_QID, "")
        if not real_topic or not is_ascii_digits(real_qid) or len(real_qid) > MAX_NUMBER_DIGITS:
            log.error("scheduled message %s has no valid REAL_TOPIC/REAL_QID (%r, %r); skipped", msg.msg_id,
                      real_topic, real_qid)
            return True
        if self.store.deleted_generation(real_topic, msg.commitlog_offset):
            # delayed before its topic was deleted: it went with it (a topic made again under the name is another)
            log.info("scheduled message %s: topic %r was deleted since; dropped", msg.msg_id, real_topic)
            return True
        try:
            res = self.store.put_message(
                real_topic,
                int(real_qid),
                msg.body,
                restore_properties(msg),
                flag=msg.flag,
                sys_flag=msg.sys_flag,
                born_timestamp=msg.born_timestamp,
                born_host=_host_tuple(msg.born_host),
                reconsume_times=msg.reconsume_times,
                # SYNC_FLUSH: durable before the level's offset moves past it (as RocketMQ's delivery waits), or a
                # power loss after the offset is persisted would lose the message
                wait_store_ok=None,
            )
        except MessageIllegalError as e:
            log.error("scheduled message %s cannot be re-stored in %s: %s; skipped", msg.msg_id, real_topic, e)
            return True
        if res.status in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):  # stored either way
            self._delivered += 1
            return True
        if res.status in (PutStatus.MESSAGE_ILLEGAL, PutStatus.PROPERTIES_SIZE_EXCEEDED):
            log.error("scheduled message %s refused by %s: %s; skipped", msg.msg_id, real_topic, res.error)
            return True
        log.warning("re-storing scheduled message %s: %s %s; will retry", msg.msg_id, res.status.name, res.error)
        return False


def has_delivered_copy(store: MessageStore, msg: StoredMessage) -> bool:
    """Whether the scheduled ``msg`` has a delivered copy in its real topic: same UNIQ_KEY, later in the log."""
    uniq = msg.properties.get(Prop.UNIQ_KEY)
    topic = msg.properties.get(Prop.REAL_TOPIC)
    if store.index is None or not uniq or not topic:
        return False
    try:
        copies = store.query_by_key(topic, uniq, max_num=4, begin_ms=msg.store_timestamp - CLOCK_SLACK_MS,
                                    confirmed_only=False)
    except InvalidArgumentError:  # not a topic name the index knows: nothing was delivered there
        return False
    return any(c.commitlog_offset > msg.commitlog_offset for c in copies)
