"""A broker in a child process (``python -m broker broker ...``), for crash tests, benchmarks and demos.

The child prints one line containing ``ready`` and its bound address once it accepts requests; ``start`` waits
for that line and parses the address, so ``--listen 127.0.0.1:0`` works.
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

from broker.address import local_endpoint
from broker.errors import ServiceNotAvailableError

READY_PATTERN = re.compile(r"ready on (\S+):(\d+)")
METRICS_PATTERN = re.compile(r"metrics on port (\d+)")  # in the ready line when --metrics-port is given
REMOTING_PATTERN = re.compile(r"remoting on (\S+):(\d+)")  # in the ready line when --remoting-listen is given
START_TIMEOUT_S = 60.0


class BrokerProcess:
    def __init__(
        self, store: str | Path, *, listen: str = "127.0.0.1:0", flush: str = "async", config: str | Path | None = None,
        metrics_port: int | None = None, log_level: str = "WARNING", extra_args: list[str] | None = None,
    ) -> None:
        self.args = [sys.executable, "-m", "broker", "--log-level", log_level, "broker", "--store", str(store),
                     "--listen", listen, "--flush", flush]
        if config is not None:
            self.args += ["--config", str(config)]
        if metrics_port is not None:
            self.args += ["--metrics-port", str(metrics_port)]
        self.args += extra_args or []
        self.proc: subprocess.Popen[str] | None = None
        self.endpoint = ""
        self.port = 0
        self.metrics_port: int | None = None  # the bound metrics port (``--metrics-port 0`` picks one)
        self.remoting_endpoint = ""  # HOST:PORT of the remoting port (``--remoting-listen``), "" when none
        self.output: deque[str] = deque(maxlen=200)  # last lines of the child's stderr, for failure messages

    def start(self, timeout_s: float = START_TIMEOUT_S) -> BrokerProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            match = READY_PATTERN.search(line)
            if match:
                self.port = int(match.group(2))
                self.endpoint = local_endpoint(match.group(1).strip("[]"), self.port)
                metrics = METRICS_PATTERN.search(line)
                self.metrics_port = int(metrics.group(1)) if metrics else None
                remoting = REMOTING_PATTERN.search(line)
                if remoting:
                    self.remoting_endpoint = local_endpoint(remoting.group(1).strip("[]"), int(remoting.group(2)))
                threading.Thread(target=self._drain_stdout, daemon=True).start()
                return self
            if time.monotonic() > deadline:
                break
        self.proc.kill()
        self.proc.wait()
        raise ServiceNotAvailableError(
            f"broker process did not become ready (exit {self.proc.returncode}); stderr tail:\n"
            + "\n".join(self.output)
        )

    def _drain_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for _ in self.proc.stdout:
            pass

    def _drain_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.output.append(line.rstrip())

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait: the broker's clean shutdown. Returns the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL: no shutdown at all, as a crash."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()
