"""``python -m bench.peers``: its flags, the run, the floors, ``bench.hops`` after it, and the JSON report."""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import bench.peers
from bench.hops import Hop, ServerCpu, print_hops
from bench.hops import measure as measure_hops
from bench.peers.charts import write_charts
from bench.peers.every_field import print_every_field, run_every_field
from bench.peers.floors import disk_write_mb_s, grpc_loopback_mb_s
from bench.peers.rounds import missing_package_hint, run_systems
from bench.peers.settings import (
    BATCH_MSGS,
    HOPS_CALLS,
    LATENCY_DURATION_S,
    LATENCY_RATES_PER_S,
    LATENCY_SIZE_B,
    MAX_ROUNDS,
    RESULTS_DIR,
)
from bench.peers.spread import print_spread
from bench.peers.sync_sender import SyncSender, measure_sync_senders, print_sync_senders
from bench.peers.systems import SYSTEMS
from bench.peers.table import limit_ratios, peer_ratios, print_table
from bench.report import save


def main(argv: list[str] | None = None) -> int:
    description = (bench.peers.__doc__ or "").split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=description)
    parser.add_argument(
        "--systems", default="sluice,sluice-remoting,redis,nats,relay,relay-streams,tcp-relay",
        help="comma list of sluice, sluice-remoting, redis, nats, relay, relay-streams (bare grpcio relays: latency "
        "rows only), tcp-relay (a bare TCP relay doing the remoting framing: latency and sync sender floors)",
    )
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the message counts (default 1.0)")
    parser.add_argument("--no-charts", action="store_true", help="skip the PNG charts")
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="throughput runs per system, taken in turn over the systems; each figure keeps its best (default 1)",
    )
    parser.add_argument(
        "--latency-rates", default=",".join(map(str, LATENCY_RATES_PER_S)),
        help="comma list of msgs/s for the latency runs (default %(default)s)",
    )
    parser.add_argument(
        "--default-malloc", action="store_true",
        help="leave this process's malloc at glibc's defaults (else broker.client.tune_malloc(), for every client)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "peers.json")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.systems.split(",") if n.strip()]
    try:
        latency_rates = [int(r) for r in args.latency_rates.split(",") if r.strip()]
    except ValueError:
        parser.error(f"--latency-rates {args.latency_rates!r}: write whole msgs/s, e.g. 5000,250")
    if not 1 <= args.rounds <= MAX_ROUNDS:
        parser.error(f"--rounds must be 1..{MAX_ROUNDS}")
    if any(r <= 0 for r in latency_rates):
        parser.error("--latency-rates must be positive")
    unknown = sorted(set(names) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown system(s) {unknown}; choose from {sorted(SYSTEMS)}")

    from broker.client import tune_malloc

    client_malloc = "glibc defaults" if args.default_malloc or not tune_malloc() else "tuned"
    load_at_start = os.getloadavg()[0]  # other work on the machine skews every figure: recorded with them
    with tempfile.TemporaryDirectory(prefix="sluice-peers-") as tmp:
        workdir = Path(tmp)
        senders: list[SyncSender] = []

        def sync_rounds(started: list[Any]) -> None:
            print("one synchronous sender", flush=True)
            senders.extend(measure_sync_senders(started, args.scale, args.rounds))

        results = run_systems(names, workdir, args.scale, latency_rates, args.rounds, also=sync_rounds)
        every_field: dict[str, object] = {}
        if {"sluice", "redis"} <= set(names):
            print("consume with every field read: Sluice and Redis (bench.peers.every_field)", flush=True)
            try:
                every_field = run_every_field(workdir, args.scale, args.rounds)
            except Exception as e:  # noqa: BLE001 -- the rows above stand without these; the error is reported
                every_field = {"error": f"{type(e).__name__}: {e}"}
                print(f"  every field FAILED: {every_field['error']}", flush=True)
        print("limits: disk, gRPC loopback", flush=True)
        upload, download = grpc_loopback_mb_s(workdir)
        limits = {
            "disk_write_mb_s": disk_write_mb_s(workdir),
            "grpc_upload_mb_s": upload,
            "grpc_download_mb_s": download,
        }
    hops: list[Hop] = []
    server_cpu: list[ServerCpu] = []
    if "sluice" in names:
        print("Sluice hop by hop, beside each hop's floor (bench.hops)", flush=True)
        hops, server_cpu = measure_hops(HOPS_CALLS)
    ratios = {**peer_ratios(results), **limit_ratios(results, limits)}
    print_table(results, limits, ratios)
    print()
    print("medians of the rounds [lowest, highest]:")
    for r in results:
        print_spread(r.name, r.spread)
    ratios.update(print_sync_senders(senders))
    if every_field and "error" not in every_field:
        print_every_field(every_field)
    if hops:
        print()
        print_hops(hops, server_cpu)

    report = {
        "benchmark": "peers",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_avg_1m_at_start": round(load_at_start, 2),
            "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        },
        "config": {
            "batch_msgs": BATCH_MSGS,
            "scale": args.scale,
            "rounds": args.rounds,
            "latency_rates_per_s": latency_rates,
            "latency_size_b": LATENCY_SIZE_B,
            "latency_duration_s": LATENCY_DURATION_S,
            "queues_or_streams": 1,
            "client_malloc": client_malloc,
        },
        "systems": {r.name: r.to_json() for r in results},
        "sync_sender": {s.name: s.to_json() for s in senders},
        "limits": {k: round(v, 1) for k, v in limits.items()},
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "every_field": every_field,
        "hops": [asdict(h) for h in hops],
        "server_cpu": [asdict(c) for c in server_cpu],
    }
    save(args.out, report)
    if not args.no_charts:
        try:
            for path in write_charts(results, args.out.parent):
                print(f"wrote {path}")
        except ModuleNotFoundError as e:
            print(f"no charts: {missing_package_hint(e)}")
            return 1
    return 1 if any(r.error for r in results) else 0
