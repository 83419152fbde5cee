"""Shared fixtures for the connector tests: one local SparkSession and one broker subprocess per test session.

Spark's Python workers must be this interpreter (they import ``connector``), so PYSPARK_PYTHON is set before the
session starts. Parallelism is kept low (local[2], 2 shuffle partitions): the machine is shared.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import pytest

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

from streaming_jobs.common import spark_session
from tests.support.brokers import start_broker


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("connector-broker")
    proc = start_broker(root / "store")
    yield proc.endpoint
    assert proc.stop() == 0
    shutil.rmtree(root)  # the preallocated store: tmp_path_retention_policy only removes function-scoped dirs


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    conf = {"spark.default.parallelism": "2", "spark.sql.streaming.pollingDelay": "50ms"}
    session = spark_session("sluice-connector-tests", shuffle_partitions=2, driver_memory="1g", conf=conf)
    yield session
    session.stop()
