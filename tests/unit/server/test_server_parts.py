"""Broker parts that need no store: long-poll waiters, metrics exposition, consumer registry, tag expressions."""

from __future__ import annotations

import threading
import time
import urllib.request

import pytest

from broker.errors import SubscriptionParseError
from broker.format.message import tag_hash_code
from broker.format.subscription import parse_tags, tag_codes, tag_matches
from broker.server.consumer_manager import CLUSTERING, ConsumerManager
from broker.server.metrics import BrokerMetrics, MetricsServer
from broker.server.pull_hold import PullHoldService


def test_arrival_between_check_and_sleep_still_wakes_the_pull() -> None:
    """The re-check runs after registration: an arrival during the re-check is seen, never slept through."""
    hold = PullHoldService(recheck_ms=30_000)
    arrived = threading.Event()

    def recheck_that_races_an_arrival() -> bool:
        hold.on_arrival("T", 0, 1)  # the message lands right after the pull found nothing
        arrived.set()
        return False  # and the re-check itself did not see it (the worst interleaving)

    started = time.monotonic()
    assert hold.wait_for("T", 0, 0, 10_000, recheck_that_races_an_arrival)
    assert arrived.is_set() and time.monotonic() - started < 3.0  # woken, not held the 10 s
    assert hold.held_count() == 0


def test_held_pull_wakes_on_its_queue_only_and_not_before() -> None:
    hold = PullHoldService(recheck_ms=30_000)
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(hold.wait_for("T", 1, 5, 5_000, lambda: False)))
    t.start()
    deadline = time.monotonic() + 2
    while hold.held_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    hold.on_arrival("T", 0, 100)  # another queue
    hold.on_arrival("T", 1, 5)  # same queue, but nothing at offset 5 yet
    t.join(0.2)
    assert t.is_alive() and not result
    hold.on_arrival("T", 1, 6)
    t.join(2)
    assert result == [True]


def test_timeout_and_shutdown_release_held_pulls() -> None:
    hold = PullHoldService(recheck_ms=30_000)
    started = time.monotonic()
    assert not hold.wait_for("T", 0, 0, 50, lambda: False)
    assert 0.04 < time.monotonic() - started < 3.0  # its own 50 ms, not the 30 s re-check
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(hold.wait_for("T", 0, 0, 20_000, lambda: False)))
    t.start()
    while hold.held_count() == 0:
        time.sleep(0.001)
    hold.shutdown()
    t.join(2)
    assert not t.is_alive()
    assert not hold.wait_for("T", 0, 0, 1000, lambda: True)  # after shutdown nothing is held


def test_short_polling_rechecks_at_its_interval() -> None:
    hold = PullHoldService(long_polling_enable=False, short_polling_time_ms=50)
    checks = []
    started = time.monotonic()
    hold.wait_for("T", 0, 0, 10_000, lambda: checks.append(1) is not None)
    assert len(checks) == 2 and time.monotonic() - started < 3.0  # before and after one short-poll interval, not 10 s


def test_metrics_exposition_over_http() -> None:
    m = BrokerMetrics()
    m.put_messages.inc(3)
    m.put_latency.observe(0.0003)
    m.put_latency.observe(7.0)
    m.add_gauge("sluice_queue_max_offset", "max offset", lambda: [((("topic", 'we"ird'), ("queue", "0")), 42.0)])
    server = MetricsServer(m, "127.0.0.1", 0)
    server.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:
            text = r.read().decode()
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    finally:
        server.stop()
    assert "# TYPE sluice_put_messages_total counter" in text
    assert "sluice_put_messages_total 3" in text
    assert 'sluice_put_latency_seconds_bucket{le="0.0005"} 1' in text
    assert 'sluice_put_latency_seconds_bucket{le="+Inf"} 2' in text
    assert "sluice_put_latency_seconds_count 2" in text
    assert 'sluice_queue_max_offset{topic="we\\"ird",queue="0"} 42' in text


def test_consumer_registry_versions_and_expiry() -> None:
    cm = ConsumerManager(expire_ms=50)
    v1 = cm.heartbeat("g", "b", {"T": "*"}, CLUSTERING)
    v2 = cm.heartbeat("g", "a", {"T": "*"}, CLUSTERING)
    assert v2 > v1
    assert cm.heartbeat("g", "a", {"T": "*"}, CLUSTERING) == v2  # a plain heartbeat changes nothing
    assert cm.consumer_ids("g") == (["a", "b"], v2)
    v3 = cm.unregister("g", "a")
    assert v3 > v2 and cm.consumer_ids("g")[0] == ["b"]
    time.sleep(0.1)
    assert cm.expire() == [("g", "b")]
    assert not cm.has_group("g")
    assert cm._groups == {}  # a group with no consumers left is dropped (else every name ever seen would stay)
    v4 = cm.heartbeat("g", "c", {"T": "*"}, CLUSTERING)
    assert v4 > v3 and cm.consumer_ids("g") == (["c"], v4)  # back with a version never used before
    assert cm.unregister("g", "c") > v4 and cm._groups == {}


def test_tag_expressions() -> None:
    assert parse_tags("*") is None and parse_tags("") is None
    tags = parse_tags(" TagA || TagB ")
    assert tags == frozenset({"TagA", "TagB"})
    assert tag_codes(tags) == {tag_hash_code("TagA"), tag_hash_code("TagB")}
    assert tag_matches(tags, "TagA") and not tag_matches(tags, "TagC") and not tag_matches(tags, None)
    with pytest.raises(SubscriptionParseError, match="empty tag at term 2"):
        parse_tags("TagA || ")
