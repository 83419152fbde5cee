"""Exactly-once over a 3-broker cluster with the driver SIGKILLed, each driver its own process (a real crash):

* source: availableNow over 120,000 messages spread over every broker's queues (300,000 in `make test-crash`),
  killed 2 times (3); the parquet output
  equals the input, each message once, and the group's offsets (kept by each queue's broker) never pass the
  checkpoint;
* sink: topic A -> topic B, every micro-batch spanning the three brokers, the driver killed 2 times (3) exactly between
  two brokers' commits (a test hook stops it there; the brokers' state shows the decision recorded, one broker's
  part committed and another's not), and a broker SIGKILLed and restarted with its part of a batch open: B holds
  every row of A exactly once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from connector_helpers import cluster_body, cluster_fill, cluster_topic
from crash_scale import crash_scale
from test_exactly_once import start_query, wait_for_new_commit

from broker.client import Message, Producer, PullConsumer
from broker.client.coordinator import CoordinatorClient
from broker.client.route import MessageQueue
from broker.client.router import Router
from broker.namesrv.local_cluster import LocalCluster
from connector.cluster_commit import PAUSE_ENV, coordinator_of
from tests.support.cluster import make_cluster
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1800)]

BROKERS = ["broker-a", "broker-b", "broker-c"]
QUEUES = 4
SINK_QUERY = Path(__file__).with_name("sink_eo_query.py")
# Participants never resolve a batch by themselves during this test (their check pass, every 10 min, would race
# the test's look at a half-committed batch); the protocol test of the participants covers that path.
BROKER_CONFIG = {"transaction_check_interval_ms": 600_000}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    config = tmp_path / "broker.json"
    config.write_text(json.dumps(BROKER_CONFIG))
    with make_cluster(tmp_path / "cluster", brokers=len(BROKERS), config=config) as c:
        yield c


def all_queues(topic: str) -> list[MessageQueue]:
    return [MessageQueue(topic, b, q) for b in BROKERS for q in range(QUEUES)]


def checkpoint_done(checkpoint: Path, topic: str) -> dict[tuple[str, int], int]:
    """(broker, queue) -> offset of the last batch the checkpoint's commit log records ({} before the first)."""
    commits = [int(p.name) for p in (checkpoint / "commits").glob("*") if p.name.isdigit()]
    if not commits:
        return {}
    source = json.loads((checkpoint / "offsets" / str(max(commits))).read_text().splitlines()[2])
    out = {}
    for key, off in source.get(topic, {}).items():
        broker, _, qid = key.rpartition(":")
        out[(broker, int(qid))] = off
    return out


def test_available_now_over_three_brokers_survives_driver_kills(
    spark: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    topic, group, per_queue = "eo_cluster", "g_eo_cluster", crash_scale(10_000, 25_000)  # 12 queues
    cluster_topic(cluster, topic, QUEUES)
    cluster_fill(cluster.namesrv, topic, per_queue, all_queues(topic))
    checkpoint, output, log = tmp_path / "chk", tmp_path / "out", tmp_path / "driver.log"
    args = [f"namesrv={cluster.namesrv}", topic, group, str(checkpoint), str(output)]
    rng = random.Random(int(os.environ.get("SLUICE_CRASH_SEED", time.time())))
    per_trigger = 12 * per_queue // 10  # 10 batches: kills land part-way through
    for kill in range(crash_scale(1, 3)):
        proc = start_query(args, "available-now", per_trigger, log)
        wait_for_new_commit(checkpoint, proc, log, timeout_s=900)  # a driver start and a batch: minutes when busy
        time.sleep(rng.uniform(0.0, 2.0))
        os.killpg(proc.pid, signal.SIGKILL)  # the Python driver and its JVM: a crash, no shutdown hooks
        proc.wait()
        done = checkpoint_done(checkpoint, topic)
        with PullConsumer(namesrv=cluster.namesrv, group=group) as consumer:
            committed = consumer.committed_by_queue(topic)
        for mq, off in committed.items():
            assert off <= done.get((mq.broker_name, mq.queue_id), 0), f"group offset {off} of {mq} passes {done}"
        assert 0 < sum(done.values()) < 12 * per_queue, f"kill {kill + 1} landed outside the run: {done}"
        print(f"kill {kill + 1}: checkpoint at {sum(done.values())} messages")
    proc = start_query(args, "available-now", per_trigger, log)
    assert proc.wait(timeout=1200) == 0, log.read_text()[-3000:]

    rows = spark.read.parquet(str(output)).select("broker", "queue_id", "queue_offset", "body").collect()
    got = sorted((r.broker, r.queue_id, r.queue_offset, bytes(r.body)) for r in rows)
    assert len(got) == len(set(got)), "duplicates in the output"
    expected = sorted((mq.broker_name, mq.queue_id, i, cluster_body(mq, i))
                      for mq in all_queues(topic) for i in range(per_queue))
    assert got == expected
    with PullConsumer(namesrv=cluster.namesrv, group=group) as consumer:  # caught up, on each queue's broker
        assert set(consumer.committed_by_queue(topic).values()) == {per_queue}


def produce_ids(namesrv: str, topic: str, n: int) -> None:
    queues = all_queues(topic)
    with Producer(namesrv=namesrv) as producer:
        for k, lo in enumerate(range(0, n, 5000)):
            msgs = [Message(topic, f"id-{i:07d}".encode(), tags=f"t{i % 3}") for i in range(lo, min(n, lo + 5000))]
            producer.send_batch(msgs, queue=queues[k % len(queues)])


def target_ids(namesrv: str, topic: str) -> Counter[str]:
    ids: Counter[str] = Counter()
    with PullConsumer(namesrv=namesrv, group="eo-reader") as consumer:
        for mq, (lo, hi) in consumer.queue_ranges(topic).items():
            at = lo
            while at < hi:
                res = consumer.pull(mq, at, max_msgs=2000)
                for m in res.messages:
                    ids[m.body.decode().removesuffix("|mirrored")] += 1
                at = res.next_begin_offset
    return ids


def wait_for_pause(pause: Path, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 600) -> str:
    deadline = time.monotonic() + timeout_s
    while not pause.exists():
        assert proc.poll() is None, "the query ended before a commit spanned brokers:\n" + log.read_text()[-3000:]
        assert time.monotonic() < deadline, "no commit paused between brokers:\n" + log.read_text()[-3000:]
        time.sleep(0.1)
    return pause.read_text()


def test_sink_batches_spanning_brokers_survive_kills_between_commits_and_a_broker_restart(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    kills = crash_scale(2, 3)
    source, target, n = "eo_a", "eo_b", kills * 20_000  # 20,000 rows per trigger: a batch per kill, each over 3 brokers
    cluster_topic(cluster, source, QUEUES)
    cluster_topic(cluster, target, QUEUES)
    produce_ids(cluster.namesrv, source, n)
    checkpoint, log, pause = tmp_path / "chk", tmp_path / "driver.log", tmp_path / "paused"
    args = [sys.executable, str(SINK_QUERY), f"namesrv={cluster.namesrv}", source, target, str(checkpoint),
            "exactly-once", "20000"]
    router = Router(namesrv=cluster.namesrv)
    client = CoordinatorClient(router)
    try:
        for kill in range(kills):
            with open(log, "ab") as out:
                proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                        env={**os.environ, PAUSE_ENV: str(pause)})
            txn_id = wait_for_pause(pause, proc, log)
            # Where the driver stands: the decision is on the coordinator's disk, the first participant committed
            # its part, another has not. The kill lands between two brokers' commits.
            [decision] = client.query(coordinator_of(txn_id), [txn_id])
            assert decision.commit and len(decision.participants) >= 2, decision
            status = {s.broker_name: client.transactions(s.broker_name, txn_id)[txn_id] for s in decision.participants}
            first, *others = [s.broker_name for s in decision.participants]
            assert status[first] == "COMMITTED" and "OPEN" in {status[b] for b in others}, status
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pause.unlink()
            print(f"kill {kill + 1} between commits of {txn_id}: {status}")
            if kill == 1:  # a broker holding an open part crashes, and comes back on its store
                crashed = next(b for b in others if status[b] == "OPEN")
                cluster.kill(crashed)
                cluster.restart(crashed)
                wait_until(lambda: client.transactions(crashed, txn_id).get(txn_id) == "OPEN",  # noqa: B023
                           f"{crashed} to recover its open part of {txn_id}", timeout_s=60, interval_s=0.2)
        with open(log, "ab") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        assert proc.wait(timeout=900) == 0, log.read_text()[-4000:]
    finally:
        router.close()
    ids = target_ids(cluster.namesrv, target)
    expected = {f"id-{i:07d}" for i in range(n)}
    missing = expected - set(ids)
    dupes = {k: c for k, c in ids.items() if c > 1}
    assert not missing, f"{len(missing)} rows lost, e.g. {sorted(missing)[:5]}"
    assert not dupes, f"{len(dupes)} rows written more than once, e.g. {list(dupes.items())[:5]}"
    assert set(ids) == expected
