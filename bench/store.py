"""Message-store throughput: puts (single / batched, ASYNC / SYNC), raw gets, abnormal-recovery scan.

``python -m bench.store [--quick] [--dir DIR]`` prints a table and writes bench/results/store.json.

* put rates are sustained rates: the clock stops when the dispatcher has built every consume-queue unit, so a
  store that appends fast but falls behind on dispatch does not look fast. MB/s counts body bytes.
* batched puts send pre-encoded buffers (the client's work is not timed; the store validates framing and CRC of
  every entry, patches the store fields and writes once).
* SYNC puts run 32 writer threads; each put returns only after the group commit's fdatasync covers it.
* raw get = get_message returning the entries' bytes undecoded, 32 per call (RocketMQ's default) and 256.
* recovery = abnormal start with no checkpoint: every commit-log byte framed and CRC-checked (page cache warm);
  body sizes vary from 50% to 150% of the nominal size. MB/s = scanned bytes / scan time (re-dispatch excluded,
  reported separately in the JSON).
* msgs/CPU-s divides by the CPU time of this process (all threads): on a shared machine it says what the store
  costs regardless of what else runs.
* threads: every thread of this process (writers and the store's services) runs on the CPUs ``--python-cpus``
  names, by default one CPU, under SCHED_BATCH, and the SYNC_FLUSH flusher on the other CPUs, as
  ``sluice broker`` places its Python threads (broker/server/thread_placement.py says why; ``--python-cpus off``
  measures them free, normal policy).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import threading
import time
from typing import Any

from bench.report import run_date
from broker.format.message import encode_entry
from broker.server.thread_placement import ThreadPlacement, parse_python_cpus
from broker.store import MessageStore, StoreConfig

TOPIC = "BenchTopic"
QUEUES = 8


PLACEMENT: list[ThreadPlacement] = []  # set by main unless --python-cpus off


def place_threads(spec: str) -> frozenset[int] | None:
    """Place this process's threads as ``sluice broker`` does (``--python-cpus``; thread_placement.py says why):
    the CPUs the Python threads get, None when placement is off."""
    allowed = frozenset(os.sched_getaffinity(0))
    cpus = parse_python_cpus(spec, allowed)
    if cpus is not None:
        PLACEMENT.append(ThreadPlacement(cpus, allowed))
        PLACEMENT[0].reconcile()  # this thread too: every thread started later inherits its CPUs and policy
    return cpus


def _store(path: str, **kw: Any) -> MessageStore:
    shutil.rmtree(path, ignore_errors=True)
    s = MessageStore(StoreConfig(store_path=path, **kw))
    s.start()
    for placement in PLACEMENT:  # its new service threads inherited the pinned mask: the flusher goes apart
        placement.reconcile()
    return s


class Clock:
    """Wall and CPU time (all threads of this process) since creation: the machine may be shared, and the CPU
    rate says what the store costs whatever else runs."""

    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = time.process_time()

    def stop(self) -> dict[str, float]:
        return {"seconds": time.perf_counter() - self.wall, "cpu_seconds": time.process_time() - self.cpu}


def _finish(s: MessageStore, clock: Clock) -> dict[str, float]:
    assert s.wait_dispatched(600)
    return clock.stop()


def bench_put_single(path: str, body_size: int, seconds: float) -> dict[str, Any]:
    s = _store(path)
    body = os.urandom(body_size)
    n = 0
    clock = Clock()
    while time.perf_counter() - clock.wall < seconds:
        for i in range(100):
            s.put_message(TOPIC, i % QUEUES, body)
        n += 100
    times = _finish(s, clock)
    s.shutdown()
    return {"msgs": n, **times}


def bench_put_batch(
    path: str, body_size: int, seconds: float, sync: bool = False, threads: int = 1, per_batch: int = 0
) -> dict[str, Any]:
    kw = {"flush_disk_type": "SYNC_FLUSH"} if sync else {}
    s = _store(path, **kw)
    per_batch = per_batch or max(1, min(1000, (1 << 20) // (body_size + 120)))  # about 1 MiB per batch
    buffers = [
        b"".join(encode_entry(TOPIC.encode(), q, os.urandom(body_size)) for _ in range(per_batch))
        for q in range(QUEUES)
    ]
    counts = [0] * threads
    stop = time.perf_counter() + seconds

    def worker(k: int) -> None:
        i = k
        while time.perf_counter() < stop:
            r = s.put_batch(buffers[i % QUEUES])
            assert r.ok, r.error
            counts[k] += per_batch
            i += 1

    clock = Clock()
    _run_threads(worker, threads)
    times = _finish(s, clock)
    s.shutdown()
    return {"msgs": sum(counts), **times, "batch_msgs": per_batch, "threads": threads}


def bench_put_sync_threads(path: str, body_size: int, seconds: float, threads: int = 32) -> dict[str, Any]:
    s = _store(path, flush_disk_type="SYNC_FLUSH")
    body = os.urandom(body_size)
    counts = [0] * threads
    stop = time.perf_counter() + seconds
    fsyncs_before = s.faults.fsync_counts.get("commitlog", 0)

    def worker(k: int) -> None:
        while time.perf_counter() < stop:
            r = s.put_message(TOPIC, k % QUEUES, body)
            assert r.ok, r.error
            counts[k] += 1

    clock = Clock()
    _run_threads(worker, threads)
    times = _finish(s, clock)
    fsyncs = s.faults.fsync_counts.get("commitlog", 0) - fsyncs_before
    s.shutdown()
    return {"msgs": sum(counts), **times, "threads": threads, "fsyncs": fsyncs}


def _run_threads(fn: Any, n: int) -> None:
    ts = [threading.Thread(target=fn, args=(k,)) for k in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def bench_get(path: str, body_size: int, total: int, per_call: int, seconds: float) -> dict[str, Any]:
    s = _store(path)
    per_batch = 1000
    buf = b"".join(encode_entry(TOPIC.encode(), 0, os.urandom(body_size)) for _ in range(per_batch))
    for _ in range(total // per_batch):
        assert s.put_batch(buf).ok
    assert s.wait_dispatched(600)
    n = calls = 0
    offset = 0
    clock = Clock()
    while time.perf_counter() - clock.wall < seconds:
        r = s.get_message("bench", TOPIC, 0, offset, per_call, max_bytes=per_call * (body_size + 200))
        n += len(r.entry_positions)
        calls += 1
        offset = r.next_begin_offset if r.next_begin_offset < total else 0
    times = clock.stop()
    s.shutdown()
    return {"msgs": n, **times, "calls": calls, "per_call": per_call}


def bench_recovery(path: str, body_size: int, total_bytes: int) -> dict[str, Any]:
    s = _store(path)
    per_batch = max(1, (1 << 20) // (body_size + 120))
    rng = random.Random(body_size)  # sizes vary (50%..150%) so the walk cannot take the same-size shortcut
    buf = b"".join(
        encode_entry(TOPIC.encode(), 0, os.urandom(rng.randint(body_size // 2, body_size * 3 // 2)))
        for _ in range(per_batch)
    )
    while s.commit_log.max_offset < total_bytes:
        assert s.put_batch(buf).ok
    assert s.wait_dispatched(600)
    s.abandon()  # leaves the abort file: the next start is abnormal
    os.unlink(s.config.checkpoint_path)  # no checkpoint: every byte of the log is re-checked
    s2 = MessageStore(StoreConfig(store_path=path))
    clock = Clock()
    s2.start()
    times = clock.stop()
    rep = s2.recovery_report
    assert rep is not None and rep.abnormal
    s2.shutdown()
    return {
        "bytes": rep.scanned_bytes,
        "scan_seconds": rep.scan_seconds,
        "scan_cpu_seconds": rep.scan_cpu_seconds,
        "dispatch_seconds": rep.dispatch_seconds,
        "start_seconds": times["seconds"],
        "start_cpu_seconds": times["cpu_seconds"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.store", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="short runs (about 30 s in all)")
    ap.add_argument("--dir", default="", help="store directory (default: a temporary directory, removed after)")
    ap.add_argument("--python-cpus", default="auto", help="CPUs for this process's threads: auto (one), off, 2,3...")
    args = ap.parse_args(argv)
    allowed = frozenset(os.sched_getaffinity(0))
    cpus = place_threads(args.python_cpus)
    seconds = 1.0 if args.quick else 4.0
    root = args.dir or tempfile.mkdtemp(prefix="sluice-bench-")
    path = os.path.join(root, "store")
    rows: list[dict[str, Any]] = []

    def add(name: str, body: int, res: dict[str, Any], target: str = "") -> None:
        row = {"case": name, "body_bytes": body, **res, "target": target}
        if "msgs" in res:
            row["msgs_per_s"] = res["msgs"] / res["seconds"]
            row["mb_per_s"] = res["msgs"] * body / res["seconds"] / 1e6
            row["msgs_per_cpu_s"] = res["msgs"] / res["cpu_seconds"]
            rate, cpu_rate = f"{row['msgs_per_s']:>12,.0f}", f"{row['msgs_per_cpu_s']:>14,.0f}"
        else:  # recovery: bytes framed and CRC-checked per second of the scan
            row["mb_per_s"] = res["bytes"] / res["scan_seconds"] / 1e6
            row["mb_per_cpu_s"] = res["bytes"] / res["scan_cpu_seconds"] / 1e6
            rate, cpu_rate = f"{'':>12}", f"{row['mb_per_cpu_s']:>11,.0f} MB"
        rows.append(row)
        print(f"{name:<34}{body:>6}{rate}{row['mb_per_s']:>10,.1f}{cpu_rate}  {target}", flush=True)

    load = os.getloadavg()[0]
    placed = f"threads on CPUs {sorted(cpus)}, SCHED_BATCH" if cpus is not None else "threads on any CPU"
    print(f"load average at start: {load:.2f} on {os.cpu_count()} CPUs, {placed}")
    print("(rates are wall-clock; msgs/CPU-s is per second of CPU used by this process, all threads)")
    print(f"{'case':<34}{'body':>6}{'msgs/s':>12}{'MB/s':>10}{'msgs/CPU-s':>14}  target")
    try:
        for body in (100, 1024):
            add("put single ASYNC (1 thread)", body, bench_put_single(path, body, seconds))
            target = ">= 400k msgs/s" if body == 100 else ">= 200 MB/s"
            add("put batched ASYNC (1 thread)", body, bench_put_batch(path, body, seconds), target)
            add("put single SYNC (32 threads)", body, bench_put_sync_threads(path, body, seconds), ">= 50k msgs/s")
            add("put batched SYNC (4 threads)", body, bench_put_batch(path, body, seconds, sync=True, threads=4))
            res = bench_put_batch(path, body, seconds, sync=True, threads=32, per_batch=16)
            add("put SYNC 32 thr x 16-msg batches", body, res, ">= 50k msgs/s")
        total = 200_000 if args.quick else 1_000_000
        add("raw get, 32 per call", 100, bench_get(path, 100, total, 32, seconds), ">= 1M msgs/s")
        add("raw get, 256 per call", 100, bench_get(path, 100, total, 256, seconds), ">= 1M msgs/s")
        size = (128 if args.quick else 512) << 20
        for body in (100, 1024):
            res = bench_recovery(path, body, size)
            add("abnormal recovery scan (CRC on)", body, res, ">= 300 MB/s")
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    os.makedirs("bench/results", exist_ok=True)
    with open("bench/results/store.json", "w") as f:
        meta = {
            "date": run_date(),
            "quick": args.quick,
            "seconds_per_case": seconds,
            "cpus": os.cpu_count(),
            "load_at_start": load,
            "thread_cpus": sorted(cpus) if cpus is not None else sorted(allowed),
        }
        json.dump({**meta, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
