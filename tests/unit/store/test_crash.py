"""Crash test: a child appending with SYNC_FLUSH is SIGKILLed at random moments; nothing acknowledged is lost.

Each cycle starts the child (tests/unit/store/crash_child.py) on the same store, lets it run for a random time,
kills it with SIGKILL, then opens the store in this process (abnormal recovery) and checks: every acknowledged
message is readable at its queue offset with its body, each queue's offsets run 0..max without gaps and its
body ids only increase, keys are queryable, and check() is clean.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.store import MessageStore, StoreConfig

sys.path.insert(0, os.path.dirname(__file__))
from crash_child import CRASH_CONFIG, QUEUES, TOPIC

CHILD = os.path.join(os.path.dirname(__file__), "crash_child.py")
CYCLES = 22


def _run_child(store_dir: str, seed: int, first_id: int, rng: random.Random) -> list[tuple[int, int, int]]:
    proc = subprocess.Popen(
        [sys.executable, CHILD, store_dir, str(seed), str(first_id)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    ready = proc.stdout.readline()
    assert ready == b"ready\n", (ready, proc.stderr.read() if proc.stderr else b"")
    time.sleep(rng.uniform(0.02, 0.6))
    proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, err.decode(errors="replace")
    acked = []
    for line in out.split(b"\n")[:-1]:  # the last piece may be a line cut by the kill
        q, off, i = (int(x) for x in line.split())
        acked.append((q, off, i))
    return acked


def _verify(store_dir: str, acked: dict[tuple[int, int], int]) -> int:
    store = MessageStore(StoreConfig(store_path=store_dir, **CRASH_CONFIG))  # type: ignore[arg-type]
    store.start()
    try:
        assert store.recovery_report is not None and store.recovery_report.abnormal
        highest = -1
        for qid in range(QUEUES):
            seen: dict[int, int] = {}
            off = 0
            while off < store.max_offset(TOPIC, qid):
                got = store.get_message("verify", TOPIC, qid, off, 256, max_bytes=1 << 20)
                for m in got.messages():
                    assert m.queue_offset == len(seen), f"queue {qid}: gap before offset {m.queue_offset}"
                    seen[m.queue_offset] = int(m.body.split(b":")[1])
                off = got.next_begin_offset
            ids = [seen[q] for q in range(len(seen))]
            assert ids == sorted(ids) and len(set(ids)) == len(ids), f"queue {qid}: ids out of order"
            for (q, qoff), body_id in acked.items():
                if q == qid:
                    assert seen.get(qoff) == body_id, f"acknowledged {qid}/{qoff} id {body_id} lost"
            highest = max([highest, *ids])
        for body_id in list(acked.values())[-5:]:
            assert [int(m.body.split(b":")[1]) for m in store.query_by_key(TOPIC, f"k{body_id}")] == [body_id]
        assert store.check() == []
    finally:
        store.shutdown()
    return highest


@pytest.mark.slow
def test_sigkill_during_sync_appends_loses_nothing_acknowledged(tmp_path: Path) -> None:
    rng = random.Random(20261122)
    store_dir = str(tmp_path / "store")
    acked: dict[tuple[int, int], int] = {}
    next_id = 0
    for cycle in range(CYCLES):
        new = _run_child(store_dir, rng.randrange(1 << 30), next_id, rng)
        for q, off, i in new:
            assert (q, off) not in acked, f"cycle {cycle}: queue offset {q}/{off} acknowledged twice"
            acked[(q, off)] = i
        highest = _verify(store_dir, acked)
        next_id = highest + 1
    assert len(acked) > 100, "the child acknowledged too little to prove anything"
