"""The short soak in ``make test``: ``python -m tests.soak`` for half a minute of load with every kind of fault this
machine can inject, once each (``--each-kind``), then healed, drained and checked: every feature's promise holds.

``make soak`` is the same run for as long as asked (docs/soak.md holds an hour's report); this one proves that the
soak, every feature and every fault still work together, on every change.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]
SEED = 20261207  # a fixed seed: the same faults in the same order on every run (the timing under load varies)
MINUTES = 0.5
RUN_LIMIT_S = 540  # the faults, healing, drain and check take 2-3 minutes here; this is a hang


def test_every_feature_through_every_fault_once(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, "-m", "tests.soak", "--minutes", str(MINUTES), "--seed", str(SEED),
                           "--each-kind", "--out", str(out), "--root", str(tmp_path)],
                          cwd=str(REPO), capture_output=True, text=True, timeout=RUN_LIMIT_S)
    assert out.exists(), proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert "error" not in report, f"{report['error']}\n{proc.stderr[-4000:]}"
    broken = {name: f for name, f in report["features"].items() if f["violations"]}
    assert not broken, json.dumps(broken, indent=1)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert set(report["faults_injected"]) == set(report["fault_kinds"]), report["faults_injected"]
    if os.geteuid() == 0:  # as root the soak makes its tmpfs and network namespaces: nothing may be left out
        assert not report["fault_kinds_skipped"], report["fault_kinds_skipped"]
    unchecked = [name for name, f in report["features"].items() if not f["checked"] and not name.startswith("_")]
    assert not unchecked, f"features with nothing checked: {unchecked}"
    assert report["spark_job"]["driver_kills"] >= 1 and report["features"]["spark"]["output"] > 0
