"""A replica whose log was cut back below its pop snapshot (broker/semantics/pop_cut_back.py), on an in-process
broker: its snapshot holds a later history than its log (messages acked and received in records the cut removed),
and a promotion that took it would skip the journal records the log holds at those queue offsets. Messages the
remaining log has in flight would be neither in flight nor acked: never delivered again."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from broker.client import Admin, Message, PopConsumer, Producer
from broker.format.system_topics import POP_JOURNAL_TOPIC
from broker.semantics import pop_log
from broker.store import truncation
from tests.support.replicas import broker, brokers
from tests.support.waiting import wait_until

FAST_POP = {"pop_min_invisible_ms": 100}
INVISIBLE_MS = 2_000


def test_a_snapshot_past_a_cut_back_log_is_not_taken_and_in_flight_messages_come_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pop_log, "CHECKPOINT_INTERVAL_S", 0.0)  # a snapshot at every revive that follows a change
    with brokers() as bs:
        m = broker(tmp_path / "m", role="ASYNC_MASTER", **FAST_POP)
        bs.append(m)
        assert m.store is not None
        with Admin(m.address) as admin:
            admin.create_topic("T", 1)
        with Producer(endpoint=m.address) as p:
            for i in range(10):
                p.send(Message("T", f"m{i}".encode()), queue_id=0)
        with PopConsumer(m.address, "g") as c:
            first = c.receive("T", 5, invisible_ms=INVISIBLE_MS, wait_ms=2_000)
            assert [x.message.body for x in first] == [f"m{i}".encode() for i in range(5)]
            cut = m.store.max_phys_offset()  # the log the group keeps: m0..m4 in flight
            c.ack_all(first)  # a history the cut removes: m0..m4 acked, m5..m9 received
            assert len(c.receive("T", 5, invisible_ms=60_000, wait_ms=2_000)) == 5
        snapshot = Path(m.store.config.config_dir) / pop_log.STATE_FILE
        journal_end = m.store.queue_end(POP_JOURNAL_TOPIC, 0)
        wait_until(lambda: json.loads(snapshot.read_text())["next"] == journal_end, "a snapshot of that history")
        store_path = m.store.config.store_path
        m.shutdown()
        bs.clear()
        truncation.request(store_path, truncation.Truncation(cut, False))  # as a replica cut back to a new master
        promoted = broker(tmp_path / "m", role="ASYNC_MASTER", **FAST_POP)
        bs.append(promoted)
        assert promoted.store is not None and promoted.store.max_phys_offset() == cut
        got: dict[bytes, float] = {}
        with PopConsumer(promoted.address, "g") as c:
            deadline = time.monotonic() + INVISIBLE_MS / 1000 + 5
            while len(got) < 10 and time.monotonic() < deadline:
                for x in c.receive("T", 10, invisible_ms=60_000, wait_ms=500):
                    got.setdefault(x.message.body, time.time() * 1000)
        assert sorted(got) == sorted(f"m{i}".encode() for i in range(10)), "messages never delivered again"
        early = [b for b in (x.message.body for x in first) if got[b] < next(
            x.invisible_until_ms for x in first if x.message.body == b)]
        assert not early, f"delivered again before their invisible time: {early}"
