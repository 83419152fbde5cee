"""A broker in its own process (``python -m broker broker``) with authentication on, its root user in a private
config file: what the secrets-at-rest and authentication-answer tests start, and how they start one that refuses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from broker.ha.local_group import SMALL_STORE
from broker.private_file import write_private
from broker.server.process import BrokerProcess

ROOT, ROOT_SECRET = "root", "root-secret-at-rest-0123"
# Plain text: these tests look at files and answers, not at TLS (tests/unit/security/test_tls_*.py do).
AUTH = {"auth_enabled": True, "allow_plaintext_auth": True, "auth_root_access_key": ROOT,
        "auth_root_secret_key": ROOT_SECRET, "store": SMALL_STORE}
REFUSED_START_TIMEOUT_S = 60.0  # imports and config checks of a broker that refuses before it binds its port


def write_config(path: Path, mode: int = 0o600, **settings: Any) -> Path:
    """A config file of ``AUTH`` and ``settings``, private from its first byte; then given ``mode``."""
    write_private(path, json.dumps({**AUTH, **settings}).encode())
    path.chmod(mode)
    return path


def start_secured(root: Path, **settings: Any) -> BrokerProcess:
    """A broker with auth on, its store in ``root / "store"``, its config in ``root / "broker.json"`` (0600)."""
    config = write_config(root / "broker.json", **settings)
    return BrokerProcess(root / "store", config=config, log_level="WARNING").start()


def refused_start(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m broker broker`` that is expected to refuse to start: its exit code and output."""
    argv = [sys.executable, "-m", "broker", "broker", "--store", str(store), "--listen", "127.0.0.1:0", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=REFUSED_START_TIMEOUT_S, check=False)
