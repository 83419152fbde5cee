"""The run over the systems: all started at once, throughput rounds taken in turn, then latency one at a time.

A system that fails records its error and leaves the others' figures standing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bench.peers.figures import SystemResult, Throughput, best_of
from bench.peers.settings import (
    BATCH_MSGS,
    COUNT_BY_SIZE,
    LATENCY_DURATION_S,
    LATENCY_MIN_SAMPLES,
    LATENCY_SIZE_B,
    LATENCY_WARMUP_MSGS,
    SIZES_B,
    WARMUP_FRACTION,
)
from bench.peers.spread import median_latency, throughput_spread
from bench.peers.systems import SYSTEMS, System

# The peers' Python clients (and the charts) are benchmark-only packages, not dependencies of Sluice.
BENCH_PACKAGES = {"redis": "redis hiredis", "nats": "nats-py", "matplotlib": "matplotlib"}


def missing_package_hint(e: ModuleNotFoundError) -> str:
    top = (e.name or "").split(".")[0]
    package = BENCH_PACKAGES.get(top, top)
    return f"{e}: install the benchmark's clients with `.venv/bin/pip install {package}`"


def _guarded(result: SystemResult, step: Callable[[], None]) -> None:
    """Run one step of a system's benchmark; a failure is recorded in its result (and ends its part of the run)."""
    try:
        step()
    except ModuleNotFoundError as e:
        result.error = missing_package_hint(e)
        print(f"  {result.name} FAILED: {result.error}", flush=True)
    except Exception as e:  # noqa: BLE001 -- one system failing must not hide the others' figures; reported below
        result.error = f"{type(e).__name__}: {e}"
        print(f"  {result.name} FAILED: {result.error}", flush=True)


def run_systems(
    names: list[str], workdir: Path, scale: float, latency_rates: list[int], rounds: int,
    also: Callable[[list[System]], None] | None = None,
) -> list[SystemResult]:
    """Every system started at once; the throughput runs go round the systems ``rounds`` times (so a burst of
    other load on the machine falls on all of them, not on one) and each figure keeps its best round (the median
    and spread beside it, spread.py); then the latency runs, each rate ``rounds`` times, their median kept; then the
    latency runs, one system at a time; then ``also(the started systems)`` (the synchronous senders' rounds)."""
    systems = [SYSTEMS[name]() for name in names]
    results = [SystemResult(system.name) for system in systems]
    runs: dict[tuple[str, int], list[Throughput]] = {}
    try:
        for system, result in zip(systems, results, strict=True):
            print(f"{system.name}: starting", flush=True)

            def start(system: System = system, result: SystemResult = result) -> None:
                result.version = system.start(workdir)

            _guarded(result, start)
        for round_no in range(rounds):
            for system, result in zip(systems, results, strict=True):
                for size_b in SIZES_B:
                    if result.error or not system.batches:
                        break
                    count = max(BATCH_MSGS, int(COUNT_BY_SIZE[size_b] * scale))

                    def measure(
                        system: System = system, size_b: int = size_b, count: int = count, round_no: int = round_no
                    ) -> None:
                        if round_no == 0:  # not counted
                            system.throughput(size_b, max(BATCH_MSGS, count // WARMUP_FRACTION), "warmup")
                        t = system.throughput(size_b, count, f"run{round_no}")
                        print(
                            f"  round {round_no + 1} {system.name} {size_b} B x {count}: produce "
                            f"{t.produce_msgs_s:,.0f} msgs/s, consume {t.consume_msgs_s:,.0f}", flush=True,
                        )
                        runs.setdefault((system.name, size_b), []).append(t)

                    _guarded(result, measure)
        for system, result in zip(systems, results, strict=True):
            result.throughput = [best_of(runs[(system.name, b)]) for b in SIZES_B if (system.name, b) in runs]
            result.spread["throughput"] = {
                b: throughput_spread(runs[(system.name, b)]) for b in SIZES_B if (system.name, b) in runs
            }
            result.spread["latency"] = {}
            for rate in latency_rates:
                if result.error:
                    break
                lat_count = max(LATENCY_WARMUP_MSGS + LATENCY_MIN_SAMPLES, int(rate * LATENCY_DURATION_S))

                def latency(system: System = system, result: SystemResult = result, rate: int = rate,
                            lat_count: int = lat_count) -> None:
                    lat, spread = median_latency([system.latency(rate, lat_count, LATENCY_SIZE_B)
                                                  for _ in range(rounds)])
                    result.latency.append(lat)
                    result.spread["latency"][rate] = spread
                    print(f"  {system.name} latency at {rate}/s (achieved {lat.achieved_rate_per_s:,.0f}/s): "
                          f"p50 {lat.p50_ms:.2f} ms (median of {rounds})", flush=True)

                _guarded(result, latency)
        if also is not None:
            also([s for s, r in zip(systems, results, strict=True) if not r.error])
    finally:
        for system in systems:
            system.stop()
    return results
