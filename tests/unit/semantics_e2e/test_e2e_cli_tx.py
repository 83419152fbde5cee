"""`sluice tx list|commit|rollback` against a real broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_brokers import BrokerFactory
from e2e_util import read_topic

from broker.cli import main
from broker.client import Admin, Message, Producer, encode_message


def test_tx_list_commit_and_rollback_by_prefix(
    broker_factory: BrokerFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint = f"127.0.0.1:{broker_factory(transaction_timeout_ms=600_000).port}"  # no check-back meanwhile
    with Producer(endpoint) as producer:
        for txn in ("job:1", "job:2", "job:3"):
            producer.send_encoded(encode_message(Message("Cli", txn.encode()), 0), 1, transaction_id=txn)
    assert main(["tx", "list", "job:", "--endpoint", endpoint, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(t["transaction_id"], t["status"], t["half_count"]) for t in listed] == [
        ("job:1", "OPEN", 1), ("job:2", "OPEN", 1), ("job:3", "OPEN", 1)
    ]
    assert main(["tx", "commit", "job:2", "--endpoint", endpoint, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"job:2": "COMMITTED"}
    assert main(["tx", "rollback", "job:", "--prefix", "--endpoint", endpoint, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"job:1": "ROLLED_BACK", "job:3": "ROLLED_BACK"}
    assert main(["tx", "list", "job:", "--status", "OPEN", "--endpoint", endpoint]) == 0
    assert "job:" not in capsys.readouterr().out


def test_tx_commit_or_rollback_of_an_unknown_id_is_refused_and_records_nothing(
    broker_factory: BrokerFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tx commit never-sent:1` recorded an invented COMMITTED outcome (shown by `tx list`, kept over a restart)."""
    broker = broker_factory(tmp_path / "store", transaction_timeout_ms=600_000)
    endpoint = f"127.0.0.1:{broker.port}"
    for action in ("commit", "rollback"):
        assert main(["tx", action, "never-sent:1", "--endpoint", endpoint]) == 1
        err = capsys.readouterr().err
        assert "no transaction 'never-sent:1'" in err and "nothing was recorded" in err and "QUERY_NOT_FOUND" in err
    assert main(["tx", "list", "--endpoint", endpoint, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    broker.shutdown()
    again = broker_factory(tmp_path / "store", transaction_timeout_ms=600_000)
    assert main(["tx", "list", "--endpoint", f"127.0.0.1:{again.port}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_a_decision_contradicting_the_earlier_one_says_so_and_exits_1(
    broker_factory: BrokerFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """A commit of a rolled-back transaction printed ROLLED_BACK and exited 0, as if it had worked."""
    broker = broker_factory(transaction_timeout_ms=600_000)
    endpoint = f"127.0.0.1:{broker.port}"
    with Producer(endpoint) as producer:
        producer.send_encoded(encode_message(Message("CliTx", b"x"), 0), 1, transaction_id="job:9")
    assert main(["tx", "rollback", "job:9", "--endpoint", endpoint]) == 0
    assert "ROLLED_BACK" in capsys.readouterr().out
    assert main(["tx", "commit", "job:9", "--endpoint", endpoint, "--json"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out) == {"job:9": "ROLLED_BACK"}
    assert "error: transaction 'job:9' was already rolled back; the commit changed nothing" in err
    assert main(["tx", "rollback", "job:9", "--endpoint", endpoint]) == 0  # the same decision again: no conflict
    capsys.readouterr()
    assert read_topic(endpoint, "CliTx") == []  # the commit made nothing visible


def test_a_prefix_without_the_prefix_flag_is_not_taken_as_an_id(
    broker_factory: BrokerFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tx commit batch:` committed (and recorded) a transaction named 'batch:' and left batch:1 and batch:2 open."""
    broker = broker_factory(transaction_timeout_ms=600_000)
    endpoint = f"127.0.0.1:{broker.port}"
    with Producer(endpoint) as producer:
        for txn in ("batch:1", "batch:2"):
            producer.send_encoded(encode_message(Message("CliTx", txn.encode()), 0), 1, transaction_id=txn)
    assert main(["tx", "commit", "batch:", "--endpoint", endpoint]) == 1
    err = capsys.readouterr().err
    assert "no transaction 'batch:', but 2 start with it (batch:1, batch:2); add --prefix" in err, err
    with Admin(endpoint) as admin:
        assert [(t.transaction_id, t.status) for t in admin.list_transactions("batch")] == [
            ("batch:1", "OPEN"), ("batch:2", "OPEN")
        ]
    assert main(["tx", "commit", "batch:", "--prefix", "--endpoint", endpoint, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"batch:1": "COMMITTED", "batch:2": "COMMITTED"}
    assert main(["tx", "commit", "batch:", "--prefix", "--endpoint", endpoint]) == 0
    assert "no open transaction starts with 'batch:'" in capsys.readouterr().err


def test_tx_list_names_the_queues_an_open_transaction_holds_back(
    broker_factory: BrokerFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """A transaction written in place holds its queues' readers at its first row until it ends: the list says
    where, and the broker's metrics count the messages waiting behind it."""
    broker = broker_factory(transaction_timeout_ms=600_000)
    endpoint = f"127.0.0.1:{broker.port}"
    with Producer(endpoint) as producer:
        producer.send_encoded(encode_message(Message("CliHold", b"plain"), 1), 1)
        rows = b"".join(encode_message(Message("CliHold", b"r%d" % i), i % 2) for i in range(6))
        producer.send_encoded(rows, 6, transaction_id="job:held", attempt="t0")
        producer.send_encoded(encode_message(Message("CliHold", b"after"), 0), 1)
    assert main(["tx", "list", "job:held", "--endpoint", endpoint, "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    held = ["CliHold/0@0", "CliHold/1@1"]
    assert (listed["status"], listed["half_count"], listed["held_queues"]) == ("OPEN", 6, held)
    assert main(["tx", "list", "job:held", "--endpoint", endpoint]) == 0
    assert "CliHold/0@0 CliHold/1@1" in capsys.readouterr().out
    scrape = [line for line in broker.metrics.render().splitlines() if "transaction_held" in line and "{" in line]
    assert [(line.split('queue="')[1][0], line.rsplit(" ", 1)[1]) for line in scrape] == [("0", "4"), ("1", "3")]
    assert main(["tx", "commit", "job:held", "--endpoint", endpoint]) == 0
    capsys.readouterr()
    everything = [b"plain", b"after"] + [b"r%d" % i for i in range(6)]
    assert sorted(m.body for m in read_topic(endpoint, "CliHold")) == sorted(everything)
    assert main(["tx", "list", "job:held", "--endpoint", endpoint, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["held_queues"] == []
