"""The commit-log entry format, checked against an independent decoder written here from the seed's table."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import CorruptionError, MessageIllegalError
from broker.format.message import (
    BLANK_MAGIC,
    MESSAGE_MAGIC,
    decode_entry,
    decode_properties,
    encode_blank,
    encode_entry,
    encode_properties,
    java_string_hash,
    make_msg_id,
    parse_layout,
    parse_msg_id,
    quick_layout,
)


def independent_decode(raw: bytes) -> dict[str, object]:
    """Field by field, in the seed table's order, with explicit offsets (not message.ENTRY_HEADER)."""
    out: dict[str, object] = {}
    pos = 0

    def take(name: str, fmt: str) -> None:
        nonlocal pos
        (out[name],) = struct.unpack_from(">" + fmt, raw, pos)
        out[name + "@"] = pos
        pos += struct.calcsize(">" + fmt)

    for name, fmt in [
        ("TOTALSIZE", "i"), ("MAGICCODE", "i"), ("BODYCRC", "i"), ("QUEUEID", "i"), ("FLAG", "i"),
        ("QUEUEOFFSET", "q"), ("PHYSICALOFFSET", "q"), ("SYSFLAG", "i"), ("BORNTIMESTAMP", "q"),
        ("BORNHOST", "8s"), ("STORETIMESTAMP", "q"), ("STOREHOST", "8s"), ("RECONSUMETIMES", "i"),
        ("PREPAREDTRANSACTIONOFFSET", "q"), ("BODYLEN", "i"),
    ]:
        take(name, fmt)
    out["BODY"] = raw[pos : pos + out["BODYLEN"]]  # type: ignore[operator]
    pos += out["BODYLEN"]  # type: ignore[operator]
    take("TOPICLEN", "b")
    out["TOPIC"] = raw[pos : pos + out["TOPICLEN"]]  # type: ignore[operator]
    pos += out["TOPICLEN"]  # type: ignore[operator]
    take("PROPSLEN", "h")
    out["PROPS"] = raw[pos : pos + out["PROPSLEN"]]  # type: ignore[operator]
    out["END"] = pos + out["PROPSLEN"]  # type: ignore[operator]
    return out


def test_field_offsets_match_the_seed_table() -> None:
    raw = encode_entry(
        b"TopicA", 3, b"hello", encode_properties({"TAGS": "t1"}), flag=7, sys_flag=0, born_timestamp=111,
        born_ip=bytes([10, 0, 0, 1]), born_port=5555, reconsume_times=2, prepared_transaction_offset=99,
        queue_offset=42, physical_offset=4096, store_timestamp=222, store_ip=bytes([10, 0, 0, 2]), store_port=10911,
    )
    d = independent_decode(raw)
    expected_offsets = {
        "TOTALSIZE@": 0, "MAGICCODE@": 4, "BODYCRC@": 8, "QUEUEID@": 12, "FLAG@": 16, "QUEUEOFFSET@": 20,
        "PHYSICALOFFSET@": 28, "SYSFLAG@": 36, "BORNTIMESTAMP@": 40, "BORNHOST@": 48, "STORETIMESTAMP@": 56,
        "STOREHOST@": 64, "RECONSUMETIMES@": 72, "PREPAREDTRANSACTIONOFFSET@": 76, "BODYLEN@": 84,
    }
    for k, v in expected_offsets.items():
        assert d[k] == v, k
    assert d["TOTALSIZE"] == len(raw) == d["END"]
    assert d["MAGICCODE"] == MESSAGE_MAGIC == -626843481
    assert d["BODYCRC"] == zlib.crc32(b"hello") & 0x7FFFFFFF
    assert (d["QUEUEID"], d["FLAG"], d["QUEUEOFFSET"], d["PHYSICALOFFSET"]) == (3, 7, 42, 4096)
    assert d["BORNHOST"] == bytes([10, 0, 0, 1]) + struct.pack(">i", 5555)
    assert d["STOREHOST"] == bytes([10, 0, 0, 2]) + struct.pack(">i", 10911)
    assert (d["STORETIMESTAMP"], d["RECONSUMETIMES"], d["PREPAREDTRANSACTIONOFFSET"]) == (222, 2, 99)
    assert (d["BODY"], d["TOPIC"], d["PROPS"]) == (b"hello", b"TopicA", b"TAGS\x01t1\x02")


def test_blank_entry_uses_the_blank_magic() -> None:
    total, magic = struct.unpack(">ii", encode_blank(100))
    assert (total, magic) == (100, BLANK_MAGIC) and BLANK_MAGIC == -875286124


def test_java_string_hash_matches_known_values() -> None:
    # values computed by java.lang.String.hashCode
    assert java_string_hash("") == 0
    assert java_string_hash("TagA") == 2598919
    assert java_string_hash("hello world") == 1794106052
    assert java_string_hash("polygenelubricants") == -(1 << 31)
    assert java_string_hash("é") == 233


def test_msg_id_round_trip() -> None:
    mid = make_msg_id(bytes([192, 168, 1, 20]), 10911, 123456789)
    assert len(mid) == 32 and mid == mid.upper()
    parts = parse_msg_id(mid)
    assert (parts.store_ip, parts.store_port, parts.commitlog_offset) == (bytes([192, 168, 1, 20]), 10911, 123456789)


_names = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), min_size=1, max_size=8)


@settings(max_examples=80, deadline=None)
@given(
    topic=st.from_regex(r"[%|a-zA-Z0-9_-]{1,127}", fullmatch=True),
    queue_id=st.integers(0, 1000),
    body=st.binary(max_size=300),
    props=st.dictionaries(_names, _names, max_size=4),
    flag=st.integers(-(2**31), 2**31 - 1),
    born=st.integers(0, 2**62),
    qoff=st.integers(0, 2**62),
)
def test_encode_decode_round_trip(
    topic: str, queue_id: int, body: bytes, props: dict[str, str], flag: int, born: int, qoff: int
) -> None:
    raw = encode_entry(
        topic.encode(), queue_id, body, encode_properties(props), flag=flag, born_timestamp=born, queue_offset=qoff
    )
    msg = decode_entry(raw, verify_crc=True)
    assert (msg.topic, msg.queue_id, msg.body, msg.flag, msg.born_timestamp, msg.queue_offset) == (
        topic, queue_id, body, flag, born, qoff,
    )
    assert msg.properties == props == decode_properties(encode_properties(props))
    assert msg.store_size == len(raw)


@settings(max_examples=400, deadline=None)
@given(
    body=st.binary(max_size=200),
    topic=st.sampled_from([b"T", b"Topic_" * 21]),
    props=st.sampled_from([b"", encode_properties({"TAGS": "a", "KEYS": "k"})]),
    flips=st.lists(st.tuples(st.integers(0, 119), st.integers(1, 255)), max_size=2),
    cut=st.integers(0, 8),
)
def test_quick_layout_accepts_exactly_what_parse_layout_accepts(
    body: bytes, topic: bytes, props: bytes, flips: list[tuple[int, int]], cut: int
) -> None:
    """Property: the per-entry fast path agrees with the definition, field for field, on damaged framing (flips
    land in the header and the length fields) and on entries cut short."""
    raw = bytearray(encode_entry(topic, 1, body, props))
    for at, xor in flips:  # offsets past the header reach the topic / properties lengths of short bodies
        raw[at % len(raw)] ^= xor
    buf = bytes(raw[: len(raw) - cut])
    try:
        lay = parse_layout(buf, 0, len(buf))
    except CorruptionError:
        assert quick_layout(buf, 0, len(buf)) is None
        return
    assert quick_layout(buf, 0, len(buf)) == (tuple(lay.header), lay.topic_start, lay.topic_len, lay.props_len)


@pytest.mark.parametrize("props", [{"a\x01b": "v"}, {"ok": "1", "k": "v\x02w"}, {"x": "\x01\x02"}])
def test_a_separator_inside_a_property_is_refused_naming_it(props: dict[str, str]) -> None:
    bad = next(name for name, value in props.items() if {"\x01", "\x02"} & set(name + value))
    with pytest.raises(MessageIllegalError, match="reserves as separators") as e:
        encode_properties(props)
    assert repr(bad) in e.value.message
