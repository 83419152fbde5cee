"""The printed table: throughput, latency, the machine's floors, and Sluice's ratios to its peers and floors."""

from __future__ import annotations

from bench.peers.figures import SystemResult
from bench.peers.settings import LATENCY_SIZE_B


def print_table(results: list[SystemResult], limits: dict[str, float], ratios: dict[str, float]) -> None:
    print()
    print(f"{'system':<8} {'size':>6} {'produce msgs/s':>15} {'MB/s':>8} {'consume msgs/s':>15} {'MB/s':>8}")
    for r in results:
        if r.error:
            print(f"{r.name:<8} FAILED: {r.error}")
        for t in r.throughput:
            print(
                f"{r.name:<8} {t.size_b:>4} B {t.produce_msgs_s:>15,.0f} {t.produce_mb_s:>8.1f} "
                f"{t.consume_msgs_s:>15,.0f} {t.consume_mb_s:>8.1f}"
            )
    for r in results:
        for t in r.throughput:
            if t.consume_raw_s is not None:
                raw = t.count / t.consume_raw_s
                print(f"{r.name:<8} {t.size_b:>4} B consume with pull_raw (entries not decoded): {raw:,.0f} msgs/s")
            if t.consume_eager_s is not None:
                eager = t.count / t.consume_eager_s
                print(f"{r.name:<8} {t.size_b:>4} B consume decoding every field (decode_entry): {eager:,.0f} msgs/s")
            if t.index_wait_s is not None:
                print(f"{r.name:<8} {t.size_b:>4} B indexed {t.index_wait_s:.3f} s after the last send's answer")
    print()
    print(f"end-to-end latency, {LATENCY_SIZE_B} B, single synchronous sends at a fixed rate:")
    for r in results:
        for lat in r.latency:
            print(
                f"  {r.name:<13} {lat.rate_per_s:>5}/s  p50 {lat.p50_ms:8.2f} ms   p99 {lat.p99_ms:8.2f} ms"
                f"   max {lat.max_ms:8.2f} ms   (sent {lat.sent} at {lat.achieved_rate_per_s:,.0f}/s)"
            )
    print()
    print("limits of this machine, and ratios:")
    print(f"  disk write with fdatasync      {limits['disk_write_mb_s']:8.0f} MB/s")
    print(f"  gRPC loopback 1 MiB upload     {limits['grpc_upload_mb_s']:8.0f} MB/s")
    print(f"  gRPC loopback 1 MiB download   {limits['grpc_download_mb_s']:8.0f} MB/s")
    for name, value in ratios.items():
        print(f"  {name:<44} {value:6.2f}")


def peer_ratios(results: list[SystemResult]) -> dict[str, float]:
    """Each Sluice transport's consume (and batched produce) rate over each peer's, size by size, and its latency
    percentiles over theirs, from the same run (the same load on the machine)."""
    out: dict[str, float] = {}
    for sluice in (r for r in results if r.name.startswith("sluice")):
        for peer in results:
            if peer.name.startswith("sluice"):
                continue
            for t in sluice.throughput:
                theirs = next((p for p in peer.throughput if p.size_b == t.size_b), None)
                if theirs is not None:
                    out[f"{sluice.name} consume {t.size_b} B / {peer.name} consume"] = (
                        t.consume_msgs_s / theirs.consume_msgs_s
                    )
                    if sluice.name != "sluice":  # the gRPC row's produce ratios are read from the table as before
                        out[f"{sluice.name} produce {t.size_b} B / {peer.name} produce"] = (
                            t.produce_msgs_s / theirs.produce_msgs_s
                        )
            for lat in sluice.latency:
                other = next((p for p in peer.latency if p.rate_per_s == lat.rate_per_s), None)
                if other is not None and sluice.name != "sluice":
                    out[f"{sluice.name} p50 at {lat.rate_per_s}/s / {peer.name} p50"] = lat.p50_ms / other.p50_ms
                    out[f"{sluice.name} p99 at {lat.rate_per_s}/s / {peer.name} p99"] = lat.p99_ms / other.p99_ms
    return out


def limit_ratios(results: list[SystemResult], limits: dict[str, float]) -> dict[str, float]:
    sluice = next((r for r in results if r.name == "sluice" and r.throughput), None)
    if sluice is None:
        return {}
    big = max(sluice.throughput, key=lambda t: t.size_b)
    return {
        f"sluice produce {big.size_b} B / disk write": big.produce_mb_s / limits["disk_write_mb_s"],
        f"sluice produce {big.size_b} B / gRPC upload": big.produce_mb_s / limits["grpc_upload_mb_s"],
        f"sluice consume {big.size_b} B / gRPC download": big.consume_mb_s / limits["grpc_download_mb_s"],
    }
