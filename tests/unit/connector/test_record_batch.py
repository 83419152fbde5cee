"""The vectorised decoder against the store's own entry decoder, on real entries made with encode_entry."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import CorruptionError
from broker.format.message import POS_PHYSICAL_OFFSET, POS_STORE_HOST, encode_entry, encode_properties, iter_entries
from connector.record_batch import RowFilter, _msg_ids, decode_entries
from connector.schema import ARROW_SCHEMA

TOPIC = "orders"
ALL = RowFilter(0, 1 << 62)


def make_buffer(props: list[dict[str, str] | bytes], first_offset: int = 0, seed: int = 1) -> tuple[bytes, list[int]]:
    rng = random.Random(seed)
    parts, positions, at, phys = [], [], 0, 4096
    for i, p in enumerate(props):
        raw_props = p if isinstance(p, bytes) else encode_properties(p)
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))
        entry = encode_entry(
            TOPIC.encode(), 5, body, raw_props, queue_offset=first_offset + i, physical_offset=phys,
            born_timestamp=1_600_000_000_000 + i, store_timestamp=1_700_000_000_000 + i, store_ip=b"\x0a\x01\x02\x03",
            store_port=10911, reconsume_times=i % 4,
        )
        positions.append(at)
        parts.append(entry)
        at += len(entry)
        phys += len(entry) + 17  # other queues' entries lie between
    return b"".join(parts), positions


def decode(buf: bytes, pos: list[int], include: bool = True, row_filter: RowFilter = ALL) -> pa.RecordBatch:
    return decode_entries(buf, pos, topic=TOPIC, broker="broker-a", include_properties=include, row_filter=row_filter)


def assert_rows_match(batch: pa.RecordBatch, buf: bytes, include: bool = True) -> None:
    assert batch.schema.equals(ARROW_SCHEMA)
    rows = batch.to_pylist()
    expected = list(iter_entries(buf))
    assert len(rows) == len(expected)
    for row, m in zip(rows, expected, strict=True):
        assert row["topic"] == m.topic and row["broker"] == "broker-a"
        assert (row["queue_id"], row["queue_offset"], row["commitlog_offset"]) == (
            m.queue_id, m.queue_offset, m.commitlog_offset,
        )
        assert row["msg_id"] == m.msg_id
        assert row["body"] == m.body
        assert row["tags"] == m.tags
        assert row["keys"] == m.keys
        assert row["properties"] == (list(m.properties.items()) if include else None)
        assert int(row["born_timestamp"].timestamp() * 1000) == m.born_timestamp
        assert int(row["store_timestamp"].timestamp() * 1000) == m.store_timestamp
        assert row["reconsume_times"] == m.reconsume_times


def test_every_column_equals_the_store_decoder() -> None:
    props: list[dict[str, str] | bytes] = [
        {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "U1"},
        {},
        {"KEYS": "only"},
        {"TAGS": "B", "custom": "héllo wörld", "empty": ""},
        {"KEYS": "  spaced   keys "},
        b"a\x01x\x01y\x02",  # a value holding the name/value separator: the first \x01 splits, as str.partition
    ]
    buf, pos = make_buffer(props * 50)
    for include in (True, False):
        assert_rows_match(decode(buf, pos, include), buf, include)


def test_no_properties_at_all() -> None:
    buf, pos = make_buffer([{}] * 10)
    batch = decode(buf, pos)
    assert batch.column("tags").null_count == 10
    assert batch.column("keys").to_pylist() == [[]] * 10
    assert_rows_match(batch, buf)


def test_properties_that_are_not_utf8_fall_back_to_replacement_decoding() -> None:
    bad = b"TAGS\x01A\x02bin\x01\xff\xfe\x02"
    buf, pos = make_buffer([{"TAGS": "x"}, bad, {}])
    assert_rows_match(decode(buf, pos), buf)


def test_properties_without_trailing_separator_fall_back() -> None:
    buf, pos = make_buffer([b"TAGS\x01A\x02KEYS\x01k", {"TAGS": "B"}])
    rows = decode(buf, pos).to_pylist()
    assert rows[0]["tags"] == "A" and rows[0]["keys"] == ["k"] and rows[1]["tags"] == "B"


def test_row_filter_keeps_the_offset_range_and_exact_tags() -> None:
    # "Aa" and "BB" have the same Java hash code: the broker's filter lets both through, the exact check must not.
    props: list[dict[str, str] | bytes] = [{"TAGS": t} for t in ["Aa", "BB", "C", "Aa"]]
    props.append({})
    buf, pos = make_buffer(props, first_offset=100)
    batch = decode(buf, pos, row_filter=RowFilter(101, 104, frozenset({"Aa", "C"})))
    assert batch.column("queue_offset").to_pylist() == [102, 103]
    assert batch.column("tags").to_pylist() == ["C", "Aa"]


def test_empty_response_gives_an_empty_batch() -> None:
    batch = decode(b"", [])
    assert batch.num_rows == 0 and batch.schema.equals(ARROW_SCHEMA)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[:4] + b"\x00\x00\x00\x00" + b[8:], "bad magic"),
        (lambda b: b[:-3], "runs past the end"),
        (lambda b: b[:84] + (10_000).to_bytes(4, "big") + b[88:], "does not fit"),
    ],
)
def test_corrupt_entries_are_reported_with_their_position(damage: Callable[[bytes], bytes], message: str) -> None:
    buf, pos = make_buffer([{"TAGS": "A"}] * 3)
    last = pos[-1]
    damaged = buf[:last] + damage(buf[last:])
    with pytest.raises(CorruptionError, match=message):
        decode(damaged, pos)


def test_topic_length_mismatch_is_corruption() -> None:
    buf, pos = make_buffer([{}])
    with pytest.raises(CorruptionError, match="topic length"):
        decode_entries(buf, pos, topic="other-topic", broker="b", include_properties=False, row_filter=ALL)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=88, max_size=88), min_size=1, max_size=64))
def test_message_ids_are_the_store_host_and_offset_bytes_in_upper_case_hexadecimal(headers: list[bytes]) -> None:
    """Every byte value of the store host, port and commit-log offset: the same text as ``bytes.hex().upper()``,
    which is how ``make_msg_id`` writes a non-negative offset (the test above holds them together on real entries)."""
    block = np.frombuffer(b"".join(headers), np.uint8).reshape(-1, 88)
    host, offset = slice(POS_STORE_HOST, POS_STORE_HOST + 8), slice(POS_PHYSICAL_OFFSET, POS_PHYSICAL_OFFSET + 8)
    expected = [(h[host] + h[offset]).hex().upper() for h in headers]
    assert _msg_ids(block).to_pylist() == expected
