"""Sluice's PySpark connector: ``spark.readStream.format("sluice")`` and ``spark.read.format("sluice")``.

from connector import register
register(spark)
df = spark.readStream.format("sluice").option("endpoints", "127.0.0.1:10911").option("topic", "orders").load()

A cluster's brokers are found through its name servers: ``.option("namesrv", "10.0.0.1:9876,10.0.0.2:9876")`` in
place of ``endpoints``, for the source and the sink alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from connector.data_source import SluiceDataSource
from connector.schema import SCHEMA, SCHEMA_DDL

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SCHEMA", "SCHEMA_DDL", "SluiceDataSource", "register"]


def register(spark: SparkSession) -> None:
    """Make ``format("sluice")`` available in ``spark`` (executors must run a Python that can import ``connector``)."""
    spark.dataSource.register(SluiceDataSource)
