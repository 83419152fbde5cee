"""The ``sluice`` Python data source: Spark's entry point, handing out batch and stream readers and writers."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from connector.batch_reader import SluiceBatchReader
from connector.connector_errors import SourceOptionError
from connector.options import parse_options
from connector.schema import SCHEMA, SCHEMA_DDL
from connector.sink_options import parse_sink_options
from connector.sink_writer import SluiceBatchWriter, SluiceStreamWriter
from connector.stream_reader import SluiceStreamReader


class SluiceDataSource(DataSource):
    """``spark.read(Stream).format("sluice")``; options are validated when the reader is created (query start)."""

    @classmethod
    def name(cls) -> str:
        return "sluice"

    def schema(self) -> StructType:
        # Spark asks for the schema in .load() (reads only; writes never call it): reject options that are wrong
        # for batch and stream reads alike right there. Mode-specific rules (e.g. endingOffsets) are checked when
        # the reader is created, at query start.
        try:
            parse_options(self.options, streaming=True)
        except SourceOptionError:
            parse_options(self.options, streaming=False)
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_schema(schema)
        return SluiceBatchReader(parse_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _check_schema(schema)
        return SluiceStreamReader(parse_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return SluiceBatchWriter(parse_sink_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return SluiceStreamWriter(parse_sink_options(self.options), schema)


def _check_schema(schema: StructType) -> None:
    if schema != SCHEMA:
        raise SourceOptionError(
            f"the sluice source has a fixed schema ({SCHEMA_DDL}); drop .schema(...) and select columns instead"
        )
