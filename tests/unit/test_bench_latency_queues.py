"""bench.latency_queues runs end to end at a low rate: every message reaches the listener, and its table's JSON
holds each queue count's latency, the sender's lateness and each process's CPU share."""

from __future__ import annotations

import json
from pathlib import Path

from pytest import MonkeyPatch

from bench import latency_queues


def test_a_short_run_writes_every_figure(tmp_path: Path, monkeypatch: MonkeyPatch) -> None:
    out = tmp_path / "latency_queues.json"
    monkeypatch.setattr(latency_queues, "RESULTS", out)
    assert latency_queues.main(["--queues", "1,4", "--rate", "200", "--count", "700", "--rounds", "1"]) == 0
    report = json.loads(out.read_text())
    assert set(report["rows"]) == {"1", "4"} and report["date"]
    for row in report["rows"].values():
        assert 0 < row["p50_ms"]["median"] <= row["p99_ms"]["median"]
        assert row["sender_late_p99_ms"]["median"] >= 0 and row["achieved_rate_per_s"]["median"] > 100
        assert all(row[f"{p}_cpu_share"]["median"] > 0 for p in ("broker", "consumer", "sender"))
