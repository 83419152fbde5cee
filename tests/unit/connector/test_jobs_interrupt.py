"""Ctrl-C stops a streaming job (its own driver, as users run it): a summary, exit 130, no traceback, and the next
run with the same checkpoint goes on exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from connector_helpers import new_topic, read_queues

from broker.client import Message, Producer

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1200)]
MESSAGES = 3000


def job(*args: str) -> list[str]:
    return [sys.executable, "-m", "streaming_jobs.topic_mirror", *args]


def stored(endpoint: str, topic: str) -> list[bytes]:
    """The bodies a reader sees (a Spark driver and its workers share the machine: generous client timeouts)."""
    return [m.body for msgs in read_queues(endpoint, topic, timeout_s=120).values() for m in msgs]


def test_ctrl_c_stops_a_continuous_job_and_the_next_run_goes_on(broker: str, tmp_path: Path) -> None:
    """Ctrl-C printed Spark's and py4j's tracebacks and left the exit status to chance."""
    source, target = new_topic(broker, 2), new_topic(broker, 2)
    with Producer(broker) as p:
        p.send_batch([Message(source, b"%d" % i) for i in range(MESSAGES)])
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    args = ("--endpoints", broker, "--source", source, "--target", target, "--checkpoint", str(tmp_path / "chk"),
            "--max-messages-per-trigger", "500", "--starting-offsets", "earliest")
    proc = subprocess.Popen(job(*args, "--trigger", "continuous", "--interval", "1 second"), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while not stored(broker, target):  # a first micro-batch is in the target
            assert proc.poll() is None and time.monotonic() < deadline, "the job ended or made no progress"
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in err, err[-5000:]
    assert proc.returncode == 130, (proc.returncode, err[-5000:])
    # "after micro-batch N", or "before its first micro-batch finished" when the signal came between the sink's
    # commit (rows in the target) and Spark recording the batch's progress: a window a busy machine widens
    assert "interrupted: query stopped " in err and "same --checkpoint" in err, err[-3000:]
    again = subprocess.run(job(*args, "--trigger", "available-now"), env=env, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr[-5000:]
    # every message once: none lost, none written twice
    assert sorted(stored(broker, target)) == sorted(b"%d" % i for i in range(MESSAGES))
