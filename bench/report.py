"""Markdown tables from ``bench/results/*.json``, for docs/benchmarks.md: ``python -m bench.report``.

It reads only what the benchmarks wrote; a missing file is skipped with a note, so the tables always match a run.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).with_name("results")


def load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def run_date() -> str:
    """The day a run is recorded under (UTC), as every results file's ``date`` reads."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")


def save(path: Path, result: dict[str, Any], *, sort_keys: bool = False) -> None:
    """Write a benchmark's result where this report reads it (indented JSON, its directory made, the run's ``date``
    added when it has none) and say where."""
    result.setdefault("date", run_date())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, sort_keys=sort_keys) + "\n")
    print(f"wrote {path}")


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def store(d: dict[str, Any]) -> str:
    rows = [
        [r["case"], str(r["body_bytes"]), f"{r.get('msgs_per_s', 0):,.0f}" if r.get("msgs_per_s") else "—",
         f"{r.get('mb_per_s', 0):,.1f}", r.get("target", "")]
        for r in d["rows"]
    ]
    return f"load average at start {d.get('load_at_start', '?')}\n\n" + table(
        ["case", "body B", "msgs/s", "MB/s", "target"], rows
    )


def server(d: dict[str, Any]) -> str:
    m, t, ok = d["measured"], d["targets"], d["met"]
    rows = [[k, f"{v:,.2f}", f"{t[k]:,}", "yes" if ok[k] else "no"] for k, v in m.items()]
    return f"load average {d['machine'].get('load_average_1m', 0):.1f}\n\n" + table(
        ["measure", "value", "target", "met"], rows
    )


def spark_source(d: dict[str, Any]) -> str:
    rows = [[r["source"], f"{r['rows']:,}", f"{r['median_rows_per_s']:,}",
             f"{r['min_rows_per_s']:,} - {r['max_rows_per_s']:,}"] for r in d["results"]]
    ratio = d["sluice_over_python_memory"]
    return (
        table(["source", "rows", "rows/s, median of the rounds", "slowest - fastest"], rows)
        + f"\n\nsluice / python-memory, round by round: {ratio['median']:.2f} [{ratio['min']:.2f}-{ratio['max']:.2f}]"
    )


def spark_sink(d: dict[str, Any]) -> str:
    rows = [
        [r["sink"], f"{r['rows']:,}", f"{r['best_s']:.2f}", f"{r['rows_per_s']:,.0f}", f"{r['ratio_to_noop']:.2f}",
         f"{r['ratio_to_python_noop']:.2f}"]
        for r in d["rows"]
    ]
    return table(["sink", "rows", "best s", "rows/s", "x noop", "x python-noop"], rows)


def peers(d: dict[str, Any]) -> str:
    rows = []
    for name, s in d["systems"].items():
        for size, t in s.get("throughput", {}).items():
            rows.append(
                [name, size, f"{t.get('produce_msgs_s', 0):,}", f"{t.get('produce_mb_s', 0):.1f}",
                 f"{t.get('consume_msgs_s', 0):,}", f"{t.get('consume_mb_s', 0):.1f}"]
            )
    out = table(["system", "size B", "produce msgs/s", "produce MB/s", "consume msgs/s", "consume MB/s"], rows)
    return out + "\n\nlimits: " + ", ".join(f"{k} {v}" for k, v in d.get("limits", {}).items())


def sync_ceiling(d: dict[str, Any]) -> str:
    rows = []
    for r in d["rows"]:
        if "median_us" in r:
            rows.append([r["case"], f"median {r['median_us']:.0f} us, p90 {r['p90_us']:.0f} us", ""])
        else:
            syncs = r.get("syncs") or r.get("fsyncs")
            rows.append([r["case"], f"{r['msgs_per_s']:,.0f}", f"{r['msgs'] / syncs:.1f}" if syncs else ""])
    return table(["case (32 writers, 100 B)", "msgs/s", "msgs per sync"], rows)


def security(d: dict[str, Any]) -> str:
    kinds = {"plain": "plain text", "tls": "TLS", "tls_auth": "TLS + auth"}
    rows = []
    for case in d["cases"]:
        cells = []
        for k in kinds:
            c = d["median"][k][case]
            cell = f"{c['msgs_per_s']:,.0f} [{c['msgs_per_s_min']:,.0f}-{c['msgs_per_s_max']:,.0f}]"
            if k != "plain":
                lo, hi = d["ratio_spread"][k][case]
                cell += f" ({d['ratios'][k][case]:.2f}x [{lo:.2f}-{hi:.2f}])"
            cells.append(cell)
        rows.append([case.replace("_", " "), *cells])
    t = d["target"]
    return (
        f"{d['rounds']} rounds of {d['duration_s']:g} s; median msgs/s [min-max of the rounds]\n\n"
        + table(["case", *kinds.values()], rows)
        + f"\n\ntarget: TLS + auth >= {t['tls_auth_ratio_at_least']}x plain, {t['case']}: "
        + ("met" if t["met"] else "not met")
    )


SECTIONS = {
    "store": store,
    "sync_ceiling": sync_ceiling,
    "server": server,
    "spark_source": spark_source,
    "spark_sink": spark_sink,
    "peers": peers,
    "security": security,
}


def main() -> int:
    for name, render in SECTIONS.items():
        data = load(name)
        print(f"\n### {name} (`python -m bench.{name}`)\n")
        if data is None:
            print(f"(no bench/results/{name}.json: not run)")
            continue
        try:
            print(render(data))
        except (KeyError, TypeError) as e:
            print(f"(bench/results/{name}.json has an unexpected layout: {e!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
