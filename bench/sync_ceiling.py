"""What this machine allows 32 single-message SYNC_FLUSH writers, whatever the store does.

``python -m bench.sync_ceiling [--seconds S]`` prints a table and writes bench/results/sync_ceiling.json.

The store's single-message SYNC row (bench.store) is judged against the same machine on the same day: every case
here runs 32 Python writer threads placed as bench.store places them (one CPU, SCHED_BATCH; the flusher apart),
but their "put" is a 100 B copy into a memory-mapped file under a lock, with none of the store's work (entry
encoding, CRC, queue offsets, dispatch). What is left is the cost of the machine: fdatasync, and waking a blocked
Python thread for every message.

* fdatasync: latency of one fdatasync after a 3.2 KiB append (32 messages of 100 B), nothing else running.
* group commit: the store's design (GroupCommitService) with the trivial put: a flusher thread runs fdatasync
  over everything appended so far, then wakes the writers it covered.
* every writer syncs: each writer calls fdatasync itself after its copy; the kernel's journal merges what
  overlaps (no Python wake-up at all).
* wake only: the group commit with the fdatasync replaced by a sleep of the median latency measured above: the
  bound set by waking threads alone.
* store: bench.store's single-message SYNC case (32 threads, 100 B), run here for the same-day comparison.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from bench import store as store_bench

WRITERS = 32
BODY = os.urandom(100)
FILE_BYTES = 1 << 30  # room for a run at several 100k msgs/s


class LogFile:
    """A memory-mapped file that writers append ``BODY`` to under one lock: the trivial put."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        os.ftruncate(self.fd, FILE_BYTES)
        self.mm = mmap.mmap(self.fd, FILE_BYTES)
        self.lock = threading.Lock()
        self.end = 0

    def append(self) -> int:
        with self.lock:
            start, self.end = self.end, self.end + len(BODY)
            assert self.end <= FILE_BYTES, "the run outgrew the file: raise FILE_BYTES"
            self.mm[start : self.end] = BODY
            return self.end

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)


def fdatasync_latency_us(path: str, samples: int = 2000) -> list[float]:
    """Sorted latencies of fdatasync after each 3.2 KiB append."""
    log = LogFile(path)
    out = []
    for _ in range(samples):
        for _ in range(32):
            log.append()
        started = time.perf_counter()
        os.fdatasync(log.fd)
        out.append((time.perf_counter() - started) * 1e6)
    log.close()
    return sorted(out)


class GroupCommit:
    """A flusher thread: ``sync()`` (fdatasync, or a sleep) over all appended so far, then wake who it covered."""

    def __init__(self, log: LogFile, sync: Callable[[], None]) -> None:
        self.log, self.sync = log, sync
        self.lock = threading.Lock()
        self.waiters: list[tuple[int, threading.Lock]] = []
        self.work = threading.Event()
        self.stopped = False
        self.flushed = 0
        self.syncs = 0
        self.thread = threading.Thread(target=self._run, name="group-commit")

    def wait(self, end: int) -> None:
        me = threading.Lock()
        me.acquire()
        with self.lock:
            self.waiters.append((end, me))
        self.work.set()
        me.acquire()

    def _run(self) -> None:
        while not self.stopped:
            self.work.wait(0.01)
            self.work.clear()
            while True:
                target = self.log.end
                if target <= self.flushed:
                    break
                self.sync()
                self.syncs += 1
                with self.lock:
                    self.flushed = target
                    done = [w for e, w in self.waiters if e <= target]
                    self.waiters = [(e, w) for e, w in self.waiters if e > target]
                for w in done:
                    w.release()


def run_writers(seconds: float, write: Callable[[], None]) -> dict[str, float]:
    """WRITERS threads calling ``write`` until the time is up; messages, wall and CPU seconds."""
    counts = [0] * WRITERS
    stop = time.perf_counter() + seconds

    def writer(k: int) -> None:
        while time.perf_counter() < stop:
            write()
            counts[k] += 1

    clock = store_bench.Clock()
    threads = [threading.Thread(target=writer, args=(k,)) for k in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"msgs": sum(counts), **clock.stop()}


def group_commit(path: str, seconds: float, sync_s: float | None) -> dict[str, Any]:
    """The trivial put with a flusher thread; ``sync_s``: sleep this long instead of fdatasync."""
    log = LogFile(path)
    gc = GroupCommit(log, (lambda: os.fdatasync(log.fd)) if sync_s is None else (lambda: time.sleep(sync_s)))
    gc.thread.start()
    for placement in store_bench.PLACEMENT:  # the flusher apart from the writers, as bench.store
        placement.reconcile()
    res = run_writers(seconds, lambda: gc.wait(log.append()))
    gc.stopped = True
    gc.work.set()
    gc.thread.join()
    log.close()
    return {**res, "syncs": gc.syncs}


def every_writer_syncs(path: str, seconds: float) -> dict[str, Any]:
    log = LogFile(path)

    def write() -> None:
        log.append()
        os.fdatasync(log.fd)

    res = run_writers(seconds, write)
    log.close()
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sync_ceiling", description=__doc__)
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each throughput case")
    ap.add_argument("--dir", default="", help="directory on the disk to measure (default: a temporary one)")
    ap.add_argument("--python-cpus", default="auto", help="as bench.store: auto (one CPU), off, 2,3...")
    args = ap.parse_args(argv)
    allowed = frozenset(os.sched_getaffinity(0))
    cpus = store_bench.place_threads(args.python_cpus)
    root = tempfile.mkdtemp(prefix="sluice-bench-", dir=args.dir or None)
    path = os.path.join(root, "log")
    rows: list[dict[str, Any]] = []
    placed = f"Python threads on CPUs {sorted(cpus)}, SCHED_BATCH" if cpus is not None else "threads on any CPU"
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs, {placed}; {WRITERS} writers")
    print(f"{'case':<44}{'msgs/s':>10}{'msgs/sync':>11}{'CPU':>6}")
    try:
        lat = fdatasync_latency_us(path)
        median, p90 = lat[len(lat) // 2], lat[len(lat) * 9 // 10]
        rows.append({"case": "fdatasync after a 3.2 KiB append", "median_us": median, "p90_us": p90})
        print(f"{'fdatasync after a 3.2 KiB append':<44}  median {median:.0f} us, p90 {p90:.0f} us")
        cases = [
            ("group commit, trivial put", lambda: group_commit(path, args.seconds, None)),
            ("every writer syncs, trivial put", lambda: every_writer_syncs(path, args.seconds)),
            (f"wake only (sleep {median:.0f} us for the sync)", lambda: group_commit(path, args.seconds, median / 1e6)),
            ("store: put single SYNC (bench.store)", lambda: store_bench.bench_put_sync_threads(
                os.path.join(root, "store"), 100, args.seconds)),
        ]
        for name, case in cases:
            res = case()
            row = {"case": name, **res, "msgs_per_s": res["msgs"] / res["seconds"]}
            syncs = res.get("syncs") or res.get("fsyncs")
            per_sync = f"{res['msgs'] / syncs:>11.1f}" if syncs else f"{'':>11}"
            rows.append(row)
            print(f"{name:<44}{row['msgs_per_s']:>10,.0f}{per_sync}{res['cpu_seconds'] / res['seconds']:>6.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    os.makedirs("bench/results", exist_ok=True)
    with open("bench/results/sync_ceiling.json", "w") as f:
        meta = {"writers": WRITERS, "body_bytes": len(BODY), "seconds_per_case": args.seconds,
                "thread_cpus": sorted(cpus) if cpus is not None else sorted(allowed)}
        json.dump({**meta, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
