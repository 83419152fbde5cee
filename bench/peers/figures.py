"""A system's measured figures: throughput per message size, latency per rate, and their JSON form.

Apart because the systems fill them in and the table, the charts and the JSON read them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from bench.peers.settings import LATENCY_WARMUP_MSGS, MB


@dataclass
class Throughput:
    size_b: int
    count: int
    produce_s: float
    consume_s: float
    consume_raw_s: float | None = None  # Sluice only: pull_raw, entries left encoded (the Spark connector's path)
    index_wait_s: float | None = None  # Sluice only: from the last send's answer until the queue was fully indexed
    consume_eager_s: float | None = None  # Sluice only: pull_raw + decode_entry per entry (eager decoding)

    @property
    def produce_msgs_s(self) -> float:
        return self.count / self.produce_s

    @property
    def consume_msgs_s(self) -> float:
        return self.count / self.consume_s

    @property
    def produce_mb_s(self) -> float:
        return self.count * self.size_b / self.produce_s / MB

    @property
    def consume_mb_s(self) -> float:
        return self.count * self.size_b / self.consume_s / MB

    def to_json(self) -> dict[str, float]:
        out = {
            "size_b": self.size_b, "count": self.count, "produce_s": round(self.produce_s, 4),
            "consume_s": round(self.consume_s, 4), "produce_msgs_s": round(self.produce_msgs_s),
            "consume_msgs_s": round(self.consume_msgs_s), "produce_mb_s": round(self.produce_mb_s, 2),
            "consume_mb_s": round(self.consume_mb_s, 2),
        }
        if self.consume_raw_s is not None:
            out["consume_raw_s"] = round(self.consume_raw_s, 4)
            out["consume_raw_msgs_s"] = round(self.count / self.consume_raw_s)
        if self.index_wait_s is not None:
            out["index_wait_s"] = round(self.index_wait_s, 4)
        if self.consume_eager_s is not None:
            out["consume_eager_s"] = round(self.consume_eager_s, 4)
            out["consume_eager_msgs_s"] = round(self.count / self.consume_eager_s)
        return out


def best_of(runs: list[Throughput]) -> Throughput:
    """The shortest time of each figure over rounds: on a shared machine the other load only ever adds time."""

    def least(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return min(known) if known else None

    return Throughput(
        runs[0].size_b, runs[0].count, min(r.produce_s for r in runs), min(r.consume_s for r in runs),
        least([r.consume_raw_s for r in runs]), least([r.index_wait_s for r in runs]),
        least([r.consume_eager_s for r in runs]),
    )


@dataclass
class Latency:
    rate_per_s: int  # the rate asked for
    achieved_rate_per_s: float  # below rate_per_s when single sends can't keep up (then latency grows)
    size_b: int
    sent: int
    received: int
    p50_ms: float
    p99_ms: float
    max_ms: float


@dataclass
class SystemResult:
    name: str
    version: str = ""
    throughput: list[Throughput] = field(default_factory=list)
    latency: list[Latency] = field(default_factory=list)  # one per asked rate
    error: str = ""
    spread: dict[str, Any] = field(default_factory=dict)  # medians and spreads over the rounds (spread.py)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "throughput": {str(t.size_b): t.to_json() for t in self.throughput},
            "latency": {str(lat.rate_per_s): asdict(lat) for lat in self.latency},
            "error": self.error,
            "spread": self.spread,
        }


def latency_of(
    sent_at: dict[int, float], received_at: dict[int, float], rate: int, size_b: int, send_wall_s: float
) -> Latency:
    keys = [k for k in sorted(received_at) if k >= LATENCY_WARMUP_MSGS and k in sent_at]
    ms = np.array([(received_at[k] - sent_at[k]) * 1000 for k in keys])
    if len(ms) == 0:
        raise RuntimeError(f"no message past the first {LATENCY_WARMUP_MSGS} was received in the latency run")
    lost = set(sent_at) - set(received_at)
    if lost:
        raise RuntimeError(f"{len(lost)} of {len(sent_at)} sent messages never arrived (first {sorted(lost)[:5]})")
    achieved = len(sent_at) / send_wall_s
    return Latency(
        rate, round(achieved, 1), size_b, len(sent_at), len(received_at), float(np.percentile(ms, 50)),
        float(np.percentile(ms, 99)), float(ms.max()),
    )
