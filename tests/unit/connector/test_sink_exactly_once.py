"""Exactly-once end to end: topic A -> transform -> topic B, the driver SIGKILLed at random moments.

The driver runs in its own process (sink_eo_query.py) against a broker of the test's own, which is also killed and
restarted once mid-run. After the last run finishes, topic B must hold every input message exactly once (each body
carries a unique id). With at-least-once the same crashes may leave duplicates, never a loss.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from crash_scale import crash_scale
from test_sink import flat, read_all

from broker.address import free_fixed_port
from broker.client import Admin, Message, Producer
from broker.server.process import BrokerProcess

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1500)]

QUERY = Path(__file__).with_name("sink_eo_query.py")
SOURCE, TARGET = "eo_source", "eo_target"
QUEUES = 4


def produce(endpoint: str, n: int) -> None:
    with Admin(endpoint) as admin:
        admin.create_topic(SOURCE, QUEUES, if_not_exists=True)
        admin.create_topic(TARGET, QUEUES, if_not_exists=True)
    with Producer(endpoint) as producer:
        for lo in range(0, n, 5000):
            msgs = [Message(SOURCE, f"id-{i:07d}".encode(), tags=f"t{i % 3}") for i in range(lo, min(n, lo + 5000))]
            producer.send_batch(msgs, queue_id=(lo // 5000) % QUEUES)


def start_query(
    endpoint: str, checkpoint: Path, guarantee: str, per_trigger: int, log: Path
) -> subprocess.Popen[bytes]:
    args = [sys.executable, str(QUERY), endpoint, SOURCE, TARGET, str(checkpoint), guarantee, str(per_trigger)]
    with open(log, "ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def target_ids(endpoint: str, expect: int | None = None) -> Counter[str]:
    ids: Counter[str] = Counter()
    for m in flat(read_all(endpoint, TARGET, expect=expect)):
        body = m.body.decode()
        assert body.endswith("|mirrored"), body
        ids[body.removesuffix("|mirrored")] += 1
    return ids


def target_count(endpoint: str) -> int:
    """Messages visible in the target (committed batches), from the queues' max offsets: cheap to poll."""
    with Admin(endpoint) as admin:
        return sum(hi for _, hi in admin.queue_offsets(TARGET).values())


def wait_for_progress(endpoint: str, proc: subprocess.Popen[bytes], above: int, timeout_s: float) -> int:
    """Poll until the query has made more messages visible than ``above`` (or ended, or the timeout passed):
    a kill on a fixed timer could land before Spark even started, on a slow machine every time."""
    deadline = time.monotonic() + timeout_s
    count = target_count(endpoint)
    while count <= above and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
        count = target_count(endpoint)
    return count


def run_with_crashes(tmp_path: Path, guarantee: str, n: int, kills: int, per_trigger: int) -> Counter[str]:
    seed = int(os.environ.get("SLUICE_CRASH_SEED", time.time()))
    print(f"seed {seed} (SLUICE_CRASH_SEED to repeat)")
    rng = random.Random(seed)
    listen = f"127.0.0.1:{free_fixed_port()}"
    store, checkpoint, log = tmp_path / "store", tmp_path / "chk", tmp_path / "driver.log"
    broker = BrokerProcess(store, listen=listen).start()
    endpoint = broker.endpoint
    produce(endpoint, n)
    seen = 0  # messages visible in the target at the last kill
    mid_run = 0  # kills that found the target neither empty nor complete
    try:
        for kill in range(kills):
            proc = start_query(endpoint, checkpoint, guarantee, per_trigger, log)
            # Kill once this run has committed a batch, then a little later: during reads, task writes, commits.
            seen = wait_for_progress(endpoint, proc, seen, timeout_s=120)
            time.sleep(rng.uniform(0.0, 3.0))
            if kill == kills // 2:
                broker.kill()  # the broker crashes under the running query ...
                time.sleep(rng.uniform(0.5, 2.0))
                broker = BrokerProcess(store, listen=listen).start()  # ... and comes back on its store
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # the driver already failed (the broker was down): a crash all the same
                pass
            proc.wait()
            seen = target_count(endpoint)
            mid_run += 0 < seen < n
            print(f"{guarantee} kill {kill + 1}: {seen} messages in {TARGET}")
        assert mid_run, f"no kill landed while the query was part-way through the {n} messages"
        proc = start_query(endpoint, checkpoint, guarantee, per_trigger, log)
        assert proc.wait(timeout=900) == 0, log.read_text()[-4000:]
        return target_ids(endpoint, expect=n)
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            assert broker.stop() == 0


def test_exactly_once_through_driver_and_broker_crashes(tmp_path: Path) -> None:
    n = crash_scale(60_000, 200_000)
    ids = run_with_crashes(tmp_path, "exactly-once", n, kills=crash_scale(2, 5), per_trigger=n // 8)
    expected = {f"id-{i:07d}" for i in range(n)}
    missing = expected - set(ids)
    dupes = {k: c for k, c in ids.items() if c > 1}
    assert not missing, f"{len(missing)} messages lost, e.g. {sorted(missing)[:5]}"
    assert not dupes, f"{len(dupes)} messages written more than once, e.g. {list(dupes.items())[:5]}"
    assert set(ids) == expected


def test_at_least_once_loses_nothing_and_may_duplicate(tmp_path: Path) -> None:
    n = crash_scale(30_000, 60_000)
    kills = crash_scale(1, 3)
    ids = run_with_crashes(tmp_path, "at-least-once", n, kills=kills, per_trigger=n // 6)
    expected = {f"id-{i:07d}" for i in range(n)}
    missing = expected - set(ids)
    assert not missing, f"at-least-once lost {len(missing)} messages, e.g. {sorted(missing)[:5]}"
    assert set(ids) == expected  # and nothing that was never sent
    dupes = sum(c - 1 for c in ids.values())
    print(f"at-least-once: {dupes} duplicate deliveries after {kills} driver kills")  # allowed: at-least-once
