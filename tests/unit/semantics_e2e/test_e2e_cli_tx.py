"""`sluice tx list|commit|rollback` against a real broker."""

from __future__ import annotations

import json

import pytest
from conftest import BrokerFactory

from broker.cli import main
from broker.client import Message, Producer, encode_message


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
