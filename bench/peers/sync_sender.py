"""One synchronous sender: sends a second, each waiting for its answer, for every system that offers
``sync_sends`` (Sluice over gRPC and over remoting, Redis's XADD, the bare TCP relay's floor).

Rounds go over the systems in turn (a burst of other load falls on all of them), at least ``MIN_ROUNDS``; each
system's figure is the median of its rounds, with the lowest and highest beside it (the spread)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

SYNC_SENDS = 3000  # per round at scale 1.0: a few seconds of one sender
SYNC_SIZE_B = 100
MIN_ROUNDS = 3


@dataclass
class SyncSender:
    name: str
    rounds: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.rounds) if self.rounds else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"sends_per_s_median": round(self.median), "sends_per_s_min": round(min(self.rounds, default=0)),
                "sends_per_s_max": round(max(self.rounds, default=0)), "rounds": [round(r) for r in self.rounds],
                "size_b": SYNC_SIZE_B, "error": self.error}


def measure_sync_senders(systems: list[Any], scale: float, rounds: int) -> list[SyncSender]:
    """Systems already started; those without ``sync_sends`` are left out."""
    takers = [s for s in systems if hasattr(s, "sync_sends")]
    out = [SyncSender(s.name) for s in takers]
    count = max(200, int(SYNC_SENDS * scale))
    for round_no in range(max(MIN_ROUNDS, rounds)):
        for system, result in zip(takers, out, strict=True):
            if result.error:
                continue
            try:
                rate = system.sync_sends(count, SYNC_SIZE_B)
            except Exception as e:  # noqa: BLE001 -- one system failing must not hide the others' figures
                result.error = f"{type(e).__name__}: {e}"
                print(f"  {system.name} sync sender FAILED: {result.error}", flush=True)
                continue
            result.rounds.append(rate)
            print(f"  round {round_no + 1} {system.name}: one synchronous sender {rate:,.0f} sends/s", flush=True)
    return out


def print_sync_senders(results: list[SyncSender]) -> dict[str, float]:
    """The rows, and the ratios of each Sluice transport to Redis and to the TCP floor (returned)."""
    print()
    print(f"one synchronous sender, {SYNC_SIZE_B} B, sends/s (median of rounds, [min, max]):")
    for r in results:
        if r.error:
            print(f"  {r.name:<16} FAILED: {r.error}")
        elif r.rounds:
            print(f"  {r.name:<16} {r.median:>8,.0f}   [{min(r.rounds):,.0f}, {max(r.rounds):,.0f}]  "
                  f"({len(r.rounds)} rounds)")
    by_name = {r.name: r.median for r in results if r.rounds}
    ratios: dict[str, float] = {}
    for mine in ("sluice", "sluice-remoting"):
        for other in ("redis", "tcp-relay"):
            if by_name.get(mine) and by_name.get(other):
                ratios[f"{mine} sync sender / {other} sync sender"] = by_name[mine] / by_name[other]
    return ratios
