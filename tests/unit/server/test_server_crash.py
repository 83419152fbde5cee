"""SIGKILL of a `--flush sync` broker process loses no acknowledged message."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from broker.client import Admin, Message, Producer, PullConsumer, PullStatus
from broker.errors import BrokerError
from broker.server.process import BrokerProcess

CYCLES = 3
QUEUES = 4
OFFSET_ROOM = 20_000  # messages per queue under the offset-commit crash test


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


def kill_while_running(broker: BrokerProcess, workers: list[threading.Thread], stop: threading.Event,
                       after_s: float) -> None:  # fmt: skip
    """Start the writers, SIGKILL the broker ``after_s`` later, then stop and collect the writers."""
    for w in workers:
        w.start()
    time.sleep(after_s)
    broker.kill()
    stop.set()
    for w in workers:
        w.join(10)


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
            kill_while_running(broker, workers, stop, rng.uniform(0.3, 1.2))
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


def config_writer(endpoint: str, cycle: int, acked: dict[str, int], stop: threading.Event) -> None:
    """Create topics until the broker dies; record the ones it acknowledged, with their queue counts."""
    with Admin(endpoint, timeout_s=5) as admin:
        i = 0
        while not stop.is_set():
            name, queues = f"Cfg{cycle}x{i}", 1 + i % 4
            try:
                admin.create_topic(name, queues)
            except BrokerError:
                return
            acked[name] = queues
            i += 1


def offset_writer(endpoint: str, acked: list[int], stop: threading.Event) -> None:
    """Commit ever larger offsets of group `g` until the broker dies; record each acknowledged one."""
    with PullConsumer(endpoint, "g", timeout_s=5) as c:
        while not stop.is_set():
            offset = (acked[-1] if acked else 0) + 1
            if offset > OFFSET_ROOM:
                return
            try:
                c.commit_offsets({("Crash", q): offset for q in range(QUEUES)})
            except BrokerError:
                return
            acked.append(offset)


@pytest.mark.slow
def test_sigkill_during_topic_and_offset_writes_keeps_the_config_files_whole(tmp_path: Path) -> None:
    """The broker's other write paths: topic creation (acknowledged once topics.json is replaced and synced) and
    consumer-offset commits (persisted every consumer_offset_persist_interval_ms, as RocketMQ's, so a crash can
    take an offset back to its last persist: a re-delivery, never a skip). After each SIGKILL the files load,
    every acknowledged topic is there with its queues, and no offset is ahead of what was acknowledged."""
    store = tmp_path / "cfg"
    config = tmp_path / "broker.json"
    config.write_text('{"consumer_offset_persist_interval_ms": 50, "store": {"mapped_file_size_commit_log": 1048576,'
                      ' "max_message_size": 65536}}')  # fmt: skip
    rng = random.Random(5)
    topics: dict[str, int] = {}
    last_offset = 0
    for cycle in range(CYCLES):
        broker = BrokerProcess(store, flush="sync", config=config).start()
        try:
            with Admin(broker.endpoint) as admin:
                if cycle == 0:  # room for the offsets: a commit may not pass a queue's max offset
                    admin.create_topic("Crash", QUEUES)
                    with Producer(broker.endpoint) as p:
                        for q in range(QUEUES):
                            for _ in range(OFFSET_ROOM // 1000):
                                p.send_batch([Message("Crash", b"o")] * 1000, queue_id=q)
                assert {t.topic: t.read_queue_nums for t in admin.list_topics()}.items() >= topics.items()
                committed = admin.committed_offsets("g", "Crash")
                assert all(off <= last_offset for off in committed.values()), (committed, last_offset)
            stop, offsets = threading.Event(), [last_offset]
            workers = [
                threading.Thread(target=config_writer, args=(broker.endpoint, cycle, topics, stop), daemon=True),
                threading.Thread(target=offset_writer, args=(broker.endpoint, offsets, stop), daemon=True),
            ]
            kill_while_running(broker, workers, stop, rng.uniform(0.3, 1.0))
            assert offsets[-1] > last_offset, f"cycle {cycle}: no offset commit was acknowledged before the kill"
            last_offset = offsets[-1]
        finally:
            if broker.proc and broker.proc.poll() is None:
                broker.kill()
    with BrokerProcess(store, flush="sync", config=config) as broker, Admin(broker.endpoint) as admin:
        listed = {t.topic: t.read_queue_nums for t in admin.list_topics()}
        lost = {name: q for name, q in topics.items() if listed.get(name) != q}
        assert not lost and len(topics) > CYCLES, f"{len(lost)} of {len(topics)} acknowledged topics lost: {lost}"
        committed = admin.committed_offsets("g", "Crash")
        assert set(committed) == set(range(QUEUES)) and max(committed.values()) <= last_offset
        assert broker.stop() == 0
