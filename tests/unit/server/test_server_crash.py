"""SIGKILL of a `--flush sync` broker process loses no acknowledged message."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from broker.client import Message, Producer, PullConsumer, PullStatus
from broker.errors import BrokerError
from broker.server.process import BrokerProcess

CYCLES = 3
QUEUES = 4


def producer_loop(endpoint: str, name: str, queue_id: int, acked: list[bytes], stop: threading.Event) -> None:
    """Send until the broker dies; record only bodies the broker acknowledged as SEND_OK."""
    with Producer(endpoint, timeout_s=5) as p:
        i = 0
        while not stop.is_set():
            batch = [Message("Crash", f"{name}-{i + k}".encode()) for k in range(5)]
            try:
                results = p.send_batch(batch, queue_id=queue_id)
            except BrokerError:
                return
            acked += [m.body for m, r in zip(batch, results, strict=True) if r.status.value == "SEND_OK"]
            i += 5


def read_all(endpoint: str) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {}
    with PullConsumer(endpoint, "verify") as c:
        for qid in range(QUEUES):
            offset, bodies = 0, []
            while True:
                r = c.pull("Crash", qid, offset, max_msgs=1000)
                if r.status is not PullStatus.FOUND:
                    assert r.status is PullStatus.NO_NEW_MSG, r.status
                    break
                assert [m.queue_offset for m in r.messages] == list(range(offset, r.next_begin_offset))
                bodies += [m.body for m in r.messages]
                offset = r.next_begin_offset
            out[qid] = bodies
    return out


@pytest.mark.slow
def test_sigkill_sync_flush_broker_loses_no_acknowledged_message(tmp_path: Path) -> None:
    store = tmp_path / "crash"
    config = tmp_path / "broker.json"
    config.write_text('{"store": {"mapped_file_size_commit_log": 1048576, "max_message_size": 65536}}')
    rng = random.Random(3)
    all_acked: list[bytes] = []
    for cycle in range(CYCLES):
        broker = BrokerProcess(store, flush="sync", config=config).start()
        try:
            with Producer(broker.endpoint) as p:
                p.send(Message("Crash", b"warmup"), queue_id=0)  # creates the topic with its queues
                all_acked.append(b"warmup")
            stop = threading.Event()
            acked_now: list[list[bytes]] = [[] for _ in range(3)]
            workers = [
                threading.Thread(
                    target=producer_loop,
                    args=(broker.endpoint, f"c{cycle}w{w}", w % QUEUES, acked_now[w], stop),
                    daemon=True,
                )
                for w in range(3)
            ]
            for w in workers:
                w.start()
            time.sleep(rng.uniform(0.3, 1.2))
            broker.kill()
            stop.set()
            for w in workers:
                w.join(10)
            all_acked += [b for acked in acked_now for b in acked]
        finally:
            if broker.proc and broker.proc.poll() is None:
                broker.kill()
        assert sum(map(len, acked_now)) > 0, f"cycle {cycle}: nothing was acknowledged before the kill"
    with BrokerProcess(store, flush="sync", config=config) as broker:
        stored = read_all(broker.endpoint)
        present = {b for bodies in stored.values() for b in bodies}
        missing = [b for b in all_acked if b not in present]
        assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:5]}"
        for bodies in stored.values():  # per producer, order within its queue is kept
            by_worker: dict[str, list[int]] = {}
            for b in bodies:
                if b != b"warmup":
                    w, n = b.decode().split("-")
                    by_worker.setdefault(w, []).append(int(n))
            assert all(seq == sorted(seq) for seq in by_worker.values())
        assert broker.stop() == 0
