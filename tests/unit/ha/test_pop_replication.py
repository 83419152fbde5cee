"""The pop record of a replicated group on in-process brokers (broker/semantics/pop_log.py): a receive or an ack is
refused, nothing changed, while too few replicas are in sync; a slave started as master on its copy of the log and
of popState.json keeps what the old master's consumers acked and received, and accepts the old master's handles."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from broker.client import Admin, Message, PopConsumer, Producer
from broker.errors import NotEnoughReplicasError
from broker.format.system_topics import POP_JOURNAL_TOPIC
from broker.semantics.pop_log import STATE_FILE
from tests.support.replicas import broker, brokers, caught_up, in_sync_pair
from tests.support.waiting import wait_until

FAST_POP = {"pop_min_invisible_ms": 100}


def test_a_pop_is_refused_unchanged_while_too_few_replicas_are_in_sync(tmp_path: Path) -> None:
    with brokers() as bs:
        m = broker(tmp_path / "m", role="SYNC_MASTER", min_insync_replicas=2, **FAST_POP)
        bs.append(m)
        assert m.store is not None
        with PopConsumer(m.address, "g", timeout_s=5) as c:
            before = m.store.max_phys_offset()
            with pytest.raises(NotEnoughReplicasError):
                c.receive("T", 8, 5_000)
            assert m.store.max_phys_offset() == before  # no record written
            assert m.store.queue_end(POP_JOURNAL_TOPIC, 0) == 0


def test_a_promoted_slave_keeps_acks_in_flight_messages_and_handles(tmp_path: Path) -> None:
    with brokers() as bs:
        m, s = in_sync_pair(bs, tmp_path, master=FAST_POP, slave=FAST_POP)
        with Admin(m.address) as admin:
            admin.create_topic("T", 1)
        with Producer(endpoint=m.address) as p:
            for i in range(6):
                p.send(Message("T", f"m{i}".encode()), queue_id=0)
        with PopConsumer(m.address, "g") as c:
            got = c.receive("T", 6, invisible_ms=4_000, wait_ms=2_000)
            assert len(got) == 6
            c.ack_all(got[:2])
            c.change_invisible(got[2], 60_000)  # a later time: the new master keeps it, and the newer handle
        assert s.store is not None
        wait_until(lambda: caught_up(m, s), "the slave holds every pop record")
        copy = Path(s.store.config.config_dir) / STATE_FILE
        wait_until(copy.exists, "the slave's copy of the pop snapshot")
        assert stat.S_IMODE(os.stat(copy).st_mode) == 0o600  # it holds the handle secret
        for b in (m, s):  # the master is gone; the slave's store is started as the new master
            b.shutdown()
        bs.clear()
        promoted = broker(tmp_path / "s", role="ASYNC_MASTER", **FAST_POP)
        bs.append(promoted)
        with PopConsumer(promoted.address, "g") as c:
            assert c.receive("T", 6, invisible_ms=4_000) == []  # every one acked or still invisible
            c.ack(got[3])  # a handle of the old master
            until = {p.message.body: p.invisible_until_ms for p in got}
            again = []
            while time.time() * 1000 < got[4].invisible_until_ms + 3_000 and len(again) < 2:
                for p in c.receive("T", 6, invisible_ms=4_000, wait_ms=500):
                    assert time.time() * 1000 >= until[p.message.body], "delivered again before its invisible time"
                    again.append(p)
            assert sorted(p.message.body for p in again) == [b"m4", b"m5"]
            assert {p.delivery_attempt for p in again} == {2}
            c.ack(got[2])  # its handle after the change, of the old master too
