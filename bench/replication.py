"""Replication: what a replica costs in throughput, and how long a failover takes. `python -m bench.replication`
prints two tables and writes bench/results/replication.json.

1. SendBatch throughput, 100 B and 1 KiB messages, in one run: a broker without replication, an ASYNC_MASTER with
   one slave and a SYNC_MASTER with one slave (classic mode; broker processes on this machine, fresh temporary
   stores). One client process sends pre-encoded batches (1000 messages a call for 100 B, 1 MiB for 1 KiB; each
   message with its UNIQ_KEY as the Producer sends it: bench/batches.py) from CLIENT_THREADS threads to the
   master: a SYNC_MASTER answers a batch one replica round trip later, so its
   throughput depends on how many batches are in flight (RocketMQ's benchmark producers run dozens of threads).
   Cases alternate over the repetitions, so a slow stretch of the machine hits all of them. Each case also gives
   each replica's CPU a message (its process's clock over the run). Target: SYNC_MASTER at least half the
   unreplicated throughput.
2. Failover time: a 3-replica group in controller mode with default settings (etcd lease 5 s), a client sending
   single messages through the name server all the time; the master is SIGKILLed, and the time to the first
   acknowledged send after the kill is measured, again and again (the killed replica is restarted and back in
   sync before the next kill). p50 and p99 over the kills. Target: p99 <= 10 s.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.batches import producer_batches
from bench.server import process_cpu_s
from broker.client import Admin, Message, Producer
from broker.errors import BrokerError
from broker.ha.local_group import ReplicaGroup

RESULTS = Path(__file__).resolve().parent / "results" / "replication.json"
TOPIC = "BenchReplication"
QUEUES = 8
CLIENT_THREADS = 16
CASES = {  # name -> (replicas, settings)
    "no replica": (1, {}),
    "ASYNC_MASTER + 1 slave": (2, {"role": "ASYNC_MASTER"}),
    "SYNC_MASTER + 1 slave": (2, {"role": "SYNC_MASTER"}),
}
TARGET_SYNC_RATIO = 0.5
TARGET_FAILOVER_P99_S = 10.0


def _client(endpoint: str, body_size: int, duration_s: float, out: Any) -> None:
    per_call = 1000 if body_size <= 100 else max(1, (1 << 20) // (body_size + 120))
    body = bytes(range(256)) * (body_size // 256 + 1)
    # each thread its own batches (bench/batches.py): two sends of one buffer at once would wait on its first key
    batches = [producer_batches(TOPIC, body[:body_size], QUEUES, per_call) for _ in range(CLIENT_THREADS)]
    producers = [Producer(endpoint=endpoint) for _ in range(CLIENT_THREADS)]
    producers[0].send_encoded(batches[0][0], per_call)  # warm: channel, topic
    counts = [0] * CLIENT_THREADS
    stop = time.monotonic() + duration_s

    def loop(i: int) -> None:
        n = 0
        while time.monotonic() < stop:
            producers[i].send_encoded(batches[i][n % QUEUES], per_call)
            n += 1
        counts[i] = n * per_call

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(CLIENT_THREADS)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put((sum(counts), time.monotonic() - started))


def _throughput(name: str, body_size: int, duration_s: float) -> tuple[float, list[float]]:
    """Messages a second, and each replica's CPU a message (us; the master first) over the run."""
    replicas, settings = CASES[name]
    with tempfile.TemporaryDirectory(prefix="sluice-bench-repl-") as tmp:
        group = ReplicaGroup(Path(tmp), replicas, controller=False, settings=settings,
                             store={"mapped_file_size_commit_log": 1 << 30})
        if not settings:  # no replication at all: a broker on its own
            group.settings["role"] = ""
        with group as g:
            master = g.endpoint(g.ids[0])
            with Admin(master) as admin:
                admin.create_topic(TOPIC, QUEUES, if_not_exists=True)
            if replicas > 1:  # the slave in sync before the clock starts
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    with Admin(master) as admin:
                        if admin.stats().get("ha_in_sync_replicas", 0) >= replicas:
                            break
                    time.sleep(0.1)
            pids = [g.brokers[i].proc.pid for i in g.ids]  # type: ignore[union-attr]  # started: proc is set
            cpu_before = [process_cpu_s(pid) for pid in pids]
            q: Any = mp.get_context("spawn").Queue()
            p = mp.get_context("spawn").Process(target=_client, args=(master, body_size, duration_s, q))
            p.start()
            count, elapsed = q.get(timeout=duration_s + 120)
            p.join()
            # the client's warm-up send and start-up fall in the window too: a few ms of each replica's CPU
            cpu = [(process_cpu_s(pid) - before) / count * 1e6 for pid, before in zip(pids, cpu_before, strict=True)]
            return float(count / elapsed), cpu


def _failovers(kills: int) -> list[float]:
    times: list[float] = []
    with tempfile.TemporaryDirectory(prefix="sluice-bench-failover-") as tmp, ReplicaGroup(Path(tmp), 3) as g:
        master = g.wait_master(timeout_s=60)
        with Admin(g.endpoint(master)) as admin:
            admin.create_topic(TOPIC, QUEUES, if_not_exists=True)
        acked: list[float] = []
        stop = threading.Event()

        def sender() -> None:
            with Producer(namesrv=g.namesrv, timeout_s=30) as p:
                while not stop.is_set():
                    try:
                        p.send(Message(TOPIC, b"failover"))
                        acked.append(time.monotonic())
                    except BrokerError:
                        time.sleep(0.05)

        threading.Thread(target=sender, daemon=True).start()
        try:
            for _ in range(kills):
                _wait(lambda: g.state() is not None and len(g.state().in_sync) == 3, 120)  # type: ignore[union-attr]
                _wait(lambda: bool(acked) and time.monotonic() - acked[-1] < 1, 60)
                master = g.wait_master(timeout_s=60)
                g.kill(master)
                killed = time.monotonic()
                _wait(lambda killed=killed: bool(acked) and acked[-1] > killed, 120)
                times.append(next(t for t in acked if t > killed) - killed)
                print(f"  failover {len(times)}: {times[-1]:.2f} s", flush=True)
                g.start_replica(master)
        finally:
            stop.set()
    return times


def _wait(condition: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.02)


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.replication", description=__doc__)
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per throughput case")
    ap.add_argument("--repeat", type=int, default=2, help="repetitions of the throughput cases (alternating)")
    ap.add_argument("--kills", type=int, default=10, help="failovers to time (0: skip)")
    args = ap.parse_args(argv)
    rates: dict[str, dict[str, list[float]]] = {}
    cpus: dict[str, dict[str, list[list[float]]]] = {}  # each run's CPU a message, per replica
    for size in (100, 1024):
        for _ in range(args.repeat):
            for name in CASES:
                rate, cpu = _throughput(name, size, args.duration)
                rates.setdefault(f"{size} B", {}).setdefault(name, []).append(rate)
                cpus.setdefault(f"{size} B", {}).setdefault(name, []).append(cpu)
                print(f"  {size} B {name}: {rate:,.0f} msgs/s, CPU a message "
                      + " / ".join(f"{c:.2f}" for c in cpu) + (" us (master / slave)" if len(cpu) > 1 else " us"),
                      flush=True)
    print("\nSendBatch throughput (median of the repetitions, msgs/s; CPU a message, master / slave):")
    print(f"{'size':<8}{'case':<26}{'msgs/s':>12}{'MB/s':>9}{'vs none':>9}{'CPU us':>16}")
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for size_name, cases in rates.items():
        base = sorted(cases["no replica"])[len(cases["no replica"]) // 2]
        for name, values in cases.items():
            med = sorted(values)[len(values) // 2]
            size = int(size_name.split()[0])
            per_replica = [statistics.median(c) for c in zip(*cpus[size_name][name], strict=True)]
            table.setdefault(size_name, {})[name] = {"msgs_per_s": med, "mb_per_s": med * size / 1e6,
                                                     "ratio": med / base,
                                                     "cpu_us_per_msg": [round(c, 2) for c in per_replica]}
            shown = " / ".join(f"{c:.2f}" for c in per_replica)
            print(f"{size_name:<8}{name:<26}{med:>12,.0f}{med * size / 1e6:>9.1f}{med / base:>9.2f}{shown:>16}")
    failover: dict[str, Any] = {}
    if args.kills:
        print(f"\nFailover time, {args.kills} SIGKILLs of the master (controller mode, default settings):")
        times = _failovers(args.kills)
        failover = {"kills": len(times), "p50_s": _pct(times, 0.5), "p99_s": _pct(times, 0.99), "max_s": max(times),
                    "times_s": times}
        print(f"p50 {failover['p50_s']:.2f} s   p99 {failover['p99_s']:.2f} s   max {failover['max_s']:.2f} s")
    result = {
        "date": time.strftime("%Y-%m-%d"), "machine": platform.platform(), "cpus": mp.cpu_count(),
        "duration_s": args.duration, "repeat": args.repeat, "throughput": table, "failover": failover,
        "targets": {"sync_master_ratio": TARGET_SYNC_RATIO, "failover_p99_s": TARGET_FAILOVER_P99_S},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
