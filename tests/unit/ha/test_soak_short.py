"""The soak in short (tests/soak; ``make soak`` runs it for minutes to hours): every producer and consumer kind at
once on a replicated group under controller mode and two more brokers, through a master SIGKILL and a pop consumer
killed with messages in flight, then every promise checked. One minute of load on a fixed seed; the run, the heal and
the drain take some two minutes on a busy 2-core machine, which is why this one test is long: it is the only one that
runs every feature together through faults."""

from __future__ import annotations

import json
from pathlib import Path

from tests.soak.faults import KILL_CLIENT, KILL_MASTER
from tests.soak.run import run

SEED = 3  # its schedule starts with a master SIGKILL, then a client kill
MINUTES = 1.0
FEATURES = ("plain", "push_clustering", "push_broadcasting", "batch", "pop", "delay", "timer", "pull", "txn", "ordered",
            "orderly")  # fmt: skip


def test_short_soak_keeps_every_promise(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    report = run(MINUTES, SEED, tmp_path / "run", out, only=(KILL_MASTER, KILL_CLIENT), min_faults=2)
    assert json.loads(out.read_text())["seed"] == SEED
    assert sum(report["faults_injected"].values()) >= 2, report["schedule"]
    features = report["features"]
    bad = {name: f for name, f in features.items() if f["violations"]}
    assert not bad, json.dumps(bad, indent=1)
    for name in FEATURES:
        assert features[name]["checked"] > 0, (name, features[name])
    assert features["_drain"]["drained"], "the consumers did not catch up (the checker would report them as lost)"
