"""Medians of the rounds, with their spread: what each figure was over ``--rounds`` runs, not only its best.

The throughput table keeps each figure's best round (results.best_of: on a shared machine other load only adds
time); beside it the JSON and the table give the median and the lowest and highest round, and the latency rows are
the median of their rounds (each percentile's own median), so that one lucky or unlucky run does not stand for the
system."""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

from bench.peers.figures import Latency, Throughput


def _spread(values: list[float]) -> dict[str, Any]:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2), "rounds": [round(v, 2) for v in values]}


def throughput_spread(runs: list[Throughput]) -> dict[str, Any]:
    """Produce and consume msgs/s over the rounds."""
    return {"produce_msgs_s": _spread([r.produce_msgs_s for r in runs]),
            "consume_msgs_s": _spread([r.consume_msgs_s for r in runs])}


def median_latency(runs: list[Latency]) -> tuple[Latency, dict[str, Any]]:
    """The rounds of one rate as one row (each figure's median) and the spread of p50, p99 and the achieved rate."""
    row = replace(
        runs[0], p50_ms=statistics.median(r.p50_ms for r in runs), p99_ms=statistics.median(r.p99_ms for r in runs),
        max_ms=max(r.max_ms for r in runs),
        achieved_rate_per_s=round(statistics.median(r.achieved_rate_per_s for r in runs), 1),
    )
    return row, {"p50_ms": _spread([r.p50_ms for r in runs]), "p99_ms": _spread([r.p99_ms for r in runs]),
                 "achieved_rate_per_s": _spread([r.achieved_rate_per_s for r in runs])}


def print_spread(name: str, spread: dict[str, Any]) -> None:
    """The medians and spreads of one system (``SystemResult.spread``)."""
    for size, figures in spread.get("throughput", {}).items():
        for what, s in figures.items():
            print(f"  {name:<16} {size:>5} B {what:<15} median {s['median']:>12,.0f}  [{s['min']:,.0f}, "
                  f"{s['max']:,.0f}]  ({len(s['rounds'])} rounds)")
    for rate, figures in spread.get("latency", {}).items():
        p50, p99 = figures["p50_ms"], figures["p99_ms"]
        print(f"  {name:<16} {rate:>5}/s  p50 median {p50['median']:.2f} ms [{p50['min']:.2f}, {p50['max']:.2f}]  "
              f"p99 median {p99['median']:.2f} ms [{p99['min']:.2f}, {p99['max']:.2f}]  "
              f"({len(p50['rounds'])} rounds)")
