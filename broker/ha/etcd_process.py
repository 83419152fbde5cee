"""An etcd server in a child process, for tests and benchmarks of controller mode: its own data directory and
free loopback ports (or an address given, such as one inside a test's network namespace). When etcd is missing,
``scripts/ensure-etcd.sh`` installs Debian's etcd-server first (as the container suite installs Docker)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from collections import deque
from pathlib import Path
from threading import Thread

from broker.address import free_fixed_port
from broker.errors import ServiceNotAvailableError

START_TIMEOUT_S = 30.0
ENSURE_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ensure-etcd.sh"


def ensure_etcd() -> str:
    """The etcd binary, installed when missing (needs root and the Debian archive)."""
    found = shutil.which("etcd")
    if found:
        return found
    subprocess.run(["bash", str(ENSURE_SCRIPT)], check=True, timeout=600)
    found = shutil.which("etcd")
    if not found:
        raise ServiceNotAvailableError("etcd is not installed and scripts/ensure-etcd.sh could not install it")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    return free_fixed_port(host)  # replicas and etcd restart on the same ports


class EtcdProcess:
    def __init__(self, data_dir: Path, host: str = "127.0.0.1", prefix: list[str] | None = None) -> None:
        self.data_dir = data_dir
        self.host = host
        self.prefix = prefix or []  # e.g. ["ip", "netns", "exec", NAME]
        self.client_port = free_port() if not self.prefix else 2379
        self.peer_port = free_port() if not self.prefix else 2380
        self.proc: subprocess.Popen[bytes] | None = None
        self.output: deque[str] = deque(maxlen=100)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def url(self) -> str:
        return f"etcd://{self.endpoint}"

    def start(self) -> EtcdProcess:
        binary = ensure_etcd()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        client, peer = f"http://{self.host}:{self.client_port}", f"http://{self.host}:{self.peer_port}"
        args = [*self.prefix, binary, "--name", "sluice-test", "--data-dir", str(self.data_dir),
                "--listen-client-urls", client, "--advertise-client-urls", client, "--listen-peer-urls", peer,
                "--initial-advertise-peer-urls", peer, "--initial-cluster", f"sluice-test={peer}",
                "--log-level", "error"]  # fmt: skip
        env = {**os.environ, "ETCD_UNSUPPORTED_ARCH": os.environ.get("ETCD_UNSUPPORTED_ARCH", "")}
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if self.healthy():
                return self
            time.sleep(0.1)
        self.kill()
        raise ServiceNotAvailableError("etcd did not start; its output:\n" + "\n".join(self.output))

    def healthy(self) -> bool:
        if self.prefix:  # in another namespace: ask from there
            url = f"http://{self.endpoint}/health"
            probe = [*self.prefix, "python3", "-c", f"import urllib.request;urllib.request.urlopen('{url}', timeout=1)"]
            return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.output.append(line.decode("utf-8", "replace").rstrip())

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> EtcdProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
