"""Aggregate SendBatch throughput of one broker against a cluster of two, on this machine, in one run:
`python -m bench.cluster` prints a table and writes bench/results/cluster.json.

A broker's Python threads share one GIL, so one broker uses about one CPU of Python; two brokers on two cores
should take well past one. Each case starts a name server and its brokers (`LocalCluster`, real processes, fresh
temporary stores), creates the topic on every broker, and runs two client processes that send pre-encoded batches
(`Producer.send_encoded`, 1000 messages a call for 100 B, as many as fit in 1 MiB for 1 KiB; each message with its
UNIQ_KEY as the Producer sends it: bench/batches.py) for the same time.
In the one-broker case both clients send to it; with two brokers each client sends to one of them, through
the cluster's route. Repetitions alternate the cases, so a slow stretch of the machine hits both.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.batches import producer_batches
from bench.report import save
from broker.client import Admin, Producer
from broker.namesrv.local_cluster import LocalCluster

RESULTS = Path(__file__).resolve().parent / "results" / "cluster.json"
TOPIC = "BenchCluster"
QUEUES = 8
CLIENTS = 2
THREADS_PER_CLIENT = 2
TARGET_RATIO_100B = 1.4


def _client(namesrv: str, broker_name: str, body_size: int, duration_s: float, start_at: float,
            out: Any) -> None:
    """One client process: THREADS_PER_CLIENT threads sending batches to ``broker_name``'s queues."""
    import threading

    per_call = 1000 if body_size <= 100 else max(1, (1 << 20) // (body_size + 120))
    body = bytes(range(256)) * (body_size // 256 + 1)
    # each thread its own batches (bench/batches.py): two sends of one buffer at once would wait on its first key
    batches = [producer_batches(TOPIC, body[:body_size], QUEUES, per_call) for _ in range(THREADS_PER_CLIENT)]
    producers = [Producer(namesrv=namesrv) for _ in range(THREADS_PER_CLIENT)]
    producers[0].send_encoded(batches[0][0], per_call, broker_name=broker_name, topic=TOPIC)  # warm: route, channel
    counts = [0] * THREADS_PER_CLIENT
    time.sleep(max(0.0, start_at - time.time()))
    stop = time.monotonic() + duration_s

    def loop(i: int) -> None:
        n = 0
        while time.monotonic() < stop:
            producers[i].send_encoded(batches[i][n % QUEUES], per_call, broker_name=broker_name, topic=TOPIC)
            n += 1
        counts[i] = n * per_call

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(THREADS_PER_CLIENT)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in producers:
        p.close()
    out.put(sum(counts))


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine (/proc/stat's first line; idle and iowait count as not busy)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


def run_case(brokers: int, body_size: int, duration_s: float) -> dict[str, float]:
    # one CPU for each broker's Python threads (with "auto" both would take the lowest CPU), the native ones free
    cpus = [str(cpu) for cpu in sorted(os.sched_getaffinity(0))]
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp, \
            LocalCluster(Path(tmp), brokers=brokers, python_cpus=cpus) as c:
        for name in c.names:
            with Admin(c.endpoint(name)) as admin:
                admin.create_topic(TOPIC, QUEUES)
        with Producer(namesrv=c.namesrv) as p:  # wait until every broker's route is registered
            while {mq.broker_name for mq in p.queues(TOPIC)} != set(c.names):
                p.router.refresh(TOPIC)
                time.sleep(0.1)
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        start_at = time.time() + 3.0  # every client connected and warm before the clock starts
        procs = [ctx.Process(target=_client, args=(c.namesrv, c.names[i % brokers], body_size, duration_s,
                                                   start_at, out)) for i in range(CLIENTS)]
        for proc in procs:
            proc.start()
        time.sleep(max(0.0, start_at + 0.5 - time.time()))
        busy0, all0 = _cpu_times()  # the machine's CPU while the clients send (clients, brokers and the rest)
        time.sleep(max(0.0, duration_s - 1.0))
        busy1, all1 = _cpu_times()
        total = sum(out.get(timeout=duration_s + 120) for _ in procs)
        for proc in procs:
            proc.join()
    return {"msgs_per_s": total / duration_s, "MB_per_s": total * body_size / duration_s / 1e6,
            "cpu_busy": (busy1 - busy0) / max(1, all1 - all0)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per case (default 5)")
    ap.add_argument("--repeat", type=int, default=2, help="alternating repetitions of each case (default 2)")
    args = ap.parse_args(argv)
    runs: dict[str, list[float]] = {}
    busy: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        for size in (100, 1024):
            for brokers in (1, 2):
                r = run_case(brokers, size, args.duration)
                runs.setdefault(f"{brokers}_broker_{size}B", []).append(r["msgs_per_s"])
                busy.setdefault(f"{brokers}_broker_{size}B", []).append(r["cpu_busy"])
    rows: list[dict[str, Any]] = []
    for size in (100, 1024):
        one, two = runs[f"1_broker_{size}B"], runs[f"2_broker_{size}B"]
        ratio = (sum(two) / len(two)) / (sum(one) / len(one))
        rows.append({"body_bytes": size, "one_broker_msgs_per_s": one, "two_brokers_msgs_per_s": two,
                     "ratio": ratio, "one_broker_cpu_busy": busy[f"1_broker_{size}B"],
                     "two_brokers_cpu_busy": busy[f"2_broker_{size}B"]})
    print(f"{'body':>6}  {'1 broker msgs/s':>26}  {'2 brokers msgs/s':>26}  ratio  machine CPU busy (1 / 2 brokers)")
    for row in rows:
        one_s = ", ".join(f"{v:,.0f}" for v in row["one_broker_msgs_per_s"])
        two_s = ", ".join(f"{v:,.0f}" for v in row["two_brokers_msgs_per_s"])
        b1 = sum(row["one_broker_cpu_busy"]) / len(row["one_broker_cpu_busy"])
        b2 = sum(row["two_brokers_cpu_busy"]) / len(row["two_brokers_cpu_busy"])
        print(f"{row['body_bytes']:>5}B  {one_s:>26}  {two_s:>26}  {row['ratio']:.2f}   {b1:.0%} / {b2:.0%}")
    result = {
        "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {mp.cpu_count()} CPUs",
        "command": "python -m bench.cluster", "duration_s": args.duration, "clients": CLIENTS,
        "threads_per_client": THREADS_PER_CLIENT, "rows": rows, "target_ratio_100B": TARGET_RATIO_100B,
    }
    save(RESULTS, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
