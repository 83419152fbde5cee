"""Shared by the TLS tests: the test certificates (made once per run with openssl, tests/support/certs.py), a
SparkSession, and in-process brokers from tests/unit/conftest.py's ``broker_factory``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.certs import Pki, pki
from tests.support.spark import spark

__all__ = ["pki", "rotating_files", "spark"]


@pytest.fixture
def rotating_files(tmp_path: Path, pki: Pki) -> tuple[Path, Path]:
    """A certificate and key at paths of the test's own (a copy of the server's), to be replaced on disk."""
    cert, key = tmp_path / "server.pem", tmp_path / "server-key.pem"
    cert.write_bytes(pki.server_cert.read_bytes())
    key.write_bytes(pki.server_key.read_bytes())
    return cert, key
