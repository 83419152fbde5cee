"""Exactly-once: a sluice -> parquet query whose driver is SIGKILLed at random moments and restarted.

The output must equal the input (no loss, no duplicates), and the consumer group's committed offsets must never
pass the offsets of the last batch the checkpoint records as committed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from connector_helpers import body_of, fill, new_topic
from crash_scale import crash_scale

from broker.client import PullConsumer

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1500)]  # KILLS + 1 driver start-ups

QUERY = Path(__file__).with_name("eo_query.py")
QUEUES = 4
KILLS = crash_scale(2, 5)
FEED = 50  # messages per queue sent while each killed run is going


def checkpoint_done_offsets(checkpoint: Path, topic: str) -> dict[int, int]:
    """Source offsets of the last batch in the checkpoint's commit log ({} when no batch is committed)."""
    commits = [int(p.name) for p in (checkpoint / "commits").glob("*") if p.name.isdigit()]
    if not commits:
        return {}
    lines = (checkpoint / "offsets" / str(max(commits))).read_text().splitlines()
    source = json.loads(lines[2])  # "v1", batch metadata, then one line per source
    return {int(k.rpartition(":")[2]): v for k, v in source.get(topic, {}).items()}


def assert_group_not_ahead(endpoint: str, group: str, topic: str, checkpoint: Path) -> dict[int, int]:
    group_offsets = PullConsumer(endpoint, group).committed_offsets(topic)
    done = checkpoint_done_offsets(checkpoint, topic) if (checkpoint / "commits").exists() else {}
    for qid, off in group_offsets.items():
        assert off <= done.get(qid, 0), f"group offset {off} of queue {qid} passes the checkpoint's {done}"
    return group_offsets


def committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return len([p for p in commits.glob("*") if p.name.isdigit()]) if commits.exists() else 0


def wait_for_new_commit(checkpoint: Path, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 240) -> None:
    before = committed_batches(checkpoint)
    deadline = time.monotonic() + timeout_s
    while committed_batches(checkpoint) <= before:
        assert proc.poll() is None, "the query died:\n" + log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the query made no progress:\n" + log.read_text()[-3000:]
        time.sleep(0.1)


def start_query(args: list[str], mode: str, max_per_trigger: int, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, str(QUERY), *args, mode, str(max_per_trigger)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )


def test_driver_killed_at_random_points_writes_every_message_exactly_once(
    spark: Any, broker: str, tmp_path: Path
) -> None:
    rng = random.Random(int(time.time()))
    topic = new_topic(broker, QUEUES)
    group = f"g_{topic}"
    checkpoint, output, log = tmp_path / "chk", tmp_path / "out", tmp_path / "driver.log"
    args = [broker, topic, group, str(checkpoint), str(output)]
    sent = 250
    fill(broker, topic, sent, range(QUEUES))

    for kill in range(KILLS):
        proc = start_query(args, "continuous", 120, log)  # small batches: several per run
        # While the query runs, more messages arrive (so kills land during reads, writes and commits alike).
        feeder = threading.Thread(target=fill, args=(broker, topic, FEED, range(QUEUES)), kwargs={"first": sent})
        feeder.start()
        # Kill only once this run has committed a batch of its own, then at a random moment of the next ones.
        wait_for_new_commit(checkpoint, proc, log)
        time.sleep(rng.uniform(0.0, 3.0))
        os.killpg(proc.pid, signal.SIGKILL)  # the Python driver and its JVM: a crash, no shutdown hooks
        proc.wait()
        feeder.join()
        sent += FEED
        assert_group_not_ahead(broker, group, topic, checkpoint)
        done = checkpoint_done_offsets(checkpoint, topic)
        assert done, "the kill came before any batch was committed"
        print(f"kill {kill + 1}: checkpoint at {done}")

    proc = start_query(args, "available-now", 100_000, log)
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]

    rows = spark.read.parquet(str(output)).collect()
    got = sorted((r.queue_id, r.queue_offset, bytes(r.body)) for r in rows)
    expected = sorted((q, i, body_of(topic, q, i)) for q in range(QUEUES) for i in range(sent))
    assert len(got) == len(set(got)), "duplicates in the output"
    assert got == expected
    final = assert_group_not_ahead(broker, group, topic, checkpoint)
    assert final == dict.fromkeys(range(QUEUES), sent)  # after the last batch the group caught up
