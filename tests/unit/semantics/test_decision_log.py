"""The coordinator's decisions of transactions over several brokers, on a real store: first decision stands,
durable through a crash, prefix queries, bounds."""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING

import pytest

from broker.errors import InvalidArgumentError, MessageIllegalError
from broker.format.system_topics import TRANS_DECISION_TOPIC
from broker.format.txn_decision import Share, make_decision
from broker.proto import coordinator_pb2 as cpb
from broker.proto.decision import from_pb, to_pb
from broker.semantics.decision_log import MAX_QUERY_IDS, STATE_FILE, DecisionLog

if TYPE_CHECKING:
    from store_box import StoreBox


def decisions(box: StoreBox, **kwargs: object) -> DecisionLog:
    log = DecisionLog(box.s, os.path.join(box.path, "config"), **kwargs)  # type: ignore[arg-type]
    log.start()
    return log


def commit(txn_id: str, **shares: int) -> object:
    return make_decision(txn_id, True, [Share(b, (f"{b}-att",), n) for b, n in shares.items()])


def test_the_first_decision_stands_and_survives_a_crash(box: StoreBox) -> None:
    log = decisions(box)
    first = log.record(commit("q:1", a=3, b=0))  # type: ignore[arg-type]
    assert first.commit and first.decided_ms > 0 and [s.broker_name for s in first.participants] == ["a", "b"]
    assert log.record(make_decision("q:1", False)) == first  # a later ABORT gets the COMMIT back
    # A participant that may wait no longer fences an undecided transaction: ABORT, which then stands.
    [fenced] = log.query(["q:2"], abort_undecided=True)
    assert not fenced.commit and fenced.participants == ()
    assert log.record(commit("q:2", a=1)) == fenced  # type: ignore[arg-type]
    assert log.query(["q:3"]) == []  # asking without fencing decides nothing
    assert log.get("q:3") is None
    box.crash()  # SIGKILL: the decisions were flushed before they were answered
    box.open()
    again = decisions(box)
    assert again.get("q:1") == first and again.get("q:2") == fenced and len(again) == 2
    assert [m.properties["__transactionId__"] for m in box.read_queue(TRANS_DECISION_TOPIC)] == ["q:1", "q:2"]
    again.shutdown()


def test_prefix_queries_find_a_query_batch_s_decisions(box: StoreBox) -> None:
    log = decisions(box)
    for txn_id in ("spark:Q:1:r1@b", "spark:Q:1:r2@b", "spark:Q:10:r1@b", "spark:Q:2:r1@b", "spark:R:1:r1@b"):
        log.record(commit(txn_id, b=1))  # type: ignore[arg-type]
    assert [d.txn_id for d in log.query(prefix="spark:Q:1:")] == ["spark:Q:1:r1@b", "spark:Q:1:r2@b"]
    assert [d.txn_id for d in log.query(["spark:R:1:r1@b"], "spark:Q:2:")] == ["spark:Q:2:r1@b", "spark:R:1:r1@b"]
    assert log.query(prefix="spark:Z") == []
    with pytest.raises(InvalidArgumentError, match="at most"):
        log.query([f"t{i}" for i in range(MAX_QUERY_IDS + 1)])
    with pytest.raises(MessageIllegalError):
        log.query(["bad\x01id"])
    log.shutdown()


def test_decisions_past_the_retention_or_the_limit_are_forgotten(box: StoreBox) -> None:
    log = decisions(box, retention_ms=200, max_decisions=3)
    for i in range(5):
        log.record(commit(f"t{i}", a=i))  # type: ignore[arg-type]
    assert len(log) == 3 and log.get("t0") is None and log.get("t2") is not None and log.forgotten_early == 2
    log.persist()
    with open(os.path.join(box.path, "config", STATE_FILE)) as f:
        assert json.load(f)["scanFrom"] == 2  # the earliest kept: a restart need not read t0 and t1
    time.sleep(0.25)
    log.persist()
    assert len(log) == 0
    with open(os.path.join(box.path, "config", STATE_FILE)) as f:
        assert json.load(f)["scanFrom"] == 5
    log.shutdown()
    box.close()
    box.open()
    assert len(decisions(box, retention_ms=200)) == 0


def test_bad_decisions_are_refused_before_anything_is_stored(box: StoreBox) -> None:
    log = decisions(box)
    cases = [
        lambda: make_decision("t", False, [Share("a", (), 0)]),  # an ABORT commits nowhere
        lambda: make_decision("t", True, [Share("a", (), 1), Share("a", (), 2)]),
        lambda: make_decision("t", True, [Share("a", (), -1)]),
        lambda: make_decision("t", True, [Share("", (), 1)]),
        lambda: make_decision("t", True, [Share("a", ("x,y",), 1)]),
        lambda: make_decision("t", True, [Share("a", ("x" * 20_000,), 1)]),
        lambda: from_pb(cpb.TransactionDecision(transaction_id="t", outcome="MAYBE")),
    ]
    for case in cases:
        with pytest.raises(InvalidArgumentError):
            case()
    with pytest.raises(MessageIllegalError):
        make_decision("", True)
    assert box.s.max_offset(TRANS_DECISION_TOPIC, 0) == 0 and len(log) == 0
    d = commit("round-trip", a=2, b=5)
    assert from_pb(to_pb(d)) == d  # type: ignore[arg-type]
    log.shutdown()
