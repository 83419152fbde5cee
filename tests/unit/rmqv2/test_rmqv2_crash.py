"""Everything in flight survives a broker SIGKILL and restart: no acknowledged message is lost, no acked message is
delivered again, and a message received before the crash stays invisible until its time (official clients)."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
from rmqv2_helpers import FAST, message, name, new_topic, producer, simple_consumer

from broker.address import free_fixed_port
from broker.server.process import BrokerProcess
from tests.support.brokers import start_broker


def restart(store: Path, port: int) -> BrokerProcess:
    return start_broker(store, {**FAST, "listen": f"127.0.0.1:{port}"})


def test_in_flight_messages_survive_sigkill(tmp_path: Path) -> None:
    store, port = tmp_path / "store", free_fixed_port()
    proc = start_broker(store, {**FAST, "listen": f"127.0.0.1:{port}"})
    try:
        topic, group = new_topic(proc.endpoint), name("g")
        with producer(proc.endpoint, topic) as p:
            ids = {p.send(message(topic, f"c{i}".encode())).message_id for i in range(20)}
        with simple_consumer(proc.endpoint, group, topic) as c:
            got: list = []
            while len(got) < 20:
                got += c.receive(32, 8)  # 8 s invisible: still out after the restart
            acked = {m.message_id for m in got[:10]}
            for m in got[:10]:
                c.ack(m)
            received_at = time.monotonic()
        proc.kill()
        proc = restart(store, port)
        with simple_consumer(proc.endpoint, group, topic) as c:
            early = c.receive(32, 30)
            if time.monotonic() - received_at < 7:  # the in-flight ten are still invisible: none may come yet
                assert early == [], [m.message_id for m in early]
            later = list(early)
            deadline = time.monotonic() + 40
            while len(later) < 10 and time.monotonic() < deadline:
                later += c.receive(32, 30)
            for m in later:
                c.ack(m)
            time.sleep(1.5)
            assert c.receive(32, 30) == []
        assert {m.message_id for m in later} == ids - acked  # no acked message again, every unacked one once
        assert all(m.delivery_attempt == 2 for m in later)
    finally:
        if proc.proc is not None and proc.proc.poll() is None:
            assert proc.stop() == 0


@pytest.mark.slow
def test_pop_consumption_through_repeated_sigkills_loses_and_repeats_nothing_acked(tmp_path: Path) -> None:
    store, port = tmp_path / "store", free_fixed_port()
    proc = start_broker(store, {**FAST, "listen": f"127.0.0.1:{port}"})
    rng = random.Random(22)
    topic, group = new_topic(proc.endpoint), name("g")
    sent: set[str] = set()
    acked: dict[str, int] = {}
    unanswered: set[str] = set()  # acks whose answer the kill cut off: stored or not, the test cannot know
    try:
        for cycle in range(4):
            with producer(proc.endpoint, topic) as p:
                sent |= {p.send(message(topic, f"{cycle}:{i}".encode())).message_id for i in range(50)}
            stop = threading.Event()

            def consume(endpoint: str, stop: threading.Event) -> None:
                try:
                    with simple_consumer(endpoint, group, topic, wait_s=1) as c:
                        while not stop.is_set():
                            for m in c.receive(16, 2):
                                if rng.random() < 0.8:
                                    unanswered.add(m.message_id)
                                    c.ack(m)  # only an ack that returned counts as acked
                                    unanswered.discard(m.message_id)
                                    acked[m.message_id] = acked.get(m.message_id, 0) + 1
                except Exception:  # noqa: BLE001 (the broker was killed under it: expected; what was acked counts)
                    return

            worker = threading.Thread(target=consume, args=(proc.endpoint, stop))
            worker.start()
            time.sleep(rng.uniform(0.5, 2.0))
            proc.kill()
            stop.set()
            worker.join(30)
            proc = restart(store, port)
        with simple_consumer(proc.endpoint, group, topic, wait_s=2) as c:
            deadline = time.monotonic() + 60
            while set(acked) | unanswered != sent | unanswered and time.monotonic() < deadline:
                for m in c.receive(32, 5):
                    c.ack(m)
                    acked[m.message_id] = acked.get(m.message_id, 0) + 1
        lost = sent - set(acked) - unanswered
        assert not lost, f"{len(lost)} acknowledged messages never delivered"
        assert all(n == 1 for n in acked.values()), "an acked message was delivered and acked again"
    finally:
        if proc.proc is not None and proc.proc.poll() is None:
            assert proc.stop() == 0
