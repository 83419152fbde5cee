"""Property tests of the pop bookkeeping (broker/semantics/pop_book.py) against a simple model of what a group's
consumers may be given: random pops, acks, changes of invisible time and the passing of time, in plain and FIFO
groups; after every step the book agrees with the model, and a book rebuilt from the journal records (or from a
snapshot) is the same book."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from broker.errors import InvalidReceiptHandleError
from broker.semantics.pop_book import PopBook

KEY = ("group", "topic", 0)
GROUPS = ["a", "b", "c"]


@dataclass
class Out:
    visible_at: int
    attempts: int
    seq: int


@dataclass
class Model:
    """The obvious bookkeeping: a dict per message of the queue."""

    groups: list[str] = field(default_factory=list)  # message group of each offset
    out: dict[int, Out] = field(default_factory=dict)  # delivered at least once, not done
    waiting: set[int] = field(default_factory=set)  # FIFO: read, held behind an earlier one of its group
    done: set[int] = field(default_factory=set)
    next_offset: int = 0

    def deliverable(self, now: int, fifo: bool) -> list[int]:
        cands = sorted([o for o, r in self.out.items() if r.visible_at <= now] + list(self.waiting))
        if not fifo:
            return cands
        ok = []
        for o in cands:
            earlier = [p for p in list(self.out) + list(self.waiting) if p < o and self.groups[p] == self.groups[o]]
            if not earlier:
                ok.append(o)
        return ok


class PopBookMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.book = PopBook()
        self.records: list[dict] = []
        self.model = Model()
        self.now = 1_000
        self.fifo = False
        self.handles: list[tuple[int, int]] = []  # (offset, seq) handed out, current or not
        self.order: dict[str, list[int]] = {g: [] for g in GROUPS}

    @initialize(fifo=st.booleans())
    def start(self, fifo: bool) -> None:
        self.fifo = fifo
        self.records.append(self.book.start(KEY, 0))

    @rule(group=st.sampled_from(GROUPS), n=st.integers(1, 4))
    def produce(self, group: str, n: int) -> None:
        self.model.groups += [group] * n

    @rule(ms=st.integers(1, 3_000))
    def time_passes(self, ms: int) -> None:
        self.now += ms

    @rule(k=st.integers(1, 5), invisible=st.integers(1, 2_000))
    def pop(self, k: int, invisible: int) -> None:
        m = self.model
        expected_due = m.deliverable(self.now, self.fifo)[:k]
        due = self.book.due(KEY, self.now, self.fifo)[:k]
        assert due == expected_due
        delivered = list(due)
        if due:
            self.records.append(self.book.deliver(KEY, due, self.now, invisible))
        room = k - len(due)
        new = [(o, o, m.groups[o]) for o in range(m.next_offset, len(m.groups))]
        if room > 0:
            record, fresh = self.book.admit(KEY, new, len(m.groups), self.now, invisible, self.fifo, room)
            self.records.append(record)
            delivered += fresh
            q = self.book.queue(KEY)
            assert q is not None
            for o, _, _ in new:
                if o >= q.next_offset:
                    break
                if o not in fresh:
                    m.waiting.add(o)
            m.next_offset = q.next_offset
        for o in delivered:
            m.waiting.discard(o)
            r = self.book.queue(KEY).records[o]  # type: ignore[union-attr]
            prev = m.out.get(o)
            m.out[o] = Out(self.now + invisible, (prev.attempts if prev else 0) + 1, r.seq)
            assert r.attempts == m.out[o].attempts and r.visible_at_ms == self.now + invisible
            self.handles.append((o, r.seq))
            self.order[m.groups[o]].append(o)

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        offset, seq = data.draw(st.sampled_from(self.handles))
        r = self.model.out.get(offset)
        current = r is not None and r.seq == seq and r.visible_at > self.now
        if current:
            self.records.append(self.book.ack(KEY, offset, seq, self.now))
            del self.model.out[offset]
            self.model.done.add(offset)
        else:
            with pytest.raises(InvalidReceiptHandleError):
                self.book.ack(KEY, offset, seq, self.now)

    @precondition(lambda self: self.handles)
    @rule(data=st.data(), invisible=st.integers(0, 2_000))
    def change(self, data: st.DataObject, invisible: int) -> None:
        offset, seq = data.draw(st.sampled_from(self.handles))
        r = self.model.out.get(offset)
        if r is not None and r.seq == seq and r.visible_at > self.now:
            record, new_seq = self.book.change(KEY, offset, seq, self.now, invisible)
            self.records.append(record)
            self.model.out[offset] = Out(self.now + invisible, r.attempts, new_seq)
            self.handles.append((offset, new_seq))
        else:
            with pytest.raises(InvalidReceiptHandleError):
                self.book.change(KEY, offset, seq, self.now, invisible)

    @invariant()
    def agrees_with_the_model(self) -> None:
        q = self.book.queue(KEY)
        if q is None:
            return
        m = self.model
        assert set(q.records) == set(m.out) | m.waiting
        for o in range(q.next_offset):  # nothing below the next offset is lost: done, out, or held back
            assert (o in m.done) + (o in m.out) + (o in m.waiting) == 1 or o not in range(len(m.groups))
        assert q.base == min(q.records, default=q.next_offset)
        assert all(o not in q.records for o in m.done)

    @invariant()
    def fifo_groups_are_delivered_in_order_one_at_a_time(self) -> None:
        if not self.fifo:
            return
        for seq in self.order.values():
            firsts = list(dict.fromkeys(seq))  # first deliveries, in time order
            assert firsts == sorted(firsts)
        for g in GROUPS:
            out = [o for o, r in self.model.out.items() if self.model.groups[o] == g]
            assert len(out) <= 1

    @invariant()
    def replay_and_snapshot_rebuild_the_same_book(self) -> None:
        replayed = PopBook()
        for record in self.records:
            replayed.apply(record)
        assert replayed.to_state() == self.book.to_state()
        restored = PopBook()
        restored.restore(self.book.to_state())
        assert restored.to_state() == self.book.to_state()


PopBookMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                            suppress_health_check=[HealthCheck.too_slow])
TestPopBook = PopBookMachine.TestCase
