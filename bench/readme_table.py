"""The README's performance table, made from ``bench/results/*.json``: ``python -m bench.readme_table [--check]``.

Each row reads the results file of one benchmark and says what that file holds: the median of its rounds with the
lowest and highest where the benchmark ran rounds, one run's figure where it ran once (said so in the row), the
ratio to a peer measured in the same run, the target and whether it is met, the run's date and its command. The
README holds the table between two markers; this module rewrites it there (``--check``: exit 1 when the README's
table is not what the results files make), and ``tests/unit/test_readme_table.py`` fails when the two differ, so a
figure in the README is always one a results file holds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).with_name("results")
README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN = "<!-- performance table: made by `python -m bench.readme_table` from bench/results; do not edit -->"
END = "<!-- end of the performance table -->"
HEADER = ["measure", "result", "target", "date", "command"]

Row = list[str]


def load(name: str) -> dict[str, Any]:
    return dict(json.loads((RESULTS / f"{name}.json").read_text()))


def met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def k(n: float) -> str:
    """A rate in thousands: 599559 -> '600k'."""
    return f"{n / 1000:,.0f}k" if n >= 10_000 else f"{n:,.0f}"


def spread(s: dict[str, Any], fmt: Callable[[float], str] = k) -> str:
    """A figure of several rounds: its median, then the lowest and highest round."""
    return f"{fmt(s['median'])} [{fmt(s['min'])}-{fmt(s['max'])}]"


def ratio(r: dict[str, Any]) -> str:
    return f"{r['median']:.2f}x [{r['min']:.2f}-{r['max']:.2f}]"


def ratio_of(mine: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float]:
    """Round by round, ``mine`` over ``theirs`` (rounds taken in turn in one run): the median and range."""
    per_round = [a / b for a, b in zip(mine["rounds"], theirs["rounds"], strict=True)]
    return {"median": statistics.median(per_round), "min": min(per_round), "max": max(per_round)}


# ------------------------------------------------------------------------------------------------- the rows


def store_rows() -> list[Row]:
    d = load("store")
    cases = {r["case"]: r for r in d["rows"] if r["body_bytes"] == 100}
    one_run = f"one run of {d['seconds_per_case']:g} s"
    batched, sync = cases["put batched ASYNC (1 thread)"], cases["put single SYNC (32 threads)"]
    return [
        ["store, batched puts of 100 B", f"{k(batched['msgs_per_s'])} msgs/s ({one_run})",
         f"400k: {met(batched['msgs_per_s'] >= 400_000)}", d["date"], "`python -m bench.store`"],
        ["store, 32 single-message SYNC_FLUSH writers, 100 B", f"{k(sync['msgs_per_s'])} msgs/s ({one_run})",
         f"50k: {met(sync['msgs_per_s'] >= 50_000)}", d["date"], "`python -m bench.store`"],
    ]


def server_rows() -> list[Row]:
    d = load("server")
    m, t = d["measured"], d["targets"]
    return [
        ["broker, SendBatch of 100 B over gRPC", f"{k(m['send_batch_100B_msgs_per_s'])} msgs/s (one run)",
         f"{k(t['send_batch_100B_msgs_per_s'])}: {met(d['met']['send_batch_100B_msgs_per_s'])}", d["date"],
         "`python -m bench.server`"],
        ["broker, single send p99", f"{m['send_async_p99_ms']:.2f} ms (one run)",
         f"{t['send_async_p99_ms']:g} ms: {met(d['met']['send_async_p99_ms'])}", d["date"], "`python -m bench.server`"],
    ]


def cluster_rows() -> list[Row]:
    d = load("cluster")
    by_size = {r["body_bytes"]: r for r in d["rows"]}
    rounds = len(by_size[100]["one_broker_msgs_per_s"])
    target = d["target_ratio_100B"]
    return [[
        "two brokers against one, SendBatch of 100 B / 1 KiB",
        f"{by_size[100]['ratio']:.2f}x / {by_size[1024]['ratio']:.2f}x ({rounds} rounds each way, their totals)",
        f"{target:g}x at 100 B: {met(by_size[100]['ratio'] >= target)} (both CPUs busy)", d["date"],
        "`python -m bench.cluster`",
    ]]


def replication_rows() -> list[Row]:
    d = load("replication")
    t, sync = d["targets"], "SYNC_MASTER + 1 slave"
    small, large = d["throughput"]["100 B"][sync]["ratio"], d["throughput"]["1024 B"][sync]["ratio"]
    f = d["failover"]
    return [
        ["SYNC_MASTER + 1 slave against no replica, SendBatch of 100 B / 1 KiB",
         f"{small:.2f}x / {large:.2f}x (median of {d['repeat']} runs each)",
         f"{t['sync_master_ratio']:g}x: {met(min(small, large) >= t['sync_master_ratio'])}", d["date"],
         "`python -m bench.replication`"],
        [f"failover, master SIGKILLed to the first acknowledged send, p99 of {f['kills']}", f"{f['p99_s']:.2f} s",
         f"{t['failover_p99_s']:g} s: {met(f['p99_s'] <= t['failover_p99_s'])}", d["date"],
         "`python -m bench.replication`"],
    ]


def security_rows() -> list[Row]:
    d = load("security")
    case, t = d["target"]["case"], d["target"]
    lo, hi = d["ratio_spread"]["tls_auth"][case]
    return [[
        f"TLS + auth against plain text, {case.replace('_', ' ')}",
        f"{d['ratios']['tls_auth'][case]:.2f}x [{lo:.2f}-{hi:.2f}] (median of {d['rounds']} rounds)",
        f"{t['tls_auth_ratio_at_least']:g}x: {met(t['met'])}", d["date"], f"`{d['command']}`",
    ]]


def peers_rows() -> list[Row]:
    d = load("peers")
    date, cmd, rounds = d["date"], "`python -m bench.peers`", d["config"]["rounds"]
    sluice, redis = d["systems"]["sluice"]["spread"], d["systems"]["redis"]["spread"]
    rows = []
    ef = d["every_field"]["sizes"]
    pull = [ef[s]["ratios"]["sluice pull / redis XREAD"] for s in ("100", "1024")]
    push = [ef[s]["ratios"]["sluice push / redis XREAD"] for s in ("100", "1024")]
    rows.append([
        "beside Redis Streams, consume 100 B / 1 KiB with every field read (`PullConsumer.pull`; Redis: `XREAD`)",
        f"{ratio(pull[0])} / {ratio(pull[1])} Redis", f"1.2x: {met(min(r['median'] for r in pull) >= 1.2)}", date, cmd,
    ])
    rows.append([
        "the same through a `PushConsumer` listener",
        f"{ratio(push[0])} / {ratio(push[1])} Redis", f"1.2x: {met(min(r['median'] for r in push) >= 1.2)}", date, cmd,
    ])
    for what, key, note in (
        ("consume", "consume_msgs_s", "reading only the body, which Sluice decodes when first read"),
        ("produce", "produce_msgs_s", "`send_batch` of 1,000; Redis: pipelined `XADD`"),
    ):
        r = [ratio_of(sluice["throughput"][s][key], redis["throughput"][s][key]) for s in ("100", "1024")]
        rows.append([
            f"beside Redis Streams, batched {what} 100 B / 1 KiB ({note})", f"{ratio(r[0])} / {ratio(r[1])} Redis",
            f"1.2x: {met(min(x['median'] for x in r) >= 1.2)}", date, cmd,
        ])
    rate = str(d["config"]["latency_rates_per_s"][0])
    mine, theirs = sluice["latency"][rate], redis["latency"][rate]
    ms = lambda v: f"{v:.2f}"  # noqa: E731 -- one format, used twice
    p50, p99 = ratio_of(mine["p50_ms"], theirs["p50_ms"]), ratio_of(mine["p99_ms"], theirs["p99_ms"])
    rows.append([
        f"end-to-end latency at {int(rate):,}/s, send to a `PushConsumer`'s listener, p50 / p99 ms",
        f"{spread(mine['p50_ms'], ms)} / {spread(mine['p99_ms'], ms)} (Redis {spread(theirs['p50_ms'], ms)} / "
        f"{spread(theirs['p99_ms'], ms)})",
        f"p50 at most 1.5x Redis's, p99 at most 2x: p50 {p50['median']:.1f}x, p99 {p99['median']:.1f}x, "
        f"{met(p50['median'] <= 1.5 and p99['median'] <= 2)}", date, cmd,
    ])
    sync = d["sync_sender"]
    one = sync["sluice"]
    floor = sync.get("tcp-relay")
    rows.append([
        "one synchronous sender, sends/s",
        f"{one['sends_per_s_median']:,} [{one['sends_per_s_min']:,}-{one['sends_per_s_max']:,}] (Redis "
        f"{sync['redis']['sends_per_s_median']:,}"
        + (f"; a bare Python TCP relay, the floor: {floor['sends_per_s_median']:,}" if floor else "") + ")",
        f"5,000: {met(one['sends_per_s_median'] >= 5000)}", date, cmd,
    ])
    for row in rows:
        row[1] += f", median of {rounds} rounds [lowest-highest]" if "rounds" not in row[1] else ""
    return rows


def spark_rows() -> list[Row]:
    src, sink = load("spark_source"), load("spark_sink")
    by_source = {r["source"]: r for r in src["results"]}
    mine, theirs = by_source["sluice"], by_source["python-memory"]
    ratio = src["sluice_over_python_memory"]
    r = ratio["median"]
    eo = sink["exactly_once_of_at_least_once"]
    rows_sink = {r["sink"]: r for r in sink["rows"]}
    return [
        [f"Spark source, {mine['rows']:,} rows, against Python's in-memory source in the same run",
         f"{r:.2f}x [{ratio['min']:.2f}-{ratio['max']:.2f}] ({k(mine['median_rows_per_s'])} against "
         f"{k(theirs['median_rows_per_s'])} rows/s), median of {mine['runs']} rounds taken in turn [lowest-highest]",
         f"0.95x: {met(r >= 0.95)}", src["date"], "`python -m bench.spark_source`"],
        [f"Spark sink, {rows_sink['sluice exactly-once']['rows']:,} rows, exactly-once against at-least-once",
         f"{eo:.2f}x ({k(rows_sink['sluice exactly-once']['rows_per_s'])} against "
         f"{k(rows_sink['sluice at-least-once']['rows_per_s'])} rows/s, best of the runs)",
         f"0.75x: {met(eo >= 0.75)}", sink["date"], "`python -m bench.spark_sink`"],
    ]


ROWS: list[Callable[[], list[Row]]] = [
    store_rows, server_rows, cluster_rows, replication_rows, security_rows, peers_rows, spark_rows,
]


def render() -> str:
    rows = [row for make in ROWS for row in make()]
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def replaced(readme: str, table: str) -> str:
    """``readme`` with the text between the markers replaced by ``table``; ValueError without both markers."""
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return readme[:start] + "\n" + table + "\n" + readme[end:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.readme_table", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the README's table differs, change nothing")
    args = ap.parse_args(argv)
    text = README.read_text(encoding="utf-8")
    new = replaced(text, render())
    if args.check:
        if new != text:
            print("README.md's performance table differs from bench/results: run python -m bench.readme_table")
            return 1
        return 0
    README.write_text(new, encoding="utf-8")
    print(f"wrote the performance table of {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
