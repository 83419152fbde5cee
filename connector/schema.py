"""The one row layout every Sluice read produces, as a Spark schema and the Arrow schema Spark checks batches against.

Column order and types are part of the contract (documented in docs/connector.md); the Arrow schema is derived from
the Spark one with Spark's own converter, so a batch built against ``ARROW_SCHEMA`` always passes Spark's schema
check.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("broker", StringType()),  # logical broker name, as in the offset keys
        StructField("queue_id", IntegerType()),
        StructField("queue_offset", LongType()),  # index in the consume queue
        StructField("commitlog_offset", LongType()),  # byte offset of the entry in the broker's commit log
        StructField("msg_id", StringType()),  # 32 hex: store IPv4 + port + commit log offset
        StructField("tags", StringType()),  # TAGS property, null when the message has none
        StructField("keys", ArrayType(StringType())),  # KEYS property split on spaces, [] when none
        StructField("body", BinaryType()),
        StructField("properties", MapType(StringType(), StringType())),  # null unless includeProperties=true
        StructField("born_timestamp", TimestampType()),  # producer clock
        StructField("store_timestamp", TimestampType()),  # broker clock at append
        StructField("reconsume_times", IntegerType()),
    ]
)

SCHEMA_DDL = (
    "topic string, broker string, queue_id int, queue_offset long, commitlog_offset long, msg_id string, "
    "tags string, keys array<string>, body binary, properties map<string,string>, born_timestamp timestamp, "
    "store_timestamp timestamp, reconsume_times int"
)

ARROW_SCHEMA: pa.Schema = to_arrow_schema(SCHEMA, timezone="UTC")
COLUMNS: tuple[str, ...] = tuple(SCHEMA.fieldNames())
assert len(COLUMNS) == 13 and len(ARROW_SCHEMA) == len(COLUMNS)
