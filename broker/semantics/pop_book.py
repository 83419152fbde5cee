"""The pop bookkeeping of one broker: per (consumer group, topic, queue), which messages are out and until when.

Pure state, no I/O and no clock of its own (every call is given ``now_ms``), so it is tested against a simple model
(tests/unit/semantics/test_pop_book.py) and rebuilt exactly from its journal records.

Per queue of a group:

* ``next_offset``: the first queue offset never looked at by a pop;
* ``records``: the messages below it that are not done, by queue offset. A record is in flight until
  ``visible_at_ms``; after that it is due for delivery again. A record with ``attempts`` 0 was never delivered: a
  FIFO group held it back behind an earlier message of its message group.

Every offset below ``next_offset`` without a record is done (acked, dead-lettered, filtered out), so memory is
proportional to what is outstanding, not to the queue. The group's consume offset is the lowest record (or
``next_offset``): everything below it is done.

FIFO (``fifo=True`` for the group): a message is delivered only when it is the lowest outstanding record of its
message group; a later one waits, even while the earlier one is invisible. Messages without a message group share
one group per queue (so they keep queue order, as RocketMQ's FIFO pop keeps a queue's).

Every change is one ``update`` record (``{"g", "t", "q", "n"?, "p"?, "r"?}``: the queue, its new next offset, the
records put, the offsets removed); ``apply`` replays one. Sequence numbers grow over the whole book and are never
reused, so a handle names one delivery (or change) only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from broker.errors import InvalidReceiptHandleError

QueueKey = tuple[str, str, int]  # (consumer group, topic, queue id)


@dataclass(slots=True)
class Record:
    visible_at_ms: int  # delivered again (or first, when attempts == 0) from this time on
    attempts: int  # deliveries so far
    seq: int  # names the latest delivery or change: a receipt handle must carry it to be accepted
    commitlog_offset: int  # where the message is, to read it again without the consume queue
    msg_group: str  # FIFO: the message group ("" when none); "" for groups that are not FIFO


@dataclass(slots=True)
class QueueBook:
    next_offset: int
    records: dict[int, Record] = field(default_factory=dict)

    @property
    def base(self) -> int:
        """The consume offset: every offset below it is done."""
        return min(self.records) if self.records else self.next_offset


def _encode(offset: int, r: Record) -> list[Any]:
    return [offset, r.visible_at_ms, r.attempts, r.seq, r.commitlog_offset, r.msg_group]


def _decode(raw: list[Any]) -> tuple[int, Record]:
    offset, visible, attempts, seq, clo, group = raw
    return int(offset), Record(int(visible), int(attempts), int(seq), int(clo), str(group))


class PopBook:
    def __init__(self) -> None:
        self.queues: dict[QueueKey, QueueBook] = {}
        self.last_seq = 0

    # ------------------------------------------------------------------------------------------ reading
    def queue(self, key: QueueKey) -> QueueBook | None:
        return self.queues.get(key)

    def outstanding(self, key: QueueKey) -> int:
        q = self.queues.get(key)
        return len(q.records) if q else 0

    def due(self, key: QueueKey, now_ms: int, fifo: bool) -> list[int]:
        """Offsets that may be delivered now, lowest first: records whose invisible time is over; for FIFO only
        the lowest record of each message group, and only when it is over."""
        q = self.queues.get(key)
        if q is None or not q.records:
            return []
        out: list[int] = []
        seen_groups: set[str] = set()
        for offset in sorted(q.records):
            r = q.records[offset]
            if fifo:
                if r.msg_group in seen_groups:
                    continue
                seen_groups.add(r.msg_group)
            if r.visible_at_ms <= now_ms:
                out.append(offset)
        return out

    def blocked_groups(self, key: QueueKey) -> set[str]:
        """FIFO: message groups with an outstanding record in this queue (their next message must wait)."""
        q = self.queues.get(key)
        return {r.msg_group for r in q.records.values()} if q else set()

    def next_visible_ms(self, key: QueueKey) -> int | None:
        """The earliest time a record of this queue becomes due (None: nothing outstanding)."""
        q = self.queues.get(key)
        if q is None or not q.records:
            return None
        return min(r.visible_at_ms for r in q.records.values())

    def check(self, key: QueueKey, offset: int, seq: int, now_ms: int) -> Record:
        """The record a handle names, while its delivery is current; InvalidReceiptHandleError saying why not."""
        q = self.queues.get(key)
        r = q.records.get(offset) if q else None
        if r is None:
            if q is not None and offset < q.next_offset:
                raise InvalidReceiptHandleError(
                    f"message {key[1]}/{key[2]}@{offset} of group {key[0]} is already acked (or dead-lettered)"
                )
            raise InvalidReceiptHandleError(f"no message {key[1]}/{key[2]}@{offset} was received by group {key[0]}")
        if r.seq != seq:
            raise InvalidReceiptHandleError(
                f"receipt handle of {key[1]}/{key[2]}@{offset} is superseded: the message was received again or its "
                "invisible time changed since; use the latest handle"
            )
        if r.visible_at_ms <= now_ms:
            raise InvalidReceiptHandleError(
                f"receipt handle of {key[1]}/{key[2]}@{offset} expired {now_ms - r.visible_at_ms} ms ago: the message "
                "is visible again and will be delivered again"
            )
        return r

    # ------------------------------------------------------------------------------------------ changes
    def _next_seq(self) -> int:
        self.last_seq += 1
        return self.last_seq

    def start(self, key: QueueKey, next_offset: int) -> dict[str, Any]:
        """A queue's first pop: it starts at ``next_offset`` (the group's committed offset, or the queue's min or
        max for a new group)."""
        return self._update(key, next_offset, {}, [])

    def deliver(self, key: QueueKey, offsets: Iterable[int], now_ms: int, invisible_ms: int) -> dict[str, Any]:
        """Deliver due records (again): one more attempt, invisible until now + invisible_ms, a new sequence."""
        q = self.queues[key]
        put = {}
        for offset in offsets:
            r = q.records[offset]
            put[offset] = Record(now_ms + invisible_ms, r.attempts + 1, self._next_seq(), r.commitlog_offset,
                                 r.msg_group)
        return self._update(key, None, put, [])

    def admit(
        self, key: QueueKey, found: Iterable[tuple[int, int, str]], next_offset: int, now_ms: int, invisible_ms: int,
        fifo: bool, limit: int,
    ) -> tuple[dict[str, Any], list[int]]:
        """New messages read from ``next_offset`` on: ``found`` = (queue offset, commit-log offset, message group)
        in queue order, ``next_offset`` = where the read stopped. Delivers at most ``limit``; with FIFO a message
        whose group has an outstanding record is recorded as waiting instead. Returns (journal record, delivered
        offsets). Messages after the ``limit``-th delivered one are left for the next pop (next offset stops there)."""
        q = self.queues[key]
        blocked = {r.msg_group for r in q.records.values()} if fifo else set()
        put: dict[int, Record] = {}
        delivered: list[int] = []
        new_next = next_offset
        for offset, clo, group in found:
            if len(delivered) >= limit:
                new_next = offset
                break
            msg_group = group if fifo else ""
            if fifo and msg_group in blocked:
                put[offset] = Record(0, 0, self._next_seq(), clo, msg_group)
            else:
                put[offset] = Record(now_ms + invisible_ms, 1, self._next_seq(), clo, msg_group)
                delivered.append(offset)
                if fifo:
                    blocked.add(msg_group)
        return self._update(key, max(new_next, q.next_offset), put, []), delivered

    def change(
        self, key: QueueKey, offset: int, seq: int, now_ms: int, invisible_ms: int
    ) -> tuple[dict[str, Any], int]:
        """Change a current delivery's invisible time (from now); returns (journal record, the new sequence)."""
        r = self.check(key, offset, seq, now_ms)
        new_seq = self._next_seq()
        record = self._update(key, None, {offset: Record(now_ms + invisible_ms, r.attempts, new_seq,
                                                          r.commitlog_offset, r.msg_group)}, [])
        return record, new_seq

    def renew(self, key: QueueKey, offset: int, visible_at_ms: int) -> dict[str, Any]:
        """Extend an in-flight record (auto-renew): the handle stays the same."""
        r = self.queues[key].records[offset]
        return self._update(key, None, {offset: Record(visible_at_ms, r.attempts, r.seq, r.commitlog_offset,
                                                       r.msg_group)}, [])

    def ack(self, key: QueueKey, offset: int, seq: int, now_ms: int) -> dict[str, Any]:
        self.check(key, offset, seq, now_ms)
        return self._update(key, None, {}, [offset])

    def put_back(self, key: QueueKey, records: dict[int, Record]) -> dict[str, Any] | None:
        """Undo a removal (an ack that was refused after it was made, pop_ack_undo.py): each record returns as it was
        (same invisible time, attempts and sequence, so its handle is current again) where its offset has no record
        now. None when nothing is put back (the queue was forgotten, or every offset has a record again)."""
        q = self.queues.get(key)
        put = {o: r for o, r in records.items() if o not in q.records} if q is not None else {}
        return self._update(key, None, put, []) if put else None

    def remove(self, key: QueueKey, offsets: Iterable[int]) -> dict[str, Any]:
        """Done without an ack: dead-lettered, or its message no longer exists."""
        return self._update(key, None, {}, list(offsets))

    def _update(
        self, key: QueueKey, next_offset: int | None, put: dict[int, Record], remove: list[int]
    ) -> dict[str, Any]:
        record: dict[str, Any] = {"g": key[0], "t": key[1], "q": key[2]}
        if next_offset is not None:
            record["n"] = next_offset
        if put:
            record["p"] = [_encode(o, r) for o, r in put.items()]
        if remove:
            record["r"] = remove
        self.apply(record)
        return record

    def apply(self, record: dict[str, Any]) -> None:
        """Replay one journal record (also how every change above takes effect)."""
        key = (str(record["g"]), str(record["t"]), int(record["q"]))
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = QueueBook(int(record.get("n", 0)))
        if "n" in record:
            q.next_offset = max(q.next_offset, int(record["n"]))
        for raw in record.get("p", ()):
            offset, r = _decode(raw)
            q.records[offset] = r
            self.last_seq = max(self.last_seq, r.seq)
        for offset in record.get("r", ()):
            q.records.pop(int(offset), None)

    def forget(self, keys: Iterable[QueueKey]) -> None:
        """Drop queues whose topic was deleted (in memory only; the snapshot after it leaves them out)."""
        for key in list(keys):
            self.queues.pop(key, None)

    # ------------------------------------------------------------------------------------------ snapshot
    def to_state(self) -> dict[str, Any]:
        return {
            "seq": self.last_seq,
            "queues": [
                {"g": g, "t": t, "q": qid, "n": q.next_offset,
                 "p": [_encode(o, r) for o, r in sorted(q.records.items())]}
                for (g, t, qid), q in sorted(self.queues.items())
            ],
        }

    def restore(self, state: dict[str, Any] | None) -> None:
        self.queues.clear()
        self.last_seq = 0
        if state is None:
            return
        for raw in state.get("queues", ()):
            self.apply(raw)
        self.last_seq = max(self.last_seq, int(state.get("seq", 0)))

    def queue_keys(self) -> Iterator[QueueKey]:
        return iter(list(self.queues))
