"""The PNG charts (throughput by message size, latency by rate), drawn with matplotlib, a benchmark-only package."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.peers.figures import SystemResult
from bench.peers.settings import LATENCY_SIZE_B, SIZES_B


def write_charts(results: list[SystemResult], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in results if r.throughput]
    paths: list[Path] = []
    fig, axes = plt.subplots(1, len(SIZES_B), figsize=(11, 4))
    for ax, size_b in zip(axes, SIZES_B, strict=True):
        xs = np.arange(2)
        width = 0.8 / max(1, len(done))
        for i, r in enumerate(done):
            t = next(t for t in r.throughput if t.size_b == size_b)
            ax.bar(xs + i * width, [t.produce_msgs_s / 1000, t.consume_msgs_s / 1000], width, label=r.name)
        ax.set_xticks(xs + width * (len(done) - 1) / 2, ["produce", "consume"])
        ax.set_title(f"{size_b} B messages")
        ax.set_ylabel("thousand msgs/s")
        ax.legend()
    fig.suptitle("Batched throughput on loopback, one stream/queue, standard Python clients")
    fig.tight_layout()
    paths.append(out_dir / "peers_throughput.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    rates = sorted({lat.rate_per_s for r in results for lat in r.latency}, reverse=True)
    fig, axes = plt.subplots(1, max(1, len(rates)), figsize=(5.5 * max(1, len(rates)), 4), squeeze=False)
    for ax, rate in zip(axes[0], rates, strict=False):
        pairs = [(r.name, lat) for r in results for lat in r.latency if lat.rate_per_s == rate]
        xs = np.arange(len(pairs))
        ax.bar(xs - 0.2, [lat.p50_ms for _, lat in pairs], 0.4, label="p50")
        ax.bar(xs + 0.2, [lat.p99_ms for _, lat in pairs], 0.4, label="p99")
        # The achieved send rate under each name: below the asked rate, queueing dominates the latency.
        ax.set_xticks(xs, [f"{name}\nsent {lat.achieved_rate_per_s:,.0f}/s" for name, lat in pairs])
        ax.set_yscale("log")
        ax.set_ylabel("ms (log scale)")
        ax.set_title(f"{rate} msgs/s asked")
        ax.legend()
    fig.suptitle(f"End-to-end latency, single synchronous sends of {LATENCY_SIZE_B} B")
    fig.tight_layout()
    paths.append(out_dir / "peers_latency.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
