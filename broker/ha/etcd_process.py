"""An etcd server in a child process, for tests and benchmarks of controller mode: its own data directory and
free loopback ports (or an address given, such as one inside a test's network namespace). When etcd is missing,
``scripts/ensure-etcd.sh`` installs Debian's etcd-server first (as the container suite installs Docker).

With ``tls`` it serves HTTPS only, with ``--client-cert-auth``: clients need a certificate from ``tls.ca``.
``enable_auth`` turns etcd's users on through the JSON gateway (Debian's etcd-server ships no etcdctl): a root user,
a user whose role may read and write one key prefix, then ``auth enable``."""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.request
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from threading import Thread
from typing import Any

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


@dataclass(frozen=True)
class EtcdTls:
    """etcd's server certificate and key, the CA its clients' certificates must come from, and a client
    certificate of that CA for this process's own calls (the health probe, enable_auth)."""

    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path


class EtcdProcess:
    def __init__(self, data_dir: Path, host: str = "127.0.0.1", prefix: list[str] | None = None,
                 tls: EtcdTls | None = None) -> None:
        self.data_dir = data_dir
        self.tls = tls
        self.host = host
        self.prefix = prefix or []  # e.g. ["ip", "netns", "exec", NAME]
        self.client_port = free_port(host) if not self.prefix else 2379
        self.peer_port = free_port(host) if not self.prefix else 2380
        self.proc: subprocess.Popen[bytes] | None = None
        self.output: deque[str] = deque(maxlen=100)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def url(self) -> str:
        return f"etcd://{self.endpoint}"

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def start(self) -> EtcdProcess:
        binary = ensure_etcd()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        client, peer = f"{self.scheme}://{self.host}:{self.client_port}", f"http://{self.host}:{self.peer_port}"
        args = [*self.prefix, binary, "--name", "sluice-test", "--data-dir", str(self.data_dir),
                "--listen-client-urls", client, "--advertise-client-urls", client, "--listen-peer-urls", peer,
                "--initial-advertise-peer-urls", peer, "--initial-cluster", f"sluice-test={peer}",
                "--log-level", "error"]
        if self.tls is not None:
            args += ["--cert-file", str(self.tls.cert), "--key-file", str(self.tls.key),
                     "--trusted-ca-file", str(self.tls.ca), "--client-cert-auth"]
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
            with urllib.request.urlopen(f"{self.scheme}://{self.endpoint}/health", timeout=1,
                                        context=self._ssl()) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def _ssl(self) -> ssl.SSLContext | None:
        if self.tls is None:
            return None
        context = ssl.create_default_context(cafile=str(self.tls.ca))
        context.load_cert_chain(str(self.tls.client_cert), str(self.tls.client_key))
        return context

    def post(self, path: str, body: dict[str, Any], token: str = "") -> dict[str, Any]:
        """One call of etcd's JSON gateway (``/v3`` + path); OSError (urllib's HTTPError) when refused."""
        request = urllib.request.Request(f"{self.scheme}://{self.endpoint}/v3{path}", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        if token:
            request.add_header("Authorization", token)
        with urllib.request.urlopen(request, timeout=5, context=self._ssl()) as r:
            answer: dict[str, Any] = json.loads(r.read())
            return answer

    def add_user(self, name: str, password: str, prefix: str = "") -> None:
        """A user (before enable_auth), with a role of its own that may read and write keys under ``prefix`` ("":
        no rights at all)."""
        self.post("/auth/user/add", {"name": name, "password": password})
        if prefix:
            end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
            self.post("/auth/role/add", {"name": name})
            self.post("/auth/role/grant", {"name": name, "perm": {"key": _b64(prefix), "range_end": _b64(end),
                                                                  "permType": "READWRITE"}})
            self.post("/auth/user/grant", {"user": name, "role": name})

    def enable_auth(self, root_password: str) -> None:
        """etcd's users on: a root user (etcd refuses ``auth enable`` without one holding the root role), then
        every call needs a user's token."""
        self.post("/auth/user/add", {"name": "root", "password": root_password})
        self.post("/auth/role/add", {"name": "root"})
        self.post("/auth/user/grant", {"user": "root", "role": "root"})
        self.post("/auth/enable", {})

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


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode("ascii")
