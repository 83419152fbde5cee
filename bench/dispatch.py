"""Dispatcher cost per entry, per-entry (scalar) pass against vectorised pass, by the size of one pass.

``python -m bench.dispatch [--trials N]`` prints a table and writes bench/results/dispatch.json. It backs the
choice of ``dispatcher.SCALAR_DISPATCH_BYTES``: below it a pass parses entries one by one with ``struct``; above
it, numpy's fixed cost per call (tens of calls per pass) is paid once for many entries.

Each trial appends ``n`` single messages of 100 B (with no properties, or with a tag) to a store whose dispatch
thread is idle, then times the passes that dispatch them: consume-queue units written, arrival listeners told.
The median over trials is reported, in microseconds per entry.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

from broker.format.message import encode_entry, encode_properties
from broker.store import MessageStore, StoreConfig
from broker.store import dispatcher as dispatcher_module

ENTRIES_PER_PASS = (4, 16, 64, 128, 256, 512)
BODY = os.urandom(100)


def _time_passes(store: MessageStore, n: int, props: dict[str, str] | None, scalar: bool) -> float:
    dispatcher_module.SCALAR_DISPATCH_BYTES = 1 << 40 if scalar else 0
    for i in range(n):
        assert store.put_message("Bench", i % 8, BODY, props).ok
    started = time.perf_counter()
    done = store.dispatcher.dispatch_available()  # one pass: the n entries are far below DISPATCH_CHUNK_BYTES
    elapsed = time.perf_counter() - started
    assert done == n, (done, n)
    return elapsed / n * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.dispatch", description=__doc__)
    ap.add_argument("--trials", type=int, default=30)
    args = ap.parse_args(argv)
    chosen = dispatcher_module.SCALAR_DISPATCH_BYTES
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sluice-bench-dispatch-") as tmp:
        store = MessageStore(StoreConfig(store_path=tmp))
        store.start()
        assert store._dispatch_service is not None
        store._dispatch_service.stop()  # this process runs the passes itself; flush and cleanup still run
        try:
            for props in (None, {"TAGS": "TagA"}):
                for n in ENTRIES_PER_PASS:
                    cost = {
                        path: statistics.median(
                            _time_passes(store, n, props, path == "scalar") for _ in range(args.trials)
                        )
                        for path in ("scalar", "vector")
                    }
                    entry = encode_entry(b"Bench", 0, BODY, encode_properties(props) if props else b"")
                    rows.append({"properties": "TAGS" if props else "none", "entries_per_pass": n,
                                 "scalar_us_per_entry": cost["scalar"], "vector_us_per_entry": cost["vector"],
                                 "entry_bytes": len(entry)})
        finally:
            dispatcher_module.SCALAR_DISPATCH_BYTES = chosen
            store.shutdown()
    print(f"{'properties':<11}{'entries/pass':>13}{'bytes/pass':>12}{'scalar us/entry':>17}{'vector us/entry':>17}")
    for r in rows:
        print(f"{r['properties']:<11}{r['entries_per_pass']:>13}{r['entries_per_pass'] * r['entry_bytes']:>12,}"
              f"{r['scalar_us_per_entry']:>17.2f}{r['vector_us_per_entry']:>17.2f}")
    print(f"SCALAR_DISPATCH_BYTES = {chosen:,}: passes up to that size take the scalar path")
    os.makedirs("bench/results", exist_ok=True)
    with open("bench/results/dispatch.json", "w") as f:
        json.dump({"trials": args.trials, "scalar_dispatch_bytes": chosen, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
