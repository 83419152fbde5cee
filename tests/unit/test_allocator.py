"""The malloc settings of the standalone broker and of producers that ask for them (broker/allocator.py) are
accepted by this machine's glibc.

Their effect (fewer page faults per large SendBatch) is measured by bench/server.py and bench/peers.py, not
asserted here: a small test process does not reproduce the broker's allocation pattern.
"""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_mallopt_accepts_every_setting() -> None:
    # In a child process: the settings are process-wide and this test process should keep glibc's defaults.
    code = "from broker.client import tune_malloc; raise SystemExit(0 if tune_malloc() else 3)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
