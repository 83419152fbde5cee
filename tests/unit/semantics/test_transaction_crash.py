"""SIGKILL in the middle of a 50,000-message batch commit, restart: all or none visible, never part, never twice."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from broker.format.message import BODY_START, I32, POS_BODY_LENGTH
from broker.semantics.transaction import TransactionService, TxStatus
from broker.store import GetStatus, MessageStore, StoreConfig
from tests.support.crash import crash_seed

CHILD = os.path.join(os.path.dirname(__file__), "txn_crash_child.py")
COUNT = 50_000
CYCLES = 4
CONFIG = {"mapped_file_size_commit_log": 8 << 20, "max_message_size": 64 << 10, "max_batch_bytes": 1 << 20}


def run_child(
    store_dir: str, txn_id: str, topic: str, kill_after_s: float, *, child: str = CHILD, count: int = COUNT,
    kill_at: str = "COMMITTING",
) -> str:
    """Start ``child``, SIGKILL it ``kill_after_s`` after it prints ``kill_at``; return the last line it printed."""
    proc = subprocess.Popen(
        [sys.executable, child, store_dir, txn_id, topic, str(count), json.dumps(CONFIG)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    last = ""
    try:
        while last != kill_at:
            line = proc.stdout.readline()
            assert line, f"child exited early with {proc.wait()}"
            last = line.strip()
        time.sleep(kill_after_s)
    finally:
        proc.send_signal(signal.SIGKILL)
        rest = proc.stdout.read()
        proc.wait()
    if "DONE" in rest.split():
        last = "DONE"
    return last


def bodies_of(store: MessageStore, topic: str) -> Counter[bytes]:
    """Bodies of every message readers get from the topic, read from the raw entries (tens of thousands of decodes
    would dominate the test)."""
    assert store.wait_dispatched()
    seen: Counter[bytes] = Counter()
    for qid in store.queue_ids(topic):
        offset = 0
        while True:
            res = store.get_message("CHECK", topic, qid, offset, 4096)
            if res.status is GetStatus.NO_MATCHED_MESSAGE:  # only rolled-back messages: past them
                offset = res.next_begin_offset
                continue
            if res.status is not GetStatus.FOUND:
                break
            buf = res.buffer
            for pos in res.entry_positions:
                body_len = I32.unpack_from(buf, pos + POS_BODY_LENGTH)[0]
                seen[bytes(buf[pos + BODY_START : pos + BODY_START + body_len])] += 1
            offset = res.next_begin_offset
    return seen


def kill_delay(rng: random.Random, cycle: int) -> float:
    """Seconds from COMMITTING to the kill. The commit of 50,000 takes about a second here (less on a fast machine):
    the first two cycles kill early, so that at least one kill lands mid-commit whatever the machine's speed; the
    others anywhere from before the decision to well after the end."""
    if cycle == 0:
        return rng.uniform(0.0, 0.02)
    if cycle == 1:
        return rng.uniform(0.0, 0.3)
    return rng.uniform(0.3, 2.5)


@pytest.mark.slow
def test_sigkill_during_batch_commit_is_all_or_nothing(tmp_path: object) -> None:
    store_dir = str(tmp_path)
    seed = crash_seed("batch-commit")
    rng = random.Random(seed)
    outcomes = []
    for cycle in range(CYCLES):
        txn_id, topic = f"query-1:{cycle}", f"Sink{cycle}"
        last = run_child(store_dir, txn_id, topic, kill_delay(rng, cycle))
        store = MessageStore(StoreConfig(store_path=store_dir, **CONFIG))  # type: ignore[arg-type]
        store.start()
        before = len(bodies_of(store, topic))  # what the crash left, before recovery runs
        tx = TransactionService(store, os.path.join(store_dir, "config"))
        tx.start()  # recovery finishes an interrupted commit
        try:
            seen = bodies_of(store, topic)
            info = tx.transaction(txn_id)
            assert info is not None
            assert all(n == 1 for n in seen.values()), f"seed {seed}, cycle {cycle}: duplicates after recovery"
            if info.status is TxStatus.COMMITTED:  # the decision was stored before the kill
                assert len(seen) == COUNT, f"seed {seed}, cycle {cycle}: committed but {len(seen)} of {COUNT} visible"
                assert info.complete
                assert seen.keys() == {b"%s:%06d" % (txn_id.encode(), i) for i in range(COUNT)}
                outcomes.append(f"{last}: committed ({before} visible before recovery)")
                expected = TxStatus.COMMITTED  # already ended: rolling back is a no-op reporting the commit
            else:  # killed before the decision was stored: still open, nothing visible
                assert info.status is TxStatus.OPEN and last != "DONE", (seed, cycle, info.status, last)
                assert before == len(seen) == 0, f"seed {seed}, cycle {cycle}: not committed but {len(seen)} visible"
                assert info.half_count == COUNT
                outcomes.append(f"{last}: open")
                if cycle % 2:  # the writer's retry commits it now; in even cycles it is rolled back below
                    assert tx.end_transaction(txn_id, commit=True).restored == COUNT
                    assert len(bodies_of(store, topic)) == COUNT
                    expected = TxStatus.COMMITTED
                else:
                    expected = TxStatus.ROLLED_BACK
            assert tx.end_transaction(txn_id, commit=False).status is expected, (seed, cycle)
            ended = tx.transaction(txn_id)
            assert ended is not None and ended.status is expected, (seed, cycle)
            assert len(bodies_of(store, topic)) == (COUNT if expected is TxStatus.COMMITTED else 0), (seed, cycle)
        finally:
            tx.shutdown()
            if cycle == CYCLES - 1:  # the consistency oracle, once: it reads the whole store
                assert store.wait_dispatched()
                assert store.check() == []
            store.shutdown()
    print("outcomes:", outcomes)
    assert any(not o.startswith("DONE") for o in outcomes), f"seed {seed}: every kill landed after the commit ended"
