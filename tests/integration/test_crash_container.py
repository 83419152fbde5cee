"""`docker kill` of a SYNC_FLUSH broker while producers send: after a restart on the same volume every
acknowledged message is there, byte for byte, at the queue offset it was acknowledged with, and the store's
check() is clean.

Several kill rounds on one volume, each at a random moment (seeded, printed), with two producer threads (single
sends and batches) so the kill lands in the middle of writes, flushes and acknowledgements.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field

import docker
import pytest
from sluice_containers import BrokerFactory, check_store

from broker.client import Admin, Message, Producer, PullConsumer, PullStatus, SendStatus
from broker.errors import BrokerError
from broker.testing import SluiceContainer
from tests.support.brokers import wait_dispatched

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "durable"
QUEUES = 4
KILL_ROUNDS = 3
KILL_AFTER_S = (0.5, 2.5)  # the kill lands at a random moment in this window after sends start
SEND_TIMEOUT_S = 10.0


@dataclass
class Acked:
    """Messages the broker acknowledged: (queue id, queue offset) -> body."""

    at: dict[tuple[int, int], bytes] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # found by the producer threads, asserted by the test
    not_durable: int = 0  # FLUSH_DISK_TIMEOUT answers: stored, but never promised to be on disk
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, qid: int, offset: int, body: bytes) -> None:
        with self.lock:
            if (qid, offset) in self.at:
                self.problems.append(f"queue {qid} offset {offset} acknowledged twice")
            self.at[(qid, offset)] = body


def send_until_killed(
    endpoint: str, acked: Acked, round_no: int, writer: int, batch: bool, stop: threading.Event
) -> None:
    """Sends unique bodies until the broker goes away; records exactly what was acknowledged SEND_OK."""
    seq = 0
    with Producer(endpoint, timeout_s=SEND_TIMEOUT_S) as producer:
        while not stop.is_set():
            n = 50 if batch else 1
            msgs = [
                Message(TOPIC, f"r{round_no}-w{writer}-{seq + i}-".encode() + os.urandom(64 + (seq + i) % 900))
                for i in range(n)
            ]
            seq += n
            try:
                results = producer.send_batch(msgs) if batch else [producer.send(msgs[0])]
            except BrokerError:
                return  # the broker is gone (killed): nothing of this call counts as acknowledged
            for r, m in zip(results, msgs, strict=True):
                if r.status is SendStatus.SEND_OK:  # SYNC_FLUSH: OK means on disk
                    acked.add(r.queue_id, r.queue_offset, m.body)
                else:
                    acked.not_durable += 1


def read_everything(endpoint: str) -> dict[tuple[int, int], bytes]:
    found: dict[tuple[int, int], bytes] = {}
    with PullConsumer(endpoint, "crash-verify") as consumer:
        for qid in range(QUEUES):
            offset = 0
            while True:
                result = consumer.pull(TOPIC, qid, offset, max_msgs=1000)
                if result.status is not PullStatus.FOUND:
                    break
                for m in result.messages:
                    found[(qid, m.queue_offset)] = m.body
                offset = result.next_begin_offset
    return found


def test_docker_kill_during_sync_flush_sends_loses_no_acknowledged_message(
    broker_factory: BrokerFactory, docker_client: docker.DockerClient, broker_image: str
) -> None:
    seed = int(os.environ.get("SLUICE_CRASH_SEED", time.time_ns() % 1_000_000))
    print(f"crash seed {seed} (rerun with SLUICE_CRASH_SEED={seed})")
    rng = random.Random(seed)
    broker: SluiceContainer = broker_factory(flush="sync")
    with Admin(broker.get_endpoint()) as admin:
        admin.create_topic(TOPIC, queues=QUEUES)
    acked = Acked()

    for round_no in range(KILL_ROUNDS):
        stop = threading.Event()
        endpoint = broker.get_endpoint()  # a restart may publish the port on another host port
        writers = [
            threading.Thread(target=send_until_killed, args=(endpoint, acked, round_no, w, w % 2 == 1, stop))
            for w in range(2)
        ]
        before = len(acked.at)
        for t in writers:
            t.start()
        time.sleep(rng.uniform(*KILL_AFTER_S))
        broker.kill()
        stop.set()
        for t in writers:
            t.join(timeout=SEND_TIMEOUT_S + 5)
            assert not t.is_alive(), "a producer hung after the broker was killed"
        assert not acked.problems, acked.problems
        assert len(acked.at) > before, f"round {round_no}: nothing was acknowledged before the kill"
        print(f"round {round_no}: {len(acked.at) - before} acknowledged, {acked.not_durable} not durable so far")

        # The store recovers after the crash and its oracle finds nothing wrong (broker still down).
        assert check_store(docker_client, broker_image, broker.volume) == []
        broker.restart()
        expected_max: dict[int, int] = {}
        for qid, offset in acked.at:
            expected_max[qid] = max(expected_max.get(qid, 0), offset + 1)
        wait_dispatched(broker.get_endpoint(), TOPIC, expected_max)
        found = read_everything(broker.get_endpoint())
        missing = sorted(k for k in acked.at if k not in found)
        assert not missing, f"round {round_no}: {len(missing)} acknowledged message(s) lost, first {missing[:5]}"
        changed = [k for k, body in acked.at.items() if found[k] != body]
        assert not changed, f"round {round_no}: acknowledged message(s) differ at {changed[:5]}"
        for qid in range(QUEUES):  # no holes: offsets are dense from 0
            offsets = sorted(o for q, o in found if q == qid)
            assert offsets == list(range(len(offsets))), f"queue {qid} has holes after recovery"

    broker.terminate()
    assert check_store(docker_client, broker_image, broker.volume) == []
