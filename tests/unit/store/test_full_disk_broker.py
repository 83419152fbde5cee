"""A SYNC_FLUSH broker process whose store is on a 64 MiB tmpfs that another process fills: sends are refused with
SERVICE_NOT_AVAILABLE, no acknowledged message is lost (the oldest commit-log file stays), pulls, offset commits
and key queries answer while the disk is full, and sends resume by themselves soon after space is freed."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from small_fs import fill, free_bytes, tmpfs

from broker.client import (
    FIRST,
    Admin,
    ConsumeStatus,
    Message,
    PopConsumer,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    ReceivedMessage,
)
from broker.errors import ResponseCode, ServiceNotAvailableError
from broker.server.process import BrokerProcess
from broker.store import MessageStore, StoreConfig

FS_MIB = 64
STORE = {
    "mapped_file_size_commit_log": 4 << 20, "mapped_file_size_consume_queue": 4000 * 20, "max_hash_slot_num": 4096,
    "max_index_num": 16384, "max_message_size": 64 << 10, "max_batch_bytes": 256 << 10,
}
BODY = b"b" * 1000
BATCH = 100
QUEUES = 2
# Sends refused for a full disk must be taken again within this long of the space coming back: the store probes
# the disk every second (cleanup.DISK_PROBE_INTERVAL_S).
RESUME_WITHIN_S = 2.5
POP_ROUNDS = 40  # receive-and-ack rounds while full: enough to fill the page the pop journal's last record is in


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "fs", FS_MIB) as mount:
        yield mount


def _metric(broker: BrokerProcess, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")]
    assert len(values) == 1, (name, values)
    return values[0]


def _pull_all(c: PullConsumer, topic: str, queue_id: int) -> list[bytes]:
    got: list[bytes] = []
    offset = 0
    while True:
        r = c.pull(topic, queue_id, offset, max_msgs=500)
        if r.status is not PullStatus.FOUND:
            return got
        got += [m.body[:8] for m in r.messages]
        offset = r.next_begin_offset


def _send_until_refused(p: Producer, acked: dict[int, list[bytes]], first: int) -> tuple[int, ServiceNotAvailableError]:
    n = first
    while n < first + 200_000:
        q = (n // BATCH) % QUEUES
        try:
            p.send_batch([Message("Full", b"%08d" % i + BODY, keys=f"k{i}") for i in range(n, n + BATCH)], queue_id=q)
        except ServiceNotAvailableError as e:
            return n, e
        acked[q] += [b"%08d" % i for i in range(n, n + BATCH)]
        n += BATCH
    raise AssertionError("sends were never refused")


def test_a_full_disk_refuses_sends_and_loses_nothing(small_disk: Path, tmp_path: Path) -> None:
    store = small_disk / "store"
    config = tmp_path / "broker.json"
    config.write_text(json.dumps({"store": STORE, "consumer_offset_persist_interval_ms": 500}))
    acked: dict[int, list[bytes]] = {q: [] for q in range(QUEUES)}
    with BrokerProcess(store, flush="sync", config=config, metrics_port=0, log_level="INFO") as b:
        with Producer(b.endpoint) as p, PullConsumer(b.endpoint, "readers") as c, Admin(b.endpoint) as admin:
            admin.create_topic("Full", QUEUES)
            admin.create_topic("Popped", 1)
            p.send_batch([Message("Popped", b"%04d" % i) for i in range(3 * POP_ROUNDS + 20)], queue_id=0)
            for n in range(0, 12_000, BATCH):  # three commit-log files of history
                q = (n // BATCH) % QUEUES
                p.send_batch([Message("Full", b"%08d" % i + BODY, keys=f"k{i}") for i in range(n, n + BATCH)],
                             queue_id=q)
                acked[q] += [b"%08d" % i for i in range(n, n + BATCH)]
            oldest = sorted(os.listdir(store / "commitlog"))[0]
            assert _metric(b, "sluice_store_disk_full") == 0

            fill(small_disk)  # another writer takes every byte left
            assert free_bytes(small_disk) == 0
            n, refused = _send_until_refused(p, acked, 12_000)
            assert refused.code is ResponseCode.SERVICE_NOT_AVAILABLE and "disk" in refused.message, refused
            assert _metric(b, "sluice_store_disk_full") == 1
            assert any("refusing writes" in line for line in b.output)

            # While full: nothing deleted, every acknowledged message read back, offsets committed, keys found.
            time.sleep(1.5)  # a few probes of the cleanup service at 100% use
            assert oldest in os.listdir(store / "commitlog")
            for q in range(QUEUES):
                assert _pull_all(c, "Full", q) == acked[q]
            c.commit_offsets({("Full", q): len(acked[q]) for q in range(QUEUES)})
            assert c.committed_offsets("Full") == {q: len(acked[q]) for q in range(QUEUES)}
            assert [m.body[:8] for m in admin.query_by_key("Full", "k0")] == [b"00000000"]
            with pytest.raises(ServiceNotAvailableError):
                p.send(Message("Full", b"still full"), queue_id=0)
            popped: list[bytes] = []
            with PopConsumer(b.endpoint, "poppers") as pc:
                for _ in range(POP_ROUNDS):  # pop receives and acks go on, their journal behind
                    got = pc.receive("Popped", 3, invisible_ms=60_000)
                    pc.ack_all(got)
                    popped += [m.message.body for m in got]
            assert popped == [b"%04d" % i for i in range(3 * POP_ROUNDS)]
            assert any("changes are kept in memory" in line for line in b.output)
            pushed: list[bytes] = []
            all_pushed = threading.Event()

            def consume(msgs: list[ReceivedMessage]) -> ConsumeStatus:
                pushed.extend(m.body[:8] for m in msgs)
                if len(pushed) >= len(acked[0]) + len(acked[1]):
                    all_pushed.set()
                return ConsumeStatus.CONSUME_SUCCESS

            # A new push consumer group: its heartbeat creates the group's retry topic, which topics.json cannot
            # take now; it consumes all the same.
            with PushConsumer(b.endpoint, "pushers", {"Full": "*"}, consume, consume_from=FIRST):
                assert all_pushed.wait(30), len(pushed)
            assert sorted(pushed) == sorted(acked[0] + acked[1])
            assert any("retry topic of group pushers created but not saved" in line for line in b.output)

            (small_disk / "filler").unlink()  # space comes back
            freed = time.monotonic()
            while True:
                try:
                    p.send(Message("Full", b"%08d" % n + BODY), queue_id=0)
                    break
                except ServiceNotAvailableError:
                    assert time.monotonic() - freed < RESUME_WITHIN_S, "sends did not resume"
                    time.sleep(0.05)
            acked[0].append(b"%08d" % n)
            assert _metric(b, "sluice_store_disk_full") == 0
        assert b.stop() == 0

    s = MessageStore(StoreConfig(store_path=str(store), **STORE))  # the store as the broker left it: the oracle
    s.start()
    try:
        assert s.check() == []
        for q in range(QUEUES):
            bodies: list[bytes] = []
            while (got := s.get_message("g", "Full", q, len(bodies), max_msgs=4096, max_bytes=16 << 20)).messages():
                bodies += [m.body[:8] for m in got.messages()]
            assert bodies == acked[q]
    finally:
        s.shutdown()
    with BrokerProcess(store, flush="sync", config=config) as b, PopConsumer(b.endpoint, "poppers") as pc:
        got = pc.receive("Popped", 5, invisible_ms=60_000)  # acked while the disk was full: not delivered again
        assert [m.message.body for m in got] == [b"%04d" % i for i in range(3 * POP_ROUNDS, 3 * POP_ROUNDS + 5)]
