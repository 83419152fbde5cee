"""CRC-32 for BODYCRC: zlib.crc32 vs crcmod's crc-32 (both IEEE CRC-32) on 100 B, 1 KiB and 64 KiB bodies.

``python -m bench.crc [--quick]`` prints a table and writes bench/results/crc.json. The store keeps the faster one.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import zlib
from collections.abc import Callable
from typing import Any

SIZES = (100, 1024, 64 * 1024)


def _rate(fn: Callable[[bytes], int], body: bytes, seconds: float) -> float:
    """Calls per second of ``fn(body)``, timed in rounds of 1000 calls until ``seconds`` pass."""
    n = 0
    start = time.perf_counter()
    while True:
        for _ in range(1000):
            fn(body)
        n += 1000
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return n / elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.crc", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="0.2 s per measurement instead of 1 s")
    args = ap.parse_args(argv)
    seconds = 0.2 if args.quick else 1.0
    import crcmod.predefined

    crcmod_fn = crcmod.predefined.mkCrcFun("crc-32")
    rows: list[dict[str, Any]] = []
    for size in SIZES:
        body = os.urandom(size)
        assert crcmod_fn(body) == zlib.crc32(body)  # the same CRC, so either could be used
        for name, fn in (("zlib.crc32", zlib.crc32), ("crcmod crc-32", crcmod_fn)):
            calls = _rate(fn, body, seconds)
            rows.append({"impl": name, "body_bytes": size, "calls_per_s": calls, "mb_per_s": calls * size / 1e6})
    print(f"{'implementation':<16}{'body':>8}{'calls/s':>14}{'MB/s':>10}")
    for r in rows:
        print(f"{r['impl']:<16}{r['body_bytes']:>8}{r['calls_per_s']:>14,.0f}{r['mb_per_s']:>10,.0f}")
    faster = {
        size: max((r for r in rows if r["body_bytes"] == size), key=lambda r: r["calls_per_s"])["impl"]
        for size in SIZES
    }
    print("faster:", faster, "- the store uses zlib.crc32")
    os.makedirs("bench/results", exist_ok=True)
    with open("bench/results/crc.json", "w") as f:
        json.dump({"rows": rows, "faster": faster, "seconds_per_measurement": seconds}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
