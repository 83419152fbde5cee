"""`sluice group list`, `group reset-offsets`, `consume --sql` and `query key --begin/--end` against a real broker."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time

from broker.client import FIRST, Admin, Message, Producer, PullConsumer, PushConsumer
from broker.server.broker_controller import BrokerController
from tests.support.listeners import BodyRecorder
from tests.support.waiting import wait_until

FAST = {"heartbeat_interval_ms": 100, "rebalance_interval_ms": 200, "persist_interval_ms": 100, "long_poll_ms": 1000}


def sluice(endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLUICE_ENDPOINT": endpoint}
    return subprocess.run([sys.executable, "-m", "broker", *args], capture_output=True, text=True, timeout=120,
                          env=env)


def send_in_two_phases(endpoint: str, topic: str, per_phase: int, keys: str = "") -> int:
    """``per_phase`` messages in each of queues 0 and 1, then as many again, stored at least 1 ms later; the store
    time (ms) of the first message of the second phase."""
    with Admin(endpoint) as admin:
        admin.create_topic(topic, 2, if_not_exists=True)
    with Producer(endpoint) as p, PullConsumer(endpoint, "probe") as c:
        for q in (0, 1):
            p.send_batch([Message(topic, b"early-%d" % i, keys=keys) for i in range(per_phase)], queue_id=q)
        last_ms = max(m.store_timestamp for q in (0, 1) for m in c.pull(topic, q, 0, per_phase).messages)
        wait_until(lambda: time.time() * 1000 > last_ms + 1)
        for q in (0, 1):
            p.send_batch([Message(topic, b"late-%d" % i, keys=keys) for i in range(per_phase)], queue_id=q)
        return min(m.store_timestamp for q in (0, 1) for m in c.pull(topic, q, per_phase, per_phase).messages)


def test_group_list(broker: BrokerController, endpoint: str) -> None:
    with Producer(endpoint) as p:
        p.send_batch([Message("GrpList", b"x")] * 4, queue_id=0)
    assert sluice(endpoint, "consume", "GrpList", "--group", "lister", "--from", "earliest").returncode == 0
    with PushConsumer(endpoint, "pusher", {"GrpList": "*"}, BodyRecorder(), **FAST).start() as live:
        wait_until(lambda: bool(live.assigned_queues()))
        listed = json.loads(sluice(endpoint, "group", "list", "--json").stdout)
        text = sluice(endpoint, "group", "list").stdout
    groups = {g["group"]: g for g in listed}
    assert groups["lister"] == {"group": "lister", "online_consumers": 0, "topics": ["GrpList"]}
    assert groups["pusher"]["online_consumers"] == 1 and "GrpList" in groups["pusher"]["topics"]
    assert [g["group"] for g in listed] == sorted(groups)
    assert any(line.split()[:2] == ["pusher", "1"] and "GrpList" in line for line in text.splitlines()), text


def test_reset_offsets_to_each_target(broker: BrokerController, endpoint: str) -> None:
    boundary_ms = send_in_two_phases(endpoint, "Rewind", 10)
    assert sluice(endpoint, "consume", "Rewind", "--group", "rw", "--from", "earliest").returncode == 0
    with Admin(endpoint) as admin:

        def committed() -> dict[int, int]:
            return admin.committed_offsets("rw", "Rewind")

        assert committed() == {0: 20, 1: 20}
        dry = sluice(endpoint, "group", "reset-offsets", "rw", "--topic", "Rewind", "--to-earliest", "--dry-run",
                     "--json")
        assert dry.returncode == 0, dry.stderr
        assert [(q["queue_id"], q["previous"], q["offset"]) for q in json.loads(dry.stdout)["queues"]] == [
            (0, 20, 0), (1, 20, 0)
        ]
        assert committed() == {0: 20, 1: 20}  # a dry run changes nothing
        when = dt.datetime.fromtimestamp(boundary_ms / 1000, tz=dt.UTC).isoformat(timespec="milliseconds")
        for target, want in ((["--to-earliest"], {0: 0, 1: 0}), (["--to-latest"], {0: 20, 1: 20}),
                             (["--to-offset", "5"], {0: 5, 1: 5}), (["--to-offset", "999"], {0: 20, 1: 20}),
                             (["--to-timestamp", str(boundary_ms)], {0: 10, 1: 10}),
                             (["--to-earliest", "--queue", "1"], {0: 10, 1: 0}),
                             (["--to-datetime", when], {0: 10, 1: 10})):
            out = sluice(endpoint, "group", "reset-offsets", "rw", "--topic", "Rewind", *target)
            assert out.returncode == 0, (target, out.stderr)
            assert committed() == want, target
    again = sluice(endpoint, "consume", "Rewind", "--group", "rw", "--json")  # reads from the reset offsets
    assert sorted(json.loads(line)["body"] for line in again.stdout.splitlines()) == sorted(
        f"late-{i}" for i in range(10) for _ in (0, 1)
    )
    missing = sluice(endpoint, "group", "reset-offsets", "rw", "--topic", "Rewind", "--to-earliest", "--queue", "7")
    assert missing.returncode == 1 and "has no queue 7" in missing.stderr


def test_reset_is_refused_while_a_push_consumer_runs_and_not_overwritten_after(
    broker: BrokerController, endpoint: str
) -> None:
    """A running PushConsumer commits the offsets it holds in memory: a reset under it would be overwritten on its
    next pull. So the reset is refused while it runs, and after it stopped the next consumer starts from it."""
    with Admin(endpoint) as admin:
        admin.create_topic("Live", 2)
    with Producer(endpoint) as p:
        for q in (0, 1):
            p.send_batch([Message("Live", b"%d-%d" % (q, i)) for i in range(15)], queue_id=q)
    with Admin(endpoint) as admin:
        first = BodyRecorder()
        with PushConsumer(endpoint, "live", {"Live": "*"}, first, consume_from=FIRST, **FAST).start():
            wait_until(lambda: len(first.bodies) == 30)
            wait_until(lambda: admin.committed_offsets("live", "Live") == {0: 15, 1: 15})
            refused = sluice(endpoint, "group", "reset-offsets", "live", "--topic", "Live", "--to-earliest")
            assert refused.returncode == 1, refused.stdout
            assert "group 'live' has 1 live consumer(s)" in refused.stderr and "NO_PERMISSION" in refused.stderr
            assert admin.committed_offsets("live", "Live") == {0: 15, 1: 15}  # nothing changed
        done = sluice(endpoint, "group", "reset-offsets", "live", "--topic", "Live", "--to-earliest")
        assert done.returncode == 0, done.stderr
        assert admin.committed_offsets("live", "Live") == {0: 0, 1: 0}
        second = BodyRecorder()
        with PushConsumer(endpoint, "live", {"Live": "*"}, second, **FAST).start():
            wait_until(lambda: len(second.bodies) == 30)  # every message again, from the reset offsets
            wait_until(lambda: admin.committed_offsets("live", "Live") == {0: 15, 1: 15})
    assert sorted(second.bodies) == sorted(first.bodies)


def test_consume_with_an_sql92_filter(broker: BrokerController, endpoint: str) -> None:
    with Producer(endpoint) as p:
        p.send_batch([Message("CliSql", b"%d" % i, properties={"region": "eu" if i % 3 == 0 else "us", "n": str(i)})
                      for i in range(12)], queue_id=0)
    out = sluice(endpoint, "consume", "CliSql", "--group", "sql", "--from", "earliest", "--json",
                 "--sql", "region = 'eu' AND n > 2")
    assert out.returncode == 0, out.stderr
    assert [json.loads(line)["body"] for line in out.stdout.splitlines()] == ["3", "6", "9"]
    bad = sluice(endpoint, "consume", "CliSql", "--group", "sql2", "--from", "earliest", "--sql", "region = ")
    assert bad.returncode == 1 and "SUBSCRIPTION_PARSE_FAILED" in bad.stderr


def test_query_key_within_a_time_range(broker: BrokerController, endpoint: str) -> None:
    boundary_ms = send_in_two_phases(endpoint, "KeyTime", 3, keys="order-7")
    assert broker.store is not None and broker.store.wait_dispatched()

    def bodies(*args: str) -> list[str]:
        out = sluice(endpoint, "query", "key", "KeyTime", "order-7", "--json", *args)
        assert out.returncode == 0, out.stderr
        return sorted(m["body"] for m in json.loads(out.stdout))

    assert len(bodies()) == 12
    assert bodies("--begin", str(boundary_ms)) == sorted(f"late-{i}" for i in range(3) for _ in (0, 1))
    assert bodies("--end", str(boundary_ms - 1)) == sorted(f"early-{i}" for i in range(3) for _ in (0, 1))
    iso = dt.datetime.fromtimestamp(boundary_ms / 1000, tz=dt.UTC).isoformat(timespec="milliseconds")
    assert bodies("--begin", iso, "--max", "2") == ["late-1", "late-2"]  # the newest two (both of queue 1)
    backwards = sluice(endpoint, "query", "key", "KeyTime", "order-7", "--begin", "2000", "--end", "1000")
    assert backwards.returncode == 1 and "--begin (2000 ms) is after --end (1000 ms)" in backwards.stderr
