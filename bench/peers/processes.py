"""Server subprocesses, free loopback ports and the Debian packages the peers are started from.

Apart because it knows nothing of messaging: it only starts, watches and stops programs."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from bench.peers.settings import SERVER_START_TIMEOUT_S


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_binary(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None
    )


def ensure_debian_package(binary: str, package: str) -> str:
    """Path of `binary`; installs Debian's `package` with apt-get first when it is missing."""
    path = find_binary(binary)
    if path:
        return path
    if os.geteuid() != 0:
        raise RuntimeError(f"{binary} is missing: install it with `sudo apt-get install {package}`")
    print(f"  installing {package} (apt-get)...", flush=True)
    subprocess.run(["apt-get", "update", "-qq"], check=False, capture_output=True)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", package],
        check=True, capture_output=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )
    path = find_binary(binary)
    if not path:
        raise RuntimeError(f"apt-get installed {package} but {binary} is still not found")
    return path


class Server:
    """A server subprocess with its output in a log file; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def wait_for(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while not ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start: {self.log_tail()}")
            time.sleep(0.05)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self) -> str:
        return self.log_text()[-2000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class ServerPeer:
    """A compared system that is one server subprocess (``start`` sets ``server``, ``stop`` stops it); each latency
    round it ran counts in ``latency_runs``, so that the next one takes a stream, key or topic of its own."""

    batches = True

    def __init__(self) -> None:
        self.server: Server | None = None
        self.latency_runs = 0

    def stop(self) -> None:
        if self.server:
            self.server.stop()


def start_server(
    name: str, program: str, workdir: Path, args: Callable[[Path, int], list[str]]
) -> tuple[Server, str, int]:
    """``program`` (installed from its Debian package of that name when missing) started with ``args(data, port)``:
    its data in ``workdir/name``, its log in ``workdir/name.log``, on a free loopback port. Returns once the port
    takes connections: the server, the program's path and the port."""
    binary = ensure_debian_package(program, program)
    port = free_port()
    data = workdir / name
    data.mkdir()
    server = Server([binary, *args(data, port)], workdir / f"{name}.log")
    server.wait_for(lambda: port_open(port), program)
    return server, binary, port


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False
