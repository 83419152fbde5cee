"""The broker's own topics (half messages, transaction decisions, delayed messages) across a clean restart."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.client import Admin, Message, Producer, encode_message
from broker.format.message import Prop
from broker.format.system_topics import SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from broker.server.broker_controller import BrokerController

BrokerFactory = Callable[..., BrokerController]  # the broker_factory fixture (tests/unit/conftest.py)


def test_a_clean_restart_registers_system_topics_without_a_warning(
    broker_factory: BrokerFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every clean restart after a transaction logged `WARNING ... topic RMQ_SYS_TRANS_HALF_TOPIC found in the
    store but not in topics.json`: the broker writes its system topics without registering them, and nothing was
    wrong. A user topic missing from topics.json is still a warning."""
    store = tmp_path / "store"
    first = broker_factory(store)
    endpoint = f"127.0.0.1:{first.port}"
    with Producer(endpoint) as producer, Admin(endpoint) as admin:
        producer.send_encoded(encode_message(Message("Orders", b"x"), 0), 1, transaction_id="restart:1")
        assert admin.end_transaction("restart:1", commit=True) == "COMMITTED"
        producer.send(Message("Orders", b"later", properties={Prop.DELAY: "18"}), queue_id=0)  # two hours
    assert first.store is not None and first.store.wait_dispatched()
    assert {TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, SCHEDULE_TOPIC} <= set(first.store.topics())
    first.shutdown()
    with caplog.at_level(logging.INFO):
        second = broker_factory(store)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [w for w in warnings if "found in the store" in w], warnings
    written = (TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, SCHEDULE_TOPIC)  # what this broker wrote
    assert [t for t in written if second.topics.get(t) is None] == []  # registered all the same
    assert any("registering system topic" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
    second.shutdown()
    topics_json = store / "config" / "topics.json"
    table = json.loads(topics_json.read_text())
    del table["topicConfigTable"]["Orders"]  # a lost entry of a user topic: that is worth a warning
    topics_json.write_text(json.dumps(table))
    caplog.clear()
    broker_factory(store)
    assert any("topic Orders found in the store" in r.getMessage() for r in caplog.records
               if r.levelno == logging.WARNING)
