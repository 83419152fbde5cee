"""`make bench`: every benchmark of the project, one after another, each in its own process.

Each benchmark prints its table and writes ``bench/results/<name>.json``; this runner adds nothing but order and a
summary of which ones ran. Run one alone with ``python -m bench.<name>``; ``python -m bench --only store,server``
picks some.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

BENCHMARKS = ("crc", "dispatch", "store", "sync_ceiling", "server", "cluster", "replication", "rmqv2",
              "spark_source", "spark_sink", "peers", "hops", "latency_queues", "timeline", "security",
              "remoting_threads")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("--only", default="", help="comma-separated subset of: " + ", ".join(BENCHMARKS))
    args = ap.parse_args(argv)
    chosen = [b for b in args.only.split(",") if b] or list(BENCHMARKS)
    unknown = [b for b in chosen if b not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    failed = []
    for name in chosen:
        print(f"\n=== bench.{name} ===", flush=True)
        started = time.monotonic()
        rc = subprocess.call([sys.executable, "-m", f"bench.{name}"])
        print(f"=== bench.{name}: exit {rc} in {time.monotonic() - started:.0f} s ===", flush=True)
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"failed: {failed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
