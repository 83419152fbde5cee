"""A local SparkSession for the security suites' connector tests, whose Python workers import the connector."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Spark's Python workers import the connector
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from streaming_jobs.common import spark_session

    conf = {"spark.default.parallelism": "2"}
    session = spark_session("sluice-tls-tests", shuffle_partitions=2, driver_memory="1g", conf=conf)
    yield session
    session.stop()
