"""Client-side queue allocation: every queue to exactly one consumer, the same split RocketMQ computes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker.client.rebalance import allocate_averagely, allocate_by_circle

QUEUES = list(range(8))


@pytest.mark.parametrize("strategy", [allocate_averagely, allocate_by_circle])
@pytest.mark.parametrize("consumers", [1, 2, 3, 5, 8, 11])
def test_partition_is_disjoint_and_complete(strategy: Callable[..., list[int]], consumers: int) -> None:
    ids = [f"c{i:02d}" for i in range(consumers)]
    shares = [strategy(QUEUES, ids, me) for me in ids]
    flat = [q for s in shares for q in s]
    assert sorted(flat) == QUEUES
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_averagely_gives_contiguous_ranges_extra_to_the_first() -> None:
    ids = ["a", "b", "c"]
    assert [allocate_averagely(QUEUES, ids, me) for me in ids] == [[0, 1, 2], [3, 4, 5], [6, 7]]


def test_circle_deals_round_robin() -> None:
    ids = ["a", "b", "c"]
    assert [allocate_by_circle(QUEUES, ids, me) for me in ids] == [[0, 3, 6], [1, 4, 7], [2, 5]]


def test_unknown_consumer_gets_nothing() -> None:
    assert allocate_averagely(QUEUES, ["a"], "z") == [] and allocate_by_circle(QUEUES, ["a"], "z") == []
