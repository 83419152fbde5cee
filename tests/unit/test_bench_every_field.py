"""bench.peers.every_field: what its rows read of each message, and how rounds become medians and ratios."""

from __future__ import annotations

from bench.peers.every_field import (
    RateRow,
    decode_costs,
    python_floor,
    ratios_of,
    serial_floor,
    sluice_fill,
    sluice_pull,
    sluice_pull_body,
    sluice_push,
    touch_entry,
    touch_message,
)
from broker.client import PullConsumer
from broker.format.message import decode_entry


def test_the_sluice_rows_read_every_field_of_every_message(endpoint: str) -> None:
    count = 1500
    topic = sluice_fill(endpoint, 100, count)
    with PullConsumer(endpoint, "check") as consumer:
        raw = consumer.pull_raw(topic, 0, 0, 32, timeout_ms=0)
        lazy = consumer.pull(topic, 0, 0, 32, timeout_ms=0).messages
    ends = [*raw.entry_positions[1:], len(raw.buffer)]
    eager = [decode_entry(raw.buffer, p, e) for p, e in zip(raw.entry_positions, ends, strict=True)]
    assert [touch_message(m) for m in lazy] == [touch_message(m) for m in eager]
    assert eager[3].properties["app"] == "v3" and eager[3].keys == ["k3"] and eager[3].tags == "TagA"
    assert "UNIQ_KEY" in eager[3].properties  # as the Producer sends every message
    assert sluice_pull(endpoint, topic, count, "pull") > 0
    assert sluice_push(endpoint, topic, count, "push", batch=100) > 0
    assert sluice_pull_body(endpoint, topic, count, "body") > 0 and python_floor(300, 100) > 0
    with PullConsumer(endpoint, "pull") as consumer:  # the pull row commits what it read
        assert consumer.committed_offsets(topic) == {0: count}


def test_a_redis_entry_is_read_field_by_field() -> None:
    fields = {b"body": b"x" * 100, b"tags": b"TagA", b"keys": b"k1", b"app": b"v1", b"uniq": b"AB" * 16}
    assert touch_entry(b"1700000000000-7", fields) == 100 + 4 + 1 + 2 + 32 + 5 + 15 + 1700000000000 + 7


def test_figures_are_medians_and_ratios_are_taken_round_by_round() -> None:
    rows = {"sluice pull": RateRow("sluice pull", 100, 10, [300.0, 100.0, 200.0]),
            "redis XREAD": RateRow("redis XREAD", 100, 10, [100.0, 100.0, 400.0])}
    assert rows["sluice pull"].median == 200.0
    assert rows["sluice pull"].to_json()["min_msgs_s"] == 100 and rows["sluice pull"].to_json()["max_msgs_s"] == 300
    assert ratios_of(rows) == {"sluice pull / redis XREAD": {"median": 1.0, "min": 0.5, "max": 3.0}}


def test_the_in_process_costs_cover_each_way_of_reading() -> None:
    costs = decode_costs(100)
    assert set(costs) == {"pull decode, body read", "pull decode, every field read", "decode_entry, every field read",
                          "python floor"}
    assert 0 < costs["pull decode, body read"] < costs["pull decode, every field read"]


def test_the_serial_floor_is_the_pull_then_the_objects_round_by_round() -> None:
    """1 / (1 / pull + 1 / objects) each round: a pull of 400/s and objects of 400/s allow 200/s one after the other;
    beside Redis's XREAD and Sluice's pull of the same round."""
    def row(name: str, rates: list[float]) -> RateRow:
        return RateRow(name, 100, 10, rates)

    rows = {"sluice pull, body only": row("sluice pull, body only", [400.0, 300.0, 600.0]),
            "python floor": row("python floor", [400.0, 600.0, 300.0]),
            "redis XREAD": row("redis XREAD", [100.0, 400.0, 200.0]),
            "sluice pull": row("sluice pull", [100.0, 100.0, 150.0])}
    floor = serial_floor(rows)
    assert floor["msgs_s"] == {"median": 200.0, "min": 200.0, "max": 200.0}
    assert floor["of_redis_xread"] == {"median": 1.0, "min": 0.5, "max": 2.0}
    assert floor["sluice_pull_of_it"] == {"median": 0.5, "min": 0.5, "max": 0.75}
