"""Restarts keep offsets, topics and messages; SIGTERM shuts down cleanly; metrics are served."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.client import Admin, Message, Producer, PullConsumer, PullStatus
from broker.errors import BrokerError
from broker.server.broker_controller import BrokerController
from broker.server.process import BrokerProcess

BrokerFactory = Callable[..., BrokerController]


def test_offsets_topics_and_messages_survive_restart(broker_factory: BrokerFactory, tmp_path: Path) -> None:
    store = tmp_path / "restart"
    first = broker_factory(store)
    ep = f"127.0.0.1:{first.port}"
    with Producer(ep) as p, PullConsumer(ep, "g1") as c, Admin(ep) as admin:
        admin.create_topic("Four", 4)
        p.send_batch([Message("Four", f"{i}".encode()) for i in range(12)], queue_id=2)
        assert first.store is not None and first.store.wait_dispatched()
        c.commit_offsets({("Four", 2): 7, ("Four", 0): 0})
    assert first.store is not None and first.store.check() == []
    first.shutdown()
    assert not (store / "abort").exists()
    saved = json.loads((store / "config" / "consumerOffset.json").read_text())
    assert saved["offsetTable"]["Four@g1"] == {"0": 0, "2": 7}

    second = broker_factory(store)
    ep = f"127.0.0.1:{second.port}"
    with PullConsumer(ep, "g1") as c, Admin(ep) as admin:
        assert c.committed_offsets("Four") == {0: 0, 2: 7}
        assert {t.topic: t.read_queue_nums for t in admin.list_topics()}["Four"] == 4
        r = c.pull("Four", 2, 7, max_msgs=100)
        assert [m.body for m in r.messages] == [b"7", b"8", b"9", b"10", b"11"]
        lag = {x.queue_id: x.lag for x in admin.consumer_lag("g1", "Four")}
        assert lag[2] == 5


def test_offsets_persisted_periodically_without_shutdown(broker_factory: BrokerFactory) -> None:
    b = broker_factory(consumer_offset_persist_interval_ms=100)
    ep = f"127.0.0.1:{b.port}"
    with Producer(ep) as p, PullConsumer(ep, "gp") as c:
        p.send(Message("P", b"x"), queue_id=0)
        assert b.store is not None and b.store.wait_dispatched()
        c.commit_offsets({("P", 0): 1})
    path = b.config.config_dir / "consumerOffset.json"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not (path.exists() and "P@gp" in path.read_text()):
        time.sleep(0.05)
    assert json.loads(path.read_text())["offsetTable"]["P@gp"] == {"0": 1}


def test_sigterm_is_a_clean_shutdown(tmp_path: Path) -> None:
    store = tmp_path / "proc"
    broker = BrokerProcess(store, metrics_port=0).start()
    try:
        with Producer(broker.endpoint) as p:
            p.send(Message("Term", b"bye"), queue_id=0)
        assert (store / "abort").exists()
        assert broker.stop() == 0
    finally:
        if broker.proc and broker.proc.poll() is None:
            broker.kill()
    assert not (store / "abort").exists()
    assert (store / "config" / "topics.json").exists()
    again = BrokerProcess(store, metrics_port=0).start()  # the message survives the restart
    try:
        with PullConsumer(again.endpoint, "after-term") as c:
            got = c.pull("Term", 0, 0)
            assert got.status is PullStatus.FOUND and [m.body for m in got.messages] == [b"bye"]
        assert again.stop() == 0
    finally:
        if again.proc and again.proc.poll() is None:
            again.kill()


def test_metrics_endpoint(broker_factory: BrokerFactory) -> None:
    b = broker_factory(metrics_port=0, cluster_name="Blue", broker_name="broker-m")
    ep = f"127.0.0.1:{b.port}"
    with Producer(ep) as p, PullConsumer(ep, "mg") as c:
        p.send_batch([Message("M", b"x" * 10) for _ in range(5)], queue_id=1)
        assert b.store is not None and b.store.wait_dispatched()
        c.pull("M", 1, 0)
        c.pull("M", 1, 5, timeout_ms=50)
        c.commit_offsets({("M", 1): 2})
    with urllib.request.urlopen(f"http://127.0.0.1:{b.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    ours = 'cluster="Blue",broker="broker-m"'
    assert f"sluice_put_messages_total{{{ours}}} 5" in text
    assert f"sluice_get_messages_total{{{ours}}} 5" in text
    assert f'sluice_queue_max_offset{{{ours},topic="M",queue="1"}} 5' in text
    assert f'sluice_group_lag{{{ours},group="mg",topic="M"}} 3' in text
    assert f"sluice_long_poll_wait_seconds_count{{{ours}}} 1" in text
    assert f'sluice_put_latency_seconds_bucket{{{ours},le="+Inf"}} 1' in text
    assert f"sluice_put_latency_seconds_count{{{ours}}} 1" in text
    assert f"sluice_store_disk_usage_ratio{{{ours}}} " in text and f"sluice_store_commit_log_bytes{{{ours}}} " in text
    series = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert series and all(line.split("{", 1)[1].startswith(ours) for line in series), "a series without its broker"


def test_python_dash_m_broker_shows_every_command() -> None:
    out = subprocess.run([sys.executable, "-m", "broker", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for command in ("broker", "topic", "send", "consume", "query", "group", "stats"):
        assert command in out.stdout


def test_second_broker_on_a_locked_store_fails_cleanly(broker_factory: BrokerFactory, tmp_path: Path) -> None:
    broker_factory(tmp_path / "locked")
    proc = BrokerProcess(tmp_path / "locked")
    try:
        proc.start(timeout_s=30)
        raise AssertionError("a second broker started on a locked store")
    except BrokerError as e:
        assert "lock" in e.message.lower(), e.message


def test_topics_in_the_store_but_not_in_topics_json_are_adopted(broker_factory: BrokerFactory, tmp_path: Path) -> None:
    store = tmp_path / "adopt"
    first = broker_factory(store)
    ep = f"127.0.0.1:{first.port}"
    with Admin(ep) as admin, Producer(ep) as p:
        admin.create_topic("Lost", 12)
        p.send(Message("Lost", b"kept"), queue_id=11)
    first.shutdown()
    for name in ("topics.json", "topics.json.bak"):  # the topic table is lost; the data is not
        (store / "config" / name).unlink(missing_ok=True)
    second = broker_factory(store)
    assert second.topics.require("Lost").read_queue_nums == 12
    with PullConsumer(f"127.0.0.1:{second.port}", "g") as c:
        assert [m.body for m in c.pull("Lost", 11, 0).messages] == [b"kept"]


def test_shutdown_answers_held_pulls_and_finishes_in_flight_calls(broker_factory: BrokerFactory) -> None:
    b = broker_factory()
    ep = f"127.0.0.1:{b.port}"
    with Producer(ep) as p:
        p.send(Message("Held", b"x"), queue_id=0)
    assert b.store is not None and b.store.wait_dispatched()
    answers: list[PullStatus] = []
    with PullConsumer(ep, "g") as c:
        holder = threading.Thread(target=lambda: answers.append(c.pull("Held", 0, 1, timeout_ms=20_000).status))
        holder.start()
        while b.hold.held_count() == 0:
            time.sleep(0.01)
        started = time.monotonic()
        b.shutdown()
        holder.join(5)
    assert answers == [PullStatus.NO_NEW_MSG] and time.monotonic() - started < 5


def test_port_in_use_is_a_clear_error(broker_factory: BrokerFactory, tmp_path: Path) -> None:
    first = broker_factory(tmp_path / "one")
    try:
        broker_factory(tmp_path / "two", listen=f"127.0.0.1:{first.port}")
        raise AssertionError("two brokers listen on one port")
    except BrokerError as e:
        assert "cannot listen" in e.message and str(first.port) in e.message


def test_offsets_are_still_saved_after_a_periodic_task_raised(broker_factory: Callable[..., BrokerController]) -> None:
    """The thread that saves consumer offsets caught only OSError: anything else ended it, and offsets were then
    saved only at shutdown (a crash lost all progress since the start)."""
    broker = broker_factory(consumer_offset_persist_interval_ms=50)
    real_persist, calls = broker.offsets.persist_if_dirty, []

    def fails_once() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("simulated bug in a periodic task")
        real_persist()

    broker.offsets.persist_if_dirty = fails_once  # type: ignore[method-assign]
    endpoint = f"127.0.0.1:{broker.port}"
    with Producer(endpoint) as producer, PullConsumer(endpoint, "G") as consumer:
        producer.send(Message("Saved", b"x"), queue_id=0)
        consumer.commit_offsets({("Saved", 0): 1})
        deadline = time.monotonic() + 10
        while (
            not broker.offsets.path.exists()
            or "Saved@G" not in json.loads(broker.offsets.path.read_text())["offsetTable"]
        ):
            assert time.monotonic() < deadline, f"offsets not saved after the periodic task raised ({len(calls)} calls)"
            time.sleep(0.02)
    assert len(calls) >= 2


def test_shutdown_during_a_restart_in_place_leaves_nothing_running(broker_factory: BrokerFactory,
                                                                    tmp_path: Path) -> None:
    """A replica restarts in place from a thread of its own (a truncation, a lost mastership); its owner's shutdown
    at that moment must stop the restarted broker, not return while a new one starts behind it."""
    store = tmp_path / "restarting"
    for wait_for_restart in (True, False):  # the owner's shutdown after the restart began, and before
        broker = broker_factory(store)
        broker._restart_in_background("test")
        deadline = time.monotonic() + 10
        while wait_for_restart and not broker._restart_lock.locked() and time.monotonic() < deadline:
            time.sleep(0.001)
        broker.shutdown()
        restarts = [t for t in threading.enumerate() if t.name == "broker-restart"]
        for t in restarts:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in restarts)
        assert broker._stopped
        with Admin(f"127.0.0.1:{broker.port}", timeout_s=1) as admin, pytest.raises(BrokerError):
            admin.stats()  # nobody answers on the port
        again = broker_factory(store)  # the store's lock was released: nothing holds it
        again.shutdown()
