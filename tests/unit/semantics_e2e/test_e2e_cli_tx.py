"""`sluice tx list|commit|rollback` against a real broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_brokers import BrokerFactory

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
    ]  # fmt: skip
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
    with Admin(endpoint) as admin:
        assert all(hi == 0 for _, hi in admin.queue_offsets("CliTx").values())  # the commit made nothing visible


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
        ]  # fmt: skip
    assert main(["tx", "commit", "batch:", "--prefix", "--endpoint", endpoint, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"batch:1": "COMMITTED", "batch:2": "COMMITTED"}
    assert main(["tx", "commit", "batch:", "--prefix", "--endpoint", endpoint]) == 0
    assert "no open transaction starts with 'batch:'" in capsys.readouterr().err
