"""Message-store throughput: puts (single / batched, ASYNC / SYNC), raw gets, abnormal-recovery scan.

``python -m bench.store [--quick] [--dir DIR]`` prints a table and writes bench/results/store.json.

* put rates are sustained rates: the clock stops when the dispatcher has built every consume-queue unit, so a
  store that appends fast but falls behind on dispatch does not look fast. MB/s counts body bytes.
* batched puts send pre-encoded buffers (the client's work is not timed; the store validates framing and CRC of
  every entry, patches the store fields and writes once).
* SYNC puts run 32 writer threads; each put returns only after the group commit's fdatasync covers it.
* raw get = get_message returning the entries' bytes undecoded, 32 per call (RocketMQ's default) and 256.
* recovery = abnormal start with no checkpoint: every commit-log byte framed and CRC-checked (page cache warm).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
from typing import Any

from broker.store import MessageStore, StoreConfig
from broker.store.message import encode_entry

TOPIC = "BenchTopic"
QUEUES = 8


def _store(path: str, **kw: Any) -> MessageStore:
    shutil.rmtree(path, ignore_errors=True)
    s = MessageStore(StoreConfig(store_path=path, **kw))
    s.start()
    return s


def _finish(s: MessageStore, started: float) -> float:
    assert s.wait_dispatched(600)
    return time.perf_counter() - started


def bench_put_single(path: str, body_size: int, seconds: float) -> dict[str, Any]:
    s = _store(path)
    body = os.urandom(body_size)
    n = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        for i in range(100):
            s.put_message(TOPIC, i % QUEUES, body)
        n += 100
    elapsed = _finish(s, started)
    s.shutdown()
    return {"msgs": n, "seconds": elapsed}


def bench_put_batch(path: str, body_size: int, seconds: float, sync: bool = False, threads: int = 1) -> dict[str, Any]:
    kw = {"flush_disk_type": "SYNC_FLUSH"} if sync else {}
    s = _store(path, **kw)
    per_batch = max(1, min(1000, (1 << 20) // (body_size + 120)))  # about 1 MiB per batch
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

    started = time.perf_counter()
    _run_threads(worker, threads)
    elapsed = _finish(s, started)
    s.shutdown()
    return {"msgs": sum(counts), "seconds": elapsed, "batch_msgs": per_batch, "threads": threads}


def bench_put_sync_threads(path: str, body_size: int, seconds: float, threads: int = 32) -> dict[str, Any]:
    s = _store(path, flush_disk_type="SYNC_FLUSH")
    body = os.urandom(body_size)
    counts = [0] * threads
    stop = time.perf_counter() + seconds
    fsyncs_before = s.faults.fsync_calls

    def worker(k: int) -> None:
        while time.perf_counter() < stop:
            r = s.put_message(TOPIC, k % QUEUES, body)
            assert r.ok, r.error
            counts[k] += 1

    started = time.perf_counter()
    _run_threads(worker, threads)
    elapsed = _finish(s, started)
    fsyncs = s.faults.fsync_calls - fsyncs_before
    s.shutdown()
    return {"msgs": sum(counts), "seconds": elapsed, "threads": threads, "fsyncs": fsyncs}


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
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        r = s.get_message("bench", TOPIC, 0, offset, per_call, max_bytes=per_call * (body_size + 200))
        n += len(r.entry_positions)
        calls += 1
        offset = r.next_begin_offset if r.next_begin_offset < total else 0
    elapsed = time.perf_counter() - started
    s.shutdown()
    return {"msgs": n, "seconds": elapsed, "calls": calls, "per_call": per_call}


def bench_recovery(path: str, body_size: int, total_bytes: int) -> dict[str, Any]:
    s = _store(path)
    per_batch = max(1, (1 << 20) // (body_size + 120))
    buf = b"".join(encode_entry(TOPIC.encode(), 0, os.urandom(body_size)) for _ in range(per_batch))
    while s.commit_log.max_offset < total_bytes:
        assert s.put_batch(buf).ok
    assert s.wait_dispatched(600)
    s.abandon()  # leaves the abort file: the next start is abnormal
    os.unlink(s.config.checkpoint_path)  # no checkpoint: every byte of the log is re-checked
    s2 = MessageStore(StoreConfig(store_path=path))
    started = time.perf_counter()
    s2.start()
    elapsed = time.perf_counter() - started
    rep = s2.recovery_report
    assert rep is not None and rep.abnormal
    s2.shutdown()
    return {
        "bytes": rep.scanned_bytes,
        "scan_seconds": rep.scan_seconds,
        "dispatch_seconds": rep.dispatch_seconds,
        "start_seconds": elapsed,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.store", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="short runs (about 30 s in all)")
    ap.add_argument("--dir", default="", help="store directory (default: a temporary directory, removed after)")
    args = ap.parse_args(argv)
    seconds = 1.0 if args.quick else 4.0
    root = args.dir or tempfile.mkdtemp(prefix="sluice-bench-")
    path = os.path.join(root, "store")
    rows: list[dict[str, Any]] = []

    def add(name: str, body: int, res: dict[str, Any], target: str = "") -> None:
        secs = res.get("seconds") or res.get("scan_seconds")
        row = {"case": name, "body_bytes": body, **res, "target": target}
        if "msgs" in res:
            row["msgs_per_s"] = res["msgs"] / secs
            row["mb_per_s"] = res["msgs"] * body / secs / 1e6
        else:
            row["mb_per_s"] = res["bytes"] / secs / 1e6
        rows.append(row)
        rate = f"{row['msgs_per_s']:>12,.0f}" if "msgs_per_s" in row else f"{'':>12}"
        print(f"{name:<34}{body:>6}{rate}{row['mb_per_s']:>10,.1f}  {target}", flush=True)

    print(f"{'case':<34}{'body':>6}{'msgs/s':>12}{'MB/s':>10}  target")
    try:
        for body in (100, 1024):
            add("put single ASYNC (1 thread)", body, bench_put_single(path, body, seconds))
            target = ">= 400k msgs/s" if body == 100 else ">= 200 MB/s"
            add("put batched ASYNC (1 thread)", body, bench_put_batch(path, body, seconds), target)
            add("put single SYNC (32 threads)", body, bench_put_sync_threads(path, body, seconds), ">= 50k msgs/s")
            add("put batched SYNC (4 threads)", body, bench_put_batch(path, body, seconds, sync=True, threads=4))
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
        json.dump({"quick": args.quick, "seconds_per_case": seconds, "cpus": os.cpu_count(), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
