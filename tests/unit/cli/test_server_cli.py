"""The `sluice` command line, run as a subprocess against a real broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from broker.client import Admin, Message, Producer, PullConsumer
from broker.errors import InvalidArgumentError
from broker.server.broker_controller import BrokerController
from tests.support.waiting import wait_until


def sluice(endpoint: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLUICE_ENDPOINT": endpoint}
    return subprocess.run([sys.executable, "-m", "broker", *args], input=stdin, capture_output=True, text=True,
                          timeout=120, env=env)


def test_topic_commands(broker: BrokerController, endpoint: str) -> None:
    out = sluice(endpoint, "topic", "create", "CliT", "--queues", "3")
    assert out.returncode == 0, out.stderr
    assert "CliT" in out.stdout and "queues" in out.stdout
    again = sluice(endpoint, "topic", "create", "CliT")
    assert again.returncode == 1 and "already exists" in again.stderr and "TOPIC_EXIST_ALREADY" in again.stderr
    listed = json.loads(sluice(endpoint, "topic", "list", "--json", "--endpoint", endpoint).stdout)
    assert {"topic": "CliT", "read_queue_nums": 3, "write_queue_nums": 3, "perm": 6} in listed
    with Producer(endpoint) as p:
        p.send_batch([Message("CliT", b"x")] * 5, queue_id=1)
    assert broker.store is not None and broker.store.wait_dispatched()
    described = json.loads(sluice(endpoint, "topic", "describe", "CliT", "--json").stdout)
    assert described["queues"][1] == {"queue_id": 1, "min_offset": 0, "max_offset": 5}
    human = sluice(endpoint, "topic", "describe", "CliT").stdout
    assert "max_offset" in human.splitlines()[0]
    assert sluice(endpoint, "topic", "delete", "CliT").returncode == 0
    gone = sluice(endpoint, "topic", "describe", "CliT")
    assert gone.returncode == 1 and "does not exist" in gone.stderr


def test_send_consume_query_lag_stats(broker: BrokerController, endpoint: str) -> None:
    sent = sluice(endpoint, "send", "CliS", "--tags", "A", "--keys", "k1,k2", "--property", "p=v", "--body", "hello",
                  "--json")
    assert sent.returncode == 0, sent.stderr
    first = json.loads(sent.stdout)["results"][0]
    from_stdin = sluice(endpoint, "send", "CliS", "--queue", "0", stdin="line one\nline two\n")
    assert "sent 2 messages" in from_stdin.stdout
    many = sluice(endpoint, "send", "CliS", "--count", "3000", "--size", "100", "--queue", "2")
    assert "sent 3000 messages" in many.stdout and "msg/s" in many.stdout
    assert broker.store is not None and broker.store.wait_dispatched()
    consumed = sluice(endpoint, "consume", "CliS", "--group", "cg", "--from", "earliest", "--json")
    assert consumed.returncode == 0, consumed.stderr
    lines = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert len(lines) == 3003
    hello = next(m for m in lines if m["msg_id"] == first["msg_id"])
    assert (hello["body"], hello["tags"], hello["keys"], hello["properties"]["p"]) == ("hello", "A", ["k1", "k2"], "v")
    assert {m["body"] for m in lines if m["queue_id"] == 0} >= {"line one", "line two"}
    again = sluice(endpoint, "consume", "CliS", "--group", "cg", "--json")  # from committed offsets: nothing left
    assert again.stdout.strip() == ""
    by_key = json.loads(sluice(endpoint, "query", "key", "CliS", "k2", "--json").stdout)
    assert [m["msg_id"] for m in by_key] == [first["msg_id"]]
    by_id = sluice(endpoint, "query", "id", first["msg_id"])
    assert first["msg_id"] in by_id.stdout
    missing = sluice(endpoint, "query", "id", "7F00000100002A9F00000000DEADBEEF")
    assert missing.returncode == 1 and "no message with id" in missing.stderr
    lag = json.loads(sluice(endpoint, "group", "lag", "cg", "--json").stdout)
    assert lag["total_lag"] == 0 and len(lag["queues"]) == 8
    assert "total lag: 0" in sluice(endpoint, "group", "lag", "cg").stdout
    stats = json.loads(sluice(endpoint, "stats", "--json").stdout)
    assert stats["broker_put_messages"] >= 3003


def test_unreachable_endpoint_is_a_clear_error() -> None:
    out = sluice("127.0.0.1:1", "topic", "list")
    assert out.returncode == 1 and "unreachable" in out.stderr


def test_consume_follow_waits_for_new_messages(broker: BrokerController, endpoint: str) -> None:
    with Admin(endpoint) as admin:
        admin.create_topic("CliF", 2)
    env = {**os.environ, "SLUICE_ENDPOINT": endpoint}
    follower = subprocess.Popen(
        [sys.executable, "-m", "broker", "consume", "CliF", "--group", "fg", "--from", "latest", "--follow",
         "--max", "3", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        # The follower has taken its start offsets (latest) once it holds a pull: messages sent from then on are new.
        wait_until(lambda: broker.hold.held_count() > 0, "the follower to hold a pull", timeout_s=60)
        assert follower.poll() is None, follower.stderr.read() if follower.stderr else ""
        with Producer(endpoint) as p:
            for i in range(3):
                p.send(Message("CliF", f"late{i}".encode()), queue_id=i % 2)
        out, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, err
    assert sorted(json.loads(line)["body"] for line in out.splitlines()) == ["late0", "late1", "late2"]


def test_consume_max_commits_only_what_was_printed(broker: BrokerController, endpoint: str) -> None:
    with Producer(endpoint) as p:
        p.send_batch([Message("CliM", f"m{i}".encode()) for i in range(40)], queue_id=0)
    assert broker.store is not None and broker.store.wait_dispatched()
    first = sluice(endpoint, "consume", "CliM", "--group", "mg", "--from", "earliest", "--max", "3", "--json")
    assert first.returncode == 0, first.stderr
    assert [json.loads(line)["body"] for line in first.stdout.splitlines()] == ["m0", "m1", "m2"]
    rest = sluice(endpoint, "consume", "CliM", "--group", "mg", "--json")  # resumes after the last printed message
    assert [json.loads(line)["body"] for line in rest.stdout.splitlines()] == [f"m{i}" for i in range(3, 40)]


def no_traceback(out: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in out.stderr and "Exception in thread" not in out.stderr, out.stderr


def test_consume_with_a_bad_tag_expression_fails_and_commits_nothing(broker: BrokerController, endpoint: str) -> None:
    with Producer(endpoint) as p:
        p.send_batch([Message("CliBad", b"x")] * 5, queue_id=0)
    out = sluice(endpoint, "consume", "CliBad", "--group", "bad-tags", "--from", "earliest", "--tags", "A ||")
    no_traceback(out)
    assert out.returncode == 1 and "error:" in out.stderr and "SUBSCRIPTION_PARSE_FAILED" in out.stderr, out.stderr
    with Admin(endpoint) as admin:
        assert admin.committed_offsets("bad-tags", "CliBad") == {}
    group = sluice(endpoint, "consume", "CliBad", "--group", "bad group", "--from", "earliest")
    no_traceback(group)
    assert group.returncode == 1 and "group" in group.stderr


def test_ordinary_bad_input_is_an_error_line_not_a_traceback(broker: BrokerController, endpoint: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    level = sluice(endpoint, "--log-level", "verbose", "stats")
    assert level.returncode == 2 and "invalid choice" in level.stderr
    assert sluice(endpoint, "--log-level", "debug", "stats").returncode == 0  # any case
    a_file = tmp_path / "plain-file"
    a_file.write_text("not a directory")
    store = sluice(endpoint, "broker", "--store", str(a_file), "--listen", "127.0.0.1:0")
    no_traceback(store)
    assert store.returncode == 1 and "error:" in store.stderr and str(a_file) in store.stderr
    for setting, needle in (('{"grpc_max_workers": "64"}', "'grpc_max_workers' is '64'"),
                            ('{"store": {"mapped_file_size_commit_log": "abc"}}', "mapped_file_size_commit_log"),
                            ("[1]", "not a table of settings")):
        config = tmp_path / "broker.json"
        config.write_text(setting)
        bad = sluice(endpoint, "broker", "--store", str(tmp_path / "st"), "--listen", "127.0.0.1:0",
                     "--config", str(config))
        no_traceback(bad)
        assert bad.returncode == 1 and needle in bad.stderr, bad.stderr
    env = {**os.environ, "SLUICE_ENDPOINT": endpoint}
    latin = subprocess.run([sys.executable, "-m", "broker", "send", "CliBytes", "--queue", "0"], input=b"caf\xe9\n",
                           capture_output=True, timeout=120, env=env)
    assert latin.returncode == 0, latin.stderr
    assert broker.store is not None and broker.store.wait_dispatched()
    with PullConsumer(endpoint, "bytes") as c:
        assert [m.body for m in c.pull("CliBytes", 0, 0).messages] == [b"caf\xe9"]


def test_topic_create_refuses_zero_queues(broker: BrokerController, endpoint: str) -> None:
    """`--queues 0` (and Admin.create_topic(t, 0)) created a topic with the broker's default of 8 queues."""
    out = sluice(endpoint, "topic", "create", "Zero", "--queues", "0")
    assert out.returncode == 2 and "--queues: 0 is below 1" in out.stderr
    with Admin(endpoint) as admin:
        with pytest.raises(InvalidArgumentError, match="at least one queue"):
            admin.create_topic("Zero", 0)
        assert "Zero" not in {t.topic for t in admin.list_topics()}


def test_stats_counts_are_integers(broker: BrokerController, endpoint: str) -> None:
    """`stats --json` printed every count as a float (3003.0) and the table printed big ones as 1.67772e+07."""
    with Producer(endpoint) as p:
        p.send_batch([Message("CliStats", b"x" * 1000)] * 1100, queue_id=0)  # over 1e6 bytes
    stats = json.loads(sluice(endpoint, "stats", "--json").stdout)
    assert isinstance(stats["broker_put_messages"], int) and stats["broker_put_messages"] >= 1100
    assert isinstance(stats["topics"], int) and isinstance(stats["held_pulls"], int)
    assert isinstance(stats["broker_uptime_s"], float)  # not a count
    rows = dict(line.split() for line in sluice(endpoint, "stats").stdout.splitlines()[2:])
    assert rows["broker_put_messages"] == str(stats["broker_put_messages"])
    big = {k: v for k, v in stats.items() if isinstance(v, int) and v >= 1_000_000}
    assert big and all(rows[k] == str(v) for k, v in big.items()), big  # e.g. sizes in bytes, not 1.67772e+07


def test_consume_text_output_shows_user_properties(broker: BrokerController, endpoint: str) -> None:
    """The text line showed tags and keys but hid the properties the message was sent with."""
    sent = sluice(endpoint, "send", "CliProps", "--queue", "0", "--body", "hi", "--property", "region=eu",
                  "--property", "tier=gold", "--keys", "k1")
    assert sent.returncode == 0, sent.stderr
    out = sluice(endpoint, "consume", "CliProps", "--group", "props", "--from", "earliest")
    assert out.returncode == 0, out.stderr
    (line,) = out.stdout.splitlines()
    assert "props={region=eu, tier=gold}" in line and "UNIQ_KEY" not in line and "keys=k1" in line, line
