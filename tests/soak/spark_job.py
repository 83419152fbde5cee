"""The soak's Spark job: ``streaming_jobs.topic_mirror`` copying SPARK_IN into SPARK_OUT through the exactly-once
sink, a driver in a child process as users run it, found through the name server (``--namesrv``) so that it
follows broker-a's master when it moves.

SPARK_IN lives on broker-a and broker-b (the source reads through failovers and a broker restart), SPARK_OUT on
broker-a (the sink's transactions ride out failovers). The job is kept running as a supervisor would: a driver
that exits is started again from its checkpoint, and each exit is counted with the reason it gave; the
``spark-driver-kill`` fault SIGKILLs it in the middle of its micro-batches. The checker holds SPARK_OUT against
SPARK_IN at the end: every input message once, nothing else.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path

log = logging.getLogger(__name__)

SPARK_IN, SPARK_OUT = "SoakSparkIn", "SoakSparkOut"
GROUP = "soak-spark"
INTERVAL = "1 second"  # a micro-batch a second: the driver shares 2 cores with five brokers and the clients
MAX_PER_TRIGGER = 2000  # bounded batches: a driver killed mid-batch redoes at most this much
WATCH_S = 1.0  # how often the supervisor looks at the driver
STOP_S = 60.0  # a driver asked to stop (SIGINT) that has not within this is killed
OUTPUT_LINES = 400  # of the driver's log kept for the report
REASON_CHARS = 300
REPO = Path(__file__).resolve().parents[2]


def _reason(lines: list[str]) -> str:
    """The last line of the driver's output that names an exception (the query's error), else its last line."""
    named = [ln.strip() for ln in lines if re.search(r"[\w.]+(Error|Exception)\b", ln)]
    return (named[-1] if named else (lines[-1].strip() if lines else "no output"))[:REASON_CHARS]


class SparkJob:
    def __init__(self, namesrv: str, root: Path) -> None:
        self.namesrv, self.root = namesrv, root
        self.output: deque[str] = deque(maxlen=OUTPUT_LINES)
        self.proc: subprocess.Popen[str] | None = None
        self.starts = 0
        self.kills = 0  # by the fault
        self.exits: list[str] = []  # exits not asked for: the reason each gave
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="soak-spark-watch", daemon=True)

    def _args(self) -> list[str]:
        return [sys.executable, "-m", "streaming_jobs.topic_mirror", "--namesrv", self.namesrv,
                "--source", SPARK_IN, "--target", SPARK_OUT, "--group", GROUP, "--starting-offsets", "earliest",
                "--checkpoint", str(self.root / "spark-checkpoint"), "--interval", INTERVAL,
                "--max-messages-per-trigger", str(MAX_PER_TRIGGER)]

    def _spawn(self) -> None:
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(self._args(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                cwd=str(REPO), env=env, start_new_session=True)
        threading.Thread(target=self._drain, args=(proc,), name="soak-spark-output", daemon=True).start()
        self.proc = proc
        self.starts += 1

    def _drain(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.output.append(line.rstrip())

    def start(self) -> SparkJob:
        with self._lock:
            self._spawn()
        self._watcher.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_S):
            with self._lock:
                if self._stop.is_set() or self.proc is None or self.proc.poll() is None:
                    continue
                reason = f"exit {self.proc.returncode}: {_reason(list(self.output)[-60:])}"
                self.exits.append(reason)
                log.warning("the Spark driver ended (%s); started again from its checkpoint", reason)
                self._spawn()

    def kill(self) -> int:
        """SIGKILL the driver (and its Python workers); the supervisor starts it again. Its pid."""
        with self._lock:
            assert self.proc is not None
            pid = self.proc.pid
            os.killpg(pid, signal.SIGKILL)  # the whole session: the JVM and its Python workers too
            self.proc.wait()
            self.kills += 1
            self._spawn()
        return pid

    def stop(self) -> None:
        """Ctrl-C to the driver (the job stops its query and says how far it got), then SIGKILL if it lingers."""
        self._stop.set()
        with self._lock:
            proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def report(self) -> dict[str, object]:
        return {"driver_starts": self.starts, "driver_kills": self.kills, "driver_exits": len(self.exits),
                "exit_reasons": self.exits[:10]}
