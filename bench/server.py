"""Broker over gRPC on loopback: `python -m bench.server` prints a table and writes bench/results/server.json.

Each case runs against a broker subprocess (`python -m broker broker`) in a fresh temporary store:
SendBatch throughput (pre-encoded buffers through Producer.send_encoded, each message with its UNIQ_KEY as the
Producer sends it: bench/batches.py; 100 B and 1 KiB bodies; 1 KiB twice: in
calls of 1000 messages, about 1.1 MiB, and of as many as the store's 4 MiB batch limit takes), Producer.send_batch
of Message objects (client encoding included; to one queue, and spread over eight as it is by default), single-send
latency (ASYNC_FLUSH and SYNC_FLUSH brokers), raw pull throughput, and long-poll wake-up latency (send start to
the held pull's answer).
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.batches import producer_batches
from bench.report import save
from broker.client import Message, Producer, PullConsumer
from broker.server.process import BrokerProcess

RESULTS = Path(__file__).resolve().parent / "results" / "server.json"
TOPIC = "Bench"
QUEUES = 8

BROKER_ARGS: list[str] = []  # extra `sluice broker` arguments for every case (--python-cpus)
MAX_BATCH_BYTES = 4 * 1024 * 1024  # StoreConfig.max_batch_bytes: the largest SendBatch a default broker accepts

TARGETS = {
    "send_batch_100B_msgs_per_s": 300_000,
    "send_batch_1KiB_MB_per_s": 150,
    "pull_msgs_per_s": 500_000,
    "send_async_p99_ms": 2.0,
    "wakeup_p99_ms": 5.0,
}


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]


def encoded_batches(body_size: int, batch_msgs: int) -> list[bytes]:
    """One pre-encoded batch a queue, each message with its own UNIQ_KEY as the Producer sends it (bench/batches.py).
    Each sending thread takes batches of its own: two sends of one buffer at once would wait for each other on
    the first message's key, as two attempts of one send do."""
    body = bytes(range(256)) * (body_size // 256 + 1)
    return producer_batches(TOPIC, body[:body_size], QUEUES, batch_msgs, tags="T")


def run_threads(n: int, fn: Callable[[int], int], duration_s: float) -> tuple[int, float]:
    """Run fn(i) repeatedly in n threads for duration_s; returns (units done, seconds)."""
    done = [0] * n
    stop = time.monotonic() + duration_s

    def loop(i: int) -> None:
        while time.monotonic() < stop:
            done[i] += fn(i)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(n)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done), time.perf_counter() - started


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc), to report broker CPU per message."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_send_batch(
    broker: BrokerProcess, body_size: int, batch_msgs: int, duration_s: float, threads: int
) -> dict[str, Any]:
    endpoint = broker.endpoint
    assert broker.proc is not None
    batches = [encoded_batches(body_size, batch_msgs) for _ in range(threads)]
    producers = [Producer(endpoint) for _ in range(threads)]
    producers[0].send_encoded(batches[0][0], batch_msgs)  # warm up: topic auto-created, channels connected
    counter = [0] * threads

    def one(i: int) -> int:
        counter[i] += 1
        producers[i].send_encoded(batches[i][counter[i] % QUEUES], batch_msgs)
        return batch_msgs

    cpu_before = process_cpu_s(broker.proc.pid)
    msgs, seconds = run_threads(threads, one, duration_s)
    broker_cpu = process_cpu_s(broker.proc.pid) - cpu_before
    for p in producers:
        p.close()
    entry_bytes = len(batches[0][0]) / batch_msgs
    return {"msgs_per_s": msgs / seconds, "MB_per_s": msgs * body_size / seconds / 1e6,
            "entry_MB_per_s": msgs * entry_bytes / seconds / 1e6, "batch_msgs": batch_msgs,
            "threads": threads, "broker_cpu_us_per_msg": broker_cpu / msgs * 1e6,
            "msgs_per_broker_cpu_s": msgs / broker_cpu if broker_cpu else 0.0}


def bench_send_messages(
    endpoint: str, batch_msgs: int, duration_s: float, queue_id: int | None = 0
) -> dict[str, float]:
    """Producer.send_batch with Message objects: client-side encoding included (one thread). ``queue_id`` None:
    the default spread, each call's messages in runs over the topic's eight queues."""
    msgs = [Message(TOPIC, b"m" * 100, tags="T", keys=[f"k{i}"]) for i in range(batch_msgs)]
    with Producer(endpoint) as p:
        p.send_batch(msgs[:10])
        sent, seconds = run_threads(1, lambda i: len(p.send_batch(msgs, queue_id=queue_id)), duration_s)
    return {"msgs_per_s": sent / seconds, "batch_msgs": batch_msgs}


def bench_single_send(endpoint: str, count: int) -> dict[str, float]:
    with Producer(endpoint) as p:
        msg = Message(TOPIC, b"x" * 100)
        for _ in range(200):
            p.send(msg, queue_id=0)
        latencies = []
        for _ in range(count):
            started = time.perf_counter()
            p.send(msg, queue_id=0)
            latencies.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99), "count": count}


def bench_pull(endpoint: str, body_size: int, per_queue: int, max_msgs: int) -> dict[str, float]:
    batches = encoded_batches(body_size, 1000)
    with Producer(endpoint) as p:
        for _ in range(per_queue // 1000):
            for b in batches:
                p.send_encoded(b, 1000)
    time.sleep(0.5)  # let the dispatcher finish building consume queues
    total = 0
    with PullConsumer(endpoint, "bench") as c:
        c.pull_raw(TOPIC, 0, 0, max_msgs=10)
        started = time.perf_counter()
        for qid in range(QUEUES):
            offset = 0
            while True:
                r = c.pull_raw(TOPIC, qid, offset, max_msgs=max_msgs, max_bytes=8 << 20)
                if not r.entry_positions:
                    break
                total += len(r.entry_positions)
                offset = r.next_begin_offset
        raw_s = time.perf_counter() - started
        started = time.perf_counter()
        decoded, offset = 0, 0
        while decoded < 50_000:
            res = c.pull(TOPIC, 1, offset, max_msgs=max_msgs, max_bytes=8 << 20)
            if not res.messages:
                break
            decoded += len(res.messages)
            offset = res.next_begin_offset
        decoded_s = time.perf_counter() - started
    return {"raw_msgs_per_s": total / raw_s, "raw_msgs": total, "decoded_msgs_per_s": decoded / decoded_s}


def held_pull(c: PullConsumer, offset: int, result: list[float], answered: threading.Event) -> None:
    r = c.pull_raw("Wake", 0, offset, timeout_ms=5000)
    result.append(time.perf_counter())
    assert r.entry_positions, r.status
    answered.set()


def bench_wakeup(endpoint: str, rounds: int) -> dict[str, float]:
    latencies = []
    with Producer(endpoint) as p, PullConsumer(endpoint, "wake") as c:
        offset = p.send(Message("Wake", b"w"), queue_id=0).queue_offset + 1
        for _ in range(rounds):
            answered = threading.Event()
            result: list[float] = []
            t = threading.Thread(target=held_pull, args=(c, offset, result, answered))
            t.start()
            time.sleep(0.01)  # let the pull reach the broker and be held
            started = time.perf_counter()
            p.send(Message("Wake", b"w"), queue_id=0)
            answered.wait(10)
            t.join()
            latencies.append((result[0] - started) * 1000)
            offset += 1
    return {"p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99), "rounds": rounds}


def with_broker(flush: str, fn: Callable[[str], Any]) -> Any:
    return with_broker_process(flush, lambda b: fn(b.endpoint))


def with_broker_process(flush: str, fn: Callable[[BrokerProcess], Any]) -> Any:
    with tempfile.TemporaryDirectory(prefix="sluice-bench-") as tmp:
        broker = BrokerProcess(Path(tmp) / "store", flush=flush, extra_args=BROKER_ARGS).start()
        try:
            return fn(broker)
        finally:
            broker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per throughput case")
    parser.add_argument("--quick", action="store_true", help="short runs (smoke test)")
    parser.add_argument("--python-cpus", default="", help="the broker's --python-cpus (default: its own, auto)")
    args = parser.parse_args()
    if args.python_cpus:
        BROKER_ARGS[:] = ["--python-cpus", args.python_cpus]
    duration = 1.0 if args.quick else args.duration
    results: dict[str, Any] = {}
    results["send_batch_100B"] = with_broker_process("async", lambda b: bench_send_batch(b, 100, 2000, duration, 2))
    results["send_batch_1KiB"] = with_broker_process("async", lambda b: bench_send_batch(b, 1024, 1000, duration, 2))
    max_msgs = MAX_BATCH_BYTES // len(encoded_batches(1024, 1)[0])
    results["send_batch_1KiB_max"] = with_broker_process(
        "async", lambda b: bench_send_batch(b, 1024, max_msgs, duration, 2)
    )
    results["send_batch_messages_100B"] = with_broker("async", lambda ep: bench_send_messages(ep, 1000, duration))
    results["send_batch_messages_100B_spread"] = with_broker(
        "async", lambda ep: bench_send_messages(ep, 1000, duration, queue_id=None)
    )
    results["send_async"] = with_broker("async", lambda ep: bench_single_send(ep, 500 if args.quick else 3000))
    results["send_sync"] = with_broker("sync", lambda ep: bench_single_send(ep, 300 if args.quick else 1000))
    per_queue = 10_000 if args.quick else 40_000
    results["pull_100B"] = with_broker("async", lambda ep: bench_pull(ep, 100, per_queue, 4096))
    results["wakeup"] = with_broker("async", lambda ep: bench_wakeup(ep, 100 if args.quick else 300))
    measured = {
        "send_batch_100B_msgs_per_s": results["send_batch_100B"]["msgs_per_s"],
        "send_batch_1KiB_MB_per_s": results["send_batch_1KiB_max"]["MB_per_s"],
        "pull_msgs_per_s": results["pull_100B"]["raw_msgs_per_s"],
        "send_async_p99_ms": results["send_async"]["p99_ms"],
        "wakeup_p99_ms": results["wakeup"]["p99_ms"],
    }
    rows = [
        ("SendBatch 100 B", f"{results['send_batch_100B']['msgs_per_s']:,.0f} msg/s",
         f"{results['send_batch_100B']['MB_per_s']:.1f} MB/s", ">= 300,000 msg/s"),
        ("  broker CPU", f"{results['send_batch_100B']['broker_cpu_us_per_msg']:.2f} us/msg",
         f"{results['send_batch_100B']['msgs_per_broker_cpu_s']:,.0f} msg per CPU s", ""),
        ("SendBatch 1 KiB, 1000 per call", f"{results['send_batch_1KiB']['msgs_per_s']:,.0f} msg/s",
         f"{results['send_batch_1KiB']['MB_per_s']:.1f} MB/s", ""),
        ("  broker CPU", f"{results['send_batch_1KiB']['broker_cpu_us_per_msg']:.2f} us/msg",
         f"{results['send_batch_1KiB']['msgs_per_broker_cpu_s'] * 1024 / 1e6:,.0f} MB per CPU s", ""),
        (f"SendBatch 1 KiB, {max_msgs} per call (4 MiB)", f"{results['send_batch_1KiB_max']['msgs_per_s']:,.0f} msg/s",
         f"{results['send_batch_1KiB_max']['MB_per_s']:.1f} MB/s", ">= 150 MB/s"),
        ("  broker CPU", f"{results['send_batch_1KiB_max']['broker_cpu_us_per_msg']:.2f} us/msg",
         f"{results['send_batch_1KiB_max']['msgs_per_broker_cpu_s'] * 1024 / 1e6:,.0f} MB per CPU s", ""),
        ("send_batch(Message) 100 B", f"{results['send_batch_messages_100B']['msgs_per_s']:,.0f} msg/s",
         "client encoding included", ""),
        ("  spread over 8 queues", f"{results['send_batch_messages_100B_spread']['msgs_per_s']:,.0f} msg/s",
         "the default: no queue_id", ""),
        ("send ASYNC", f"p50 {results['send_async']['p50_ms']:.3f} ms", f"p99 {results['send_async']['p99_ms']:.3f} ms",
         "p99 <= 2 ms"),
        ("send SYNC", f"p50 {results['send_sync']['p50_ms']:.3f} ms",
         f"p99 {results['send_sync']['p99_ms']:.3f} ms", ""),
        ("pull raw 100 B", f"{results['pull_100B']['raw_msgs_per_s']:,.0f} msg/s",
         f"decoded {results['pull_100B']['decoded_msgs_per_s']:,.0f} msg/s", ">= 500,000 msg/s"),
        ("long-poll wake-up", f"p50 {results['wakeup']['p50_ms']:.3f} ms", f"p99 {results['wakeup']['p99_ms']:.3f} ms",
         "p99 <= 5 ms"),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    load = os.getloadavg()[0]
    print(f"Sluice broker over gRPC on loopback ({platform.machine()}, {os.cpu_count()} CPUs, "
          f"python {platform.python_version()}, load average {load:.1f} at the end)")
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    report = {
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(), "load_average_1m": load},
        "broker_python_cpus": args.python_cpus or "auto",
        "results": results,
        "measured": measured,
        "targets": TARGETS,
        "met": {k: (measured[k] <= v if k.endswith("_ms") else measured[k] >= v) for k, v in TARGETS.items()},
    }
    save(RESULTS, report, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
