"""A broker in a child process (``python -m broker broker ...``), for crash tests, benchmarks and demos.

The child prints one line containing ``ready`` and its bound address once it accepts requests; ``start`` waits
for that line and parses the address, so ``--listen 127.0.0.1:0`` works. The name server's process
(broker/namesrv/local_cluster.py) is started, watched and stopped the same way (ServiceProcess).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO, Self

from broker.address import local_endpoint
from broker.errors import ServiceNotAvailableError

READY_PATTERN = re.compile(r"ready on (\S+):(\d+)")
METRICS_PATTERN = re.compile(r"metrics on port (\d+)")  # in the ready line when --metrics-port is given
REMOTING_PATTERN = re.compile(r"remoting on (\S+):(\d+)")  # in the ready line when --remoting-listen is given
START_TIMEOUT_S = 60.0


class ServiceProcess:
    """A Sluice service in a child process (``args``, an unbuffered Python): ``start`` returns once it printed its
    ``ready on HOST:PORT`` line, which ``_ready`` reads its addresses from; the last lines of its stderr are kept
    in ``output`` for failure messages. ``what`` names it in them."""

    what = "service"
    keeps_stdout = False  # whether what it prints after the ready line goes to ``output`` too

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.proc: subprocess.Popen[str] | None = None
        self.output: deque[str] = deque(maxlen=200)  # last lines of the child's stderr, for failure messages

    def _ready(self, line: str, match: re.Match[str]) -> None:
        """Take the service's addresses from its ready line (``match``: READY_PATTERN's)."""

    def start(self, timeout_s: float = START_TIMEOUT_S) -> Self:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        threading.Thread(target=self._drain, args=(self.proc.stderr, self.output), daemon=True).start()
        deadline = time.monotonic() + timeout_s
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            match = READY_PATTERN.search(line)
            if match:
                self._ready(line, match)
                keep = self.output if self.keeps_stdout else None
                threading.Thread(target=self._drain, args=(self.proc.stdout, keep), daemon=True).start()
                return self
            if time.monotonic() > deadline:
                break
        self.proc.kill()
        self.proc.wait()
        raise ServiceNotAvailableError(
            f"{self.what} did not become ready (exit {self.proc.returncode}); stderr tail:\n" + "\n".join(self.output)
        )

    @staticmethod
    def _drain(stream: IO[str], keep: deque[str] | None) -> None:
        for line in stream:
            if keep is not None:
                keep.append(line.rstrip())

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait: the service's clean shutdown. Returns the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL: no shutdown at all, as a crash."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.running:
            self.kill()


class BrokerProcess(ServiceProcess):
    what = "broker process"

    def __init__(
        self, store: str | Path, *, listen: str = "127.0.0.1:0", flush: str = "async", config: str | Path | None = None,
        metrics_port: int | None = None, log_level: str = "WARNING", extra_args: list[str] | None = None,
    ) -> None:
        args = [sys.executable, "-m", "broker", "--log-level", log_level, "broker", "--store", str(store),
                "--listen", listen, "--flush", flush]
        if config is not None:
            args += ["--config", str(config)]
        if metrics_port is not None:
            args += ["--metrics-port", str(metrics_port)]
        super().__init__(args + (extra_args or []))
        self.endpoint = ""
        self.port = 0
        self.metrics_port: int | None = None  # the bound metrics port (``--metrics-port 0`` picks one)
        self.remoting_endpoint = ""  # HOST:PORT of the remoting port (``--remoting-listen``), "" when none

    def _ready(self, line: str, match: re.Match[str]) -> None:
        self.port = int(match.group(2))
        self.endpoint = local_endpoint(match.group(1).strip("[]"), self.port)
        metrics = METRICS_PATTERN.search(line)
        self.metrics_port = int(metrics.group(1)) if metrics else None
        remoting = REMOTING_PATTERN.search(line)
        if remoting:
            self.remoting_endpoint = local_endpoint(remoting.group(1).strip("[]"), int(remoting.group(2)))
