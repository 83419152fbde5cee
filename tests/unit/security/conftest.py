"""Shared by the TLS tests: the test certificates (made once per run with openssl, certs.py) and in-process
brokers from tests/unit/conftest.py's ``broker_factory``."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# the cluster, replication and connector suites' helpers, reused as they are
sys.path.append(str(Path(__file__).parent.parent / "cluster"))
sys.path.append(str(Path(__file__).parent.parent / "ha"))
sys.path.append(str(Path(__file__).parent.parent / "connector"))

from certs import Pki, make_pki

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Spark's Python workers import the connector
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from streaming_jobs.common import spark_session

    conf = {"spark.default.parallelism": "2"}
    session = spark_session("sluice-tls-tests", shuffle_partitions=2, driver_memory="1g", conf=conf)
    yield session
    session.stop()


@pytest.fixture
def rotating_files(tmp_path: Path, pki: Pki) -> tuple[Path, Path]:
    """A certificate and key at paths of the test's own (a copy of the server's), to be replaced on disk."""
    cert, key = tmp_path / "server.pem", tmp_path / "server-key.pem"
    cert.write_bytes(pki.server_cert.read_bytes())
    key.write_bytes(pki.server_key.read_bytes())
    return cert, key
