"""End-to-end latency on a topic of several queues, and where its tail comes from: ``python -m bench.latency_queues``.

    python -m bench.latency_queues [--queues 1,8] [--rate 1000] [--count 4000] [--rounds 3]

One broker; a PushConsumer in another process (spawned) subscribed to a topic of ``--queues`` queues (8 is a new
topic's default); one synchronous sender here sending 100 B messages at ``--rate`` a second, without choosing a
queue (the producer spreads them over the queues). For each message: its latency from the time it was due to be
sent to its listener call (``bench.peers``' definition: a sender that falls behind the rate adds its lateness), and
how late its send returned (the sender's own lag). Beside them, each process's CPU over the sending (the share of
one CPU: user and system time of all its threads over the wall time), so that a tail can be told apart: a sender
that cannot keep up (its lateness is the tail), or a consumer or broker that holds messages (latency above the
lateness). Prints a table and writes ``bench/results/latency_queues.json``; each figure is the median of
``--rounds`` runs with the lowest and highest.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.peers.pacing import LatencyConsumer, paced, stamp
from bench.peers.settings import LATENCY_WARMUP_MSGS
from bench.peers.sluice import SluiceBroker, sluice_latency_consumer
from bench.report import save

RESULTS = Path(__file__).with_name("results") / "latency_queues.json"
SIZE_B = 100


def process_cpu_s(pid: int) -> float:
    """User and system CPU seconds of every thread of ``pid`` so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(broker: SluiceBroker, queues: int, rate: int, count: int, run: int) -> dict[str, float]:
    from broker.client import Admin, Message, Producer

    assert broker.server is not None
    topic = f"latency-{queues}q-{run}"
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, queues=queues)
    consumer = LatencyConsumer(sluice_latency_consumer, broker.endpoint, topic, count)  # bench.peers' own
    pids = {"broker": broker.server.proc.pid, "consumer": consumer.pid, "sender": os.getpid()}
    cpu_before = {k: process_cpu_s(p) for k, p in pids.items()}
    due_at: dict[int, float] = {}
    late_ms: dict[int, float] = {}
    started = time.monotonic()
    with Producer(broker.endpoint) as producer:
        for seq, due in paced(rate, count):
            due_at[seq] = due
            producer.send(Message(topic, stamp(seq, SIZE_B)))
            late_ms[seq] = (time.monotonic() - due) * 1000
    wall_s = time.monotonic() - started
    cpu = {k: (process_cpu_s(p) - cpu_before[k]) / wall_s for k, p in pids.items()}
    received = consumer.received()
    keys = [k for k in sorted(due_at) if k >= LATENCY_WARMUP_MSGS]
    missing = [k for k in keys if k not in received]
    if missing:
        raise RuntimeError(f"{len(missing)} messages never reached the listener (first {missing[:5]})")
    latency = np.array([(received[k] - due_at[k]) * 1000 for k in keys])
    late = np.array([late_ms[k] for k in keys])
    return {
        "p50_ms": float(np.percentile(latency, 50)), "p99_ms": float(np.percentile(latency, 99)),
        "sender_late_p50_ms": float(np.percentile(late, 50)), "sender_late_p99_ms": float(np.percentile(late, 99)),
        "achieved_rate_per_s": len(due_at) / wall_s,
        **{f"{k}_cpu_share": v for k, v in cpu.items()},
    }


def spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "rounds": values}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.latency_queues", description=__doc__.split("\n\n")[0])
    ap.add_argument("--queues", default="1,8", help="comma list of the topic's queue counts (default %(default)s)")
    ap.add_argument("--rate", type=int, default=1000, help="messages a second (default %(default)s)")
    ap.add_argument("--count", type=int, default=4000, help="messages a run (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each queue count, taken in turn (default 3)")
    args = ap.parse_args(argv)
    counts = [int(q) for q in args.queues.split(",") if q.strip()]
    if args.count <= LATENCY_WARMUP_MSGS or args.rounds < 1 or args.rate <= 0 or not counts:
        ap.error(f"--count must exceed the {LATENCY_WARMUP_MSGS} warm-up messages; --rounds, --rate positive")
    runs: dict[int, list[dict[str, float]]] = {q: [] for q in counts}
    load_at_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="sluice-latency-queues-") as tmp:
        broker = SluiceBroker()
        broker.start(Path(tmp))
        try:
            for r in range(args.rounds):
                for q in counts:
                    runs[q].append(one_run(broker, q, args.rate, args.count, r))
        finally:
            broker.stop()
    rows = {str(q): {k: spread([run[k] for run in rs]) for k in rs[0]} for q, rs in runs.items()}
    print(f"\n{args.rate}/s, {args.count} messages a run, median of {args.rounds} runs [lowest, highest]")
    print(f"{'queues':>6} {'p50 ms':>22} {'p99 ms':>24} {'sender late p99 ms':>24} {'CPU broker/consumer/sender':>28}")
    for queues, row in rows.items():
        cell = {k: f"{v['median']:.2f} [{v['min']:.2f}, {v['max']:.2f}]" for k, v in row.items()}
        shares = "/".join(f"{row[f'{p}_cpu_share']['median']:.2f}" for p in ("broker", "consumer", "sender"))
        print(f"{queues:>6} {cell['p50_ms']:>22} {cell['p99_ms']:>24} {cell['sender_late_p99_ms']:>24} {shares:>28}")
    command = " ".join(["python -m bench.latency_queues", *(argv if argv is not None else sys.argv[1:])])
    save(RESULTS, {"benchmark": "latency_queues", "command": command,
                   "machine": {"cpus": os.cpu_count(), "load_avg_1m_at_start": round(load_at_start, 2)},
                   "rate_per_s": args.rate, "count": args.count, "rounds": args.rounds, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
