"""The sink's row encoder: chunks within the broker's limits, properties as the rows give them, queues spread."""

from __future__ import annotations

import re
from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import MessageIllegalError
from broker.format.message import iter_entries
from connector.arrow_encoder import RowEncoder


def _batch(rows: list[tuple[bytes, str | None, str | None, dict[str, str], int | None]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "body": [r[0] for r in rows],
            "topic": [r[1] for r in rows],
            "tags": [r[2] for r in rows],
            "properties": pa.array([list(r[3].items()) for r in rows], pa.map_(pa.string(), pa.string())),
            "queue_id": pa.array([r[4] for r in rows], pa.int32()),
        }
    )


def test_rows_without_their_own_properties_share_one_encoding() -> None:
    """A row with no properties, tags or keys of its own takes the path that builds no properties: the same entries
    as rows that take the per-row path (forced here: rows with a property of their own whose properties then
    come out empty)."""
    bodies = [b"a", b"b", b"c", b"d", b"e"]
    fast_enc = RowEncoder(default_topic="Out", queue_count=lambda t: 4, round_robin=0)
    slow_enc = RowEncoder(default_topic="Out", queue_count=lambda t: 4, round_robin=0)
    slow_enc._properties = lambda *a: {}  # type: ignore[method-assign]
    with mock.patch("connector.arrow_encoder.time.time", return_value=1_700_000_000.0):
        fast = b"".join(c.buffer for c in fast_enc.encode(pa.RecordBatch.from_pydict({"body": bodies})))
        slow = b"".join(c.buffer for c in slow_enc.encode(_batch([(b, None, None, {"x": "1"}, None) for b in bodies])))
    assert fast == slow


@given(
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=60),
    batch_bytes=st.integers(1024, 20_000),
    batch_messages=st.integers(1, 40),
)
@settings(max_examples=60, deadline=None)
def test_chunks_never_pass_batch_bytes(sizes: list[int], batch_bytes: int, batch_messages: int) -> None:
    """One SendBatch is stored whole and the broker refuses one over its limit: a chunk stays within
    ``batch_bytes`` (a single entry bigger than that goes alone) and ``batch_messages``, and every row is in one."""
    enc = RowEncoder(default_topic="Out", queue_count=lambda t: 2, batch_bytes=batch_bytes,
                     batch_messages=batch_messages)
    chunks = list(enc.encode(pa.RecordBatch.from_pydict({"body": [b"x" * n for n in sizes]})))
    assert sum(c.count for c in chunks) == len(sizes)
    assert all(c.count <= batch_messages for c in chunks)
    assert all(len(c.buffer) <= batch_bytes or c.count == 1 for c in chunks)


def test_default_chunks_fit_the_default_broker_batch_limit() -> None:
    """Rows of 1 KiB with the sink's defaults: each chunk fits the broker's 4 MiB batch limit."""
    from broker.store.store_config import StoreConfig
    from connector.sink_options import DEFAULT_BATCH_BYTES, DEFAULT_BATCH_MESSAGES

    enc = RowEncoder(default_topic="Out", queue_count=lambda t: 8, batch_bytes=DEFAULT_BATCH_BYTES,
                     batch_messages=DEFAULT_BATCH_MESSAGES)
    chunks = list(enc.encode(pa.RecordBatch.from_pydict({"body": [b"y" * 1024] * 10_000})))
    limit = StoreConfig(store_path="unused").batch_limit_bytes
    assert len(chunks) >= 3 and all(len(c.buffer) <= limit for c in chunks)


def test_sink_columns_of_the_wrong_type_are_refused_at_query_start() -> None:
    """A long sharding_key, a string queue_id or an integer body failed every task with a bare TypeError."""
    from pyspark.sql.types import ArrayType, BinaryType, IntegerType, LongType, MapType, StringType, StructField
    from pyspark.sql.types import StructType as T

    from broker.errors import MessageIllegalError
    from connector.sink_writer import check_column_types

    good = [StructField("body", BinaryType()), StructField("keys", ArrayType(StringType())),
            StructField("properties", MapType(StringType(), StringType())), StructField("queue_id", LongType()),
            StructField("sharding_key", StringType()), StructField("other", IntegerType())]
    check_column_types(T(good))
    check_column_types(T([StructField("body", StringType()), StructField("keys", StringType())]))
    wrong = [
        (StructField("sharding_key", LongType()), "col('sharding_key').cast('string')"),
        (StructField("queue_id", StringType()), "an integer type"),
        (StructField("body", IntegerType()), "binary or string"),
        (StructField("properties", MapType(StringType(), IntegerType())), "map<string,string>"),
    ]
    for field, needle in wrong:
        with pytest.raises(MessageIllegalError, match=re.escape(needle)) as err:
            check_column_types(T([StructField("body", BinaryType()), field]))
        assert repr(field.name) in err.value.message


def _decoded_properties(encoder: RowEncoder, batch: pa.RecordBatch) -> list[dict[str, str]]:
    return [m.properties for c in encoder.encode(batch) for m in iter_entries(c.buffer)]


def test_a_rows_own_properties_are_kept_as_given() -> None:
    """A row copied from a topic an exactly-once write filled may carry TRAN_ATTEMPT or TRAN_COORDINATOR: they
    stay as they are, since the writer's attempt and coordinator travel in its calls, not in its rows."""
    batch = _batch([(b"a", None, "t", {"TRAN_ATTEMPT": "12", "TRAN_COORDINATOR": "b", "x": "1"}, None)])
    [props] = _decoded_properties(RowEncoder(default_topic="Out", queue_count=lambda t: 4), batch)
    assert props == {"TRAN_ATTEMPT": "12", "TRAN_COORDINATOR": "b", "x": "1", "TAGS": "t"}


def test_a_key_with_a_space_is_refused_with_its_row_number() -> None:
    """KEYS is one space-separated property: keys=['order 1', 'b'] came back as ['order', '1', 'b']."""
    enc = RowEncoder(default_topic="Out", queue_count=lambda t: 4)
    keys = pa.array([["a", "b"], ["order 1", "b"]], pa.list_(pa.string()))
    batch = pa.RecordBatch.from_pydict({"body": [b"x", b"y"], "keys": keys})
    with pytest.raises(MessageIllegalError, match=r"row 1: key 'order 1' contains a space"):
        list(enc.encode(batch))
    [props] = _decoded_properties(enc, pa.RecordBatch.from_pydict({"body": [b"x"], "keys": keys[:1]}))
    assert props["KEYS"] == "a b"


def test_rows_without_a_queue_go_round_robin_from_a_random_queue() -> None:
    """Every encoder began at queue 1: a query of many small tasks put their first rows in the same queues."""
    firsts = set()
    for _ in range(24):
        enc = RowEncoder(default_topic="Out", queue_count=lambda t: 8)
        (chunk,) = enc.encode(pa.RecordBatch.from_pydict({"body": [b"a", b"b", b"c"]}))
        qids = [m.queue_id for m in iter_entries(chunk.buffer)]
        assert qids == [(qids[0] + i) % 8 for i in range(3)]  # consecutive queues
        firsts.add(qids[0])
    assert len(firsts) > 1, firsts  # 24 encoders on one start queue: probability 8**-23
