"""bench.peers' rows added for the remoting transport: the bare TCP relay floor measures a synchronous sender and
relays bodies to a subscriber, and the rounds' medians and spreads are each figure's own."""

from __future__ import annotations

from pathlib import Path

from bench.peers.figures import Latency
from bench.peers.spread import median_latency
from bench.peers.tcp_floor import TcpRelay


def test_the_tcp_relay_floor_answers_a_synchronous_sender_and_relays_to_a_subscriber(tmp_path: Path) -> None:
    relay = TcpRelay()
    relay.start(tmp_path)
    assert relay.sync_sends(200, 100) > 0
    lat = relay.latency(2000, 600, 100)  # the first 500 are the warm-up the percentiles leave out
    assert lat.sent == lat.received == 600 and 0 < lat.p50_ms <= lat.p99_ms <= lat.max_ms


def test_the_latency_row_of_rounds_is_each_percentiles_median() -> None:
    runs = [Latency(1000, rate, 100, 10, 10, p50, p99, p99 + 1) for rate, p50, p99 in
            [(990.0, 0.5, 9.0), (900.0, 0.3, 2.0), (1000.0, 0.9, 3.0)]]
    row, spread = median_latency(runs)
    assert (row.p50_ms, row.p99_ms, row.max_ms, row.achieved_rate_per_s) == (0.5, 3.0, 10.0, 990.0)
    assert spread["p50_ms"] == {"median": 0.5, "min": 0.3, "max": 0.9, "rounds": [0.5, 0.3, 0.9]}
