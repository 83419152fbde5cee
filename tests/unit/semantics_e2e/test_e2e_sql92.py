"""SQL92 selectors evaluated by the broker on PullMessage, compared with an independent evaluation in the test."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import grpc
import pytest
from e2e_util import read_topic

from broker.client import FIRST, Message, Producer, PullConsumer, PushConsumer, ReceivedMessage
from broker.errors import SubscriptionParseError
from broker.proto import sluice_pb2 as pb
from broker.proto import sluice_pb2_grpc as pb_grpc
from broker.server.broker_controller import BrokerController
from tests.support.waiting import wait_until

N = 10_000
Props = dict[str, str]


def num(p: Props, name: str) -> float | None:
    return float(p[name]) if name in p else None


# (selector, what it means; None (NULL) never matches, as in SQL's three-valued logic)
CASES: list[tuple[str, Callable[[Props], bool]]] = [
    ("a > 50", lambda p: (a := num(p, "a")) is not None and a > 50),
    ("a > 50 AND b = 'x'", lambda p: (a := num(p, "a")) is not None and a > 50 and p.get("b") == "x"),
    ("a BETWEEN 10 AND 20 OR c = TRUE",
     lambda p: ((a := num(p, "a")) is not None and 10 <= a <= 20) or p.get("c") == "true"),
    ("b IN ('x', 'y') AND NOT (a < 30)",
     lambda p: p.get("b") in ("x", "y") and (a := num(p, "a")) is not None and not a < 30),
    ("a IS NULL OR b IS NOT NULL", lambda p: "a" not in p or "b" in p),
    ("b <> 'z' AND d >= 0.5", lambda p: "b" in p and p["b"] != "z" and (d := num(p, "d")) is not None and d >= 0.5),
    ("a <= 3 OR a = 99 OR c = FALSE",
     lambda p: ((a := num(p, "a")) is not None and (a <= 3 or a == 99)) or p.get("c") == "false"),
]


def random_props(rng: random.Random) -> Props:
    p: Props = {}
    if rng.random() < 0.9:
        p["a"] = str(rng.randrange(100))
    if rng.random() < 0.8:
        p["b"] = rng.choice("xyz")
    if rng.random() < 0.7:
        p["c"] = rng.choice(["true", "false"])
    if rng.random() < 0.6:
        p["d"] = f"{rng.random():.3f}"
    return p


def test_sql92_results_equal_an_in_test_evaluation(broker: BrokerController, endpoint: str) -> None:
    rng = random.Random(92)
    props = [random_props(rng) for _ in range(N)]
    with Producer(endpoint) as producer:
        msgs = [Message("Sql", f"{i}".encode(), properties=p) for i, p in enumerate(props)]
        for q in range(4):
            producer.send_batch(msgs[q::4], queue_id=q)
    for selector, meaning in CASES:
        want = {f"{i}".encode() for i, p in enumerate(props) if meaning(p)}
        got = [m.body for m in read_topic(endpoint, "Sql", sql=selector)]
        assert len(got) == len(set(got)) and set(got) == want, selector
        assert 0 < len(want) < N, selector  # every case selects something and filters something


def test_a_bad_selector_is_refused_with_the_column(broker: BrokerController, endpoint: str) -> None:
    with Producer(endpoint) as producer:
        producer.send(Message("Sql", b"x", properties={"a": "1"}), queue_id=0)
    with PullConsumer(endpoint, "sql-group") as consumer, pytest.raises(SubscriptionParseError) as refused:
        consumer.pull("Sql", 0, 0, sql="a > AND b = 1")
    assert "at column 5" in refused.value.message
    channel = grpc.insecure_channel(endpoint)  # the wire status: INVALID_ARGUMENT
    try:
        request = pb.PullRequest(consumer_group="sql-group", topic="Sql", queue_id=0, queue_offset=0,
                                 tag_expression="a > AND b = 1", expression_type="SQL92")
        with pytest.raises(grpc.RpcError) as raw:
            pb_grpc.BrokerStub(channel).PullMessage(request, timeout=10)
        assert raw.value.code() is grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    finally:
        channel.close()


def test_push_consumer_with_an_sql92_subscription(broker: BrokerController, endpoint: str) -> None:
    got: list[int] = []
    lock = threading.Lock()

    def listener(msgs: list[ReceivedMessage]) -> None:
        with lock:
            got.extend(int(m.properties["a"]) for m in msgs)

    with Producer(endpoint) as producer:
        producer.send_batch([Message("SqlPush", b"x", properties={"a": str(i)}) for i in range(20)], queue_id=0)
    with PushConsumer(endpoint, "sql-push", {"SqlPush": "a > 5 AND a <> 10"}, listener, consume_from=FIRST,
                      expression_types={"SqlPush": "SQL92"}, long_poll_ms=500):
        wait_until(lambda: len(got) >= 13, "filtered messages", timeout_s=20)
    assert sorted(got) == [i for i in range(6, 20) if i != 10]
