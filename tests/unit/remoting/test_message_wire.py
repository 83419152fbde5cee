"""RocketMQ 4's message wire format: properties, stored entries, offset ids, batch bodies and compressed bodies,
against bytes written out by hand from the layout (not only round trips), then seeded random round trips."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import MessageIllegalError
from broker.format.compression import COMPRESSED, compressed_body, inflated_body
from broker.format.message import ENTRY_HEADER, StoredMessage, decode_entry, encode_entry, encode_properties
from broker.remoting.message_batch import BatchItem, decode_batch, encode_batch, sluice_batch
from broker.remoting.message_entry import (
    decode_stored,
    encode_stored,
    iter_stored,
    offset_msg_id,
    parse_offset_msg_id,
)
from broker.remoting.message_properties import format_properties, parse_properties

# ------------------------------------------------------------------------------------------------ properties


def test_properties_are_read_as_rocketmq_reads_them() -> None:
    java = "TAGS\x01TagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01AC11000100002A9F0000000000000001"  # no trailing \x02
    go = java + "\x02"
    expected = {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "AC11000100002A9F0000000000000001"}
    assert parse_properties(java) == parse_properties(go) == expected
    # dropped: an empty name, an empty value, an item without \x01, a value holding another \x01
    assert parse_properties("\x01v\x02a\x01\x02plain\x02b\x01x\x01y\x02c\x01ok") == {"c": "ok"}
    assert parse_properties("a\x011\x02a\x012") == {"a": "2"}  # a name twice: the last value (HashMap.put)
    assert parse_properties("") == parse_properties(None) == parse_properties("\x02\x02") == {}


def test_properties_are_written_in_sluice_canonical_form() -> None:
    text = format_properties({"TAGS": "A", "KEYS": "k1 k2"})
    assert text.encode() == b"TAGS\x01A\x02KEYS\x01k1 k2\x02"
    assert text.encode() == encode_properties({"TAGS": "A", "KEYS": "k1 k2"})  # one encoding, Sluice's
    assert format_properties({}) == ""


# ------------------------------------------------------------------------------------------------ stored entries


def _message(**changes: object) -> StoredMessage:
    m = StoredMessage(
        topic="T", queue_id=3, queue_offset=5, commitlog_offset=0x100, body=b"hi", properties={"A": "1"}, flag=7,
        sys_flag=0, born_timestamp=1000, born_host="10.0.0.1:1234", store_timestamp=2000,
        store_host="10.0.0.2:10911", reconsume_times=1, prepared_transaction_offset=0,
    )
    for k, v in changes.items():
        setattr(m, k, v)
    return m


def test_stored_entry_bytes_by_hand_ipv4() -> None:
    body_crc = zlib.crc32(b"hi") & 0x7FFFFFFF
    expected = b"".join([
        bytes.fromhex("00000062"),  # TOTALSIZE 98 = 91 + body 2 + topic 1 + properties 4
        bytes.fromhex("DAA320A7"),  # MAGICCODE
        body_crc.to_bytes(4, "big"),  # BODYCRC
        bytes.fromhex("00000003"),  # QUEUEID
        bytes.fromhex("00000007"),  # FLAG
        bytes.fromhex("0000000000000005"),  # QUEUEOFFSET
        bytes.fromhex("0000000000000100"),  # PHYSICALOFFSET
        bytes.fromhex("00000000"),  # SYSFLAG
        bytes.fromhex("00000000000003E8"),  # BORNTIMESTAMP 1000
        bytes.fromhex("0A000001" "000004D2"),  # BORNHOST 10.0.0.1:1234
        bytes.fromhex("00000000000007D0"),  # STORETIMESTAMP 2000
        bytes.fromhex("0A000002" "00002A9F"),  # STOREHOST 10.0.0.2:10911
        bytes.fromhex("00000001"),  # RECONSUMETIMES
        bytes.fromhex("0000000000000000"),  # PREPARED TRANSACTION OFFSET
        bytes.fromhex("00000002") + b"hi",  # BODY
        b"\x01T",  # TOPIC
        b"\x00\x04A\x011\x02",  # PROPERTIES
    ])
    assert len(expected) == 98
    assert encode_stored(_message()) == expected
    # the same bytes the commit log holds: Sluice's own encoder writes them too
    assert expected == encode_entry(b"T", 3, b"hi", b"A\x011\x02", flag=7, born_timestamp=1000,
                                    born_ip=bytes([10, 0, 0, 1]), born_port=1234, reconsume_times=1, queue_offset=5,
                                    physical_offset=0x100, store_timestamp=2000, store_ip=bytes([10, 0, 0, 2]),
                                    store_port=10911)
    decoded, end = decode_stored(expected)
    assert end == 98 and decoded.born_host == "10.0.0.1:1234" and decoded.store_host == "10.0.0.2:10911"
    assert decoded.msg_id == "0A00000200002A9F0000000000000100" == decode_entry(expected).msg_id


def test_stored_entry_bytes_by_hand_ipv6_hosts() -> None:
    m = _message(born_host="[::1]:1234", store_host="[fe80::2]:10911")
    raw = encode_stored(m)
    assert len(raw) == 98 + 12 + 12  # each host 12 bytes wider
    assert raw[36:40] == bytes.fromhex("00000030")  # SYSFLAG: BORNHOST_V6 | STOREHOST_V6
    assert raw[48:68] == bytes(15) + b"\x01" + bytes.fromhex("000004D2")  # BORNHOST ::1, port 1234
    assert raw[76:96] == bytes.fromhex("FE800000000000000000000000000002") + bytes.fromhex("00002A9F")
    decoded, _ = decode_stored(raw)
    assert (decoded.born_host, decoded.store_host, decoded.body, decoded.topic) == (
        "[::1]:1234", "[fe80::2]:10911", b"hi", "T")
    assert len(decoded.msg_id) == 56 and parse_offset_msg_id(decoded.msg_id) == ("[fe80::2]:10911", 0x100)


def test_the_v4_layout_is_the_commit_logs() -> None:
    assert ENTRY_HEADER.size == 88  # through BODY's length: 91 = 88 + topic length 1 + properties length 2


def test_malformed_stored_entries_are_refused() -> None:
    raw = encode_stored(_message())
    for bad in (raw[:50], raw[:-1], struct.pack(">i", 500) + raw[4:], raw[:84] + struct.pack(">i", 99) + raw[88:]):
        with pytest.raises(MessageIllegalError):
            list(iter_stored(bad))


# ------------------------------------------------------------------------------------------------ offset ids


def test_offset_msg_id_by_hand() -> None:
    assert offset_msg_id("10.0.0.2:10911", 0x100) == "0A000002" "00002A9F" "0000000000000100"
    assert parse_offset_msg_id("0A00000200002A9F0000000000000100") == ("10.0.0.2:10911", 0x100)
    assert offset_msg_id("[::1]:9", 1) == "0" * 31 + "1" + "00000009" + "0000000000000001"
    for bad in ("", "0A00", "Z" * 32, "0" * 40):
        with pytest.raises(MessageIllegalError):
            parse_offset_msg_id(bad)


# ------------------------------------------------------------------------------------------------ batch bodies


def test_batch_body_by_hand() -> None:
    item = b"".join([
        bytes.fromhex("00000020"),  # TOTALSIZE 32 = 22 + body 3 + properties 7
        bytes(4), bytes(4),  # MAGIC 0, BODYCRC 0
        bytes.fromhex("00000009"),  # FLAG
        bytes.fromhex("00000003") + b"abc",  # BODY
        bytes.fromhex("0007") + b"K\x01v\x02U\x01u",  # PROPERTIES as Java writes them: no trailing \x02
    ])
    assert len(item) == 32
    items = decode_batch(item + item)
    assert items == [BatchItem(b"abc", 9, {"K": "v", "U": "u"})] * 2
    assert encode_batch([BatchItem(b"abc", 9, {"K": "v"})]) == b"".join([
        bytes.fromhex("0000001D"), bytes(8), bytes.fromhex("00000009"), bytes.fromhex("00000003"), b"abc",
        bytes.fromhex("0004"), b"K\x01v\x02"])


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"", "no messages"),
        (bytes(10), "fewer than the 22"),
        (struct.pack(">iiiii", 100, 0, 0, 0, 0) + b"\x00\x00", "TOTALSIZE 100"),
        (struct.pack(">iiiii", 22, 0, 0, 0, 5) + b"\x00\x00", "body length 5"),
        (struct.pack(">iiiii", 22, 0, 0, 0, -1) + b"\x00\x00", "body length -1"),
        (struct.pack(">iiiii", 24, 0, 0, 0, 0) + b"\x00\x01ab", "properties length 1"),
        (struct.pack(">iiiii", 12, 0, 0, 0, 0) + b"\x00\x00", "TOTALSIZE 12"),
    ],
)
def test_malformed_batch_bodies_are_refused(body: bytes, says: str) -> None:
    with pytest.raises(MessageIllegalError, match=says):
        decode_batch(body)


def test_too_many_batch_messages_are_refused() -> None:
    with pytest.raises(MessageIllegalError, match="more than 3 messages"):
        decode_batch(encode_batch([BatchItem(b"")] * 4), max_messages=3)


def test_batch_becomes_the_entries_sluice_stores() -> None:
    buffer = sluice_batch([BatchItem(b"x", 1, {"UNIQ_KEY": "u1"}), BatchItem(b"yy", 2, {})], "T", 2, sys_flag=0,
                          born_timestamp=5, born_host="10.1.2.3:77")
    first = decode_entry(buffer)
    second = decode_entry(buffer, first.store_size)
    assert (first.topic, first.queue_id, first.body, first.flag, first.properties, first.born_host) == (
        "T", 2, b"x", 1, {"UNIQ_KEY": "u1"}, "10.1.2.3:77")
    assert (second.body, second.flag, second.born_timestamp) == (b"yy", 2, 5)


# ------------------------------------------------------------------------------------------------ compression


def test_compressed_bodies_are_inflated_for_readers() -> None:
    body = b"payload " * 1000
    packed, bits = compressed_body(body)
    assert bits == COMPRESSED | 0x300 and zlib.decompress(packed) == body
    assert inflated_body(bits, packed) == body
    assert inflated_body(COMPRESSED, packed) == body  # a producer before 4.9.4 sets no type: zlib
    assert inflated_body(0, packed) == packed
    with pytest.raises(MessageIllegalError, match="LZ4"):
        inflated_body(COMPRESSED | 0x100, packed)
    with pytest.raises(MessageIllegalError, match="not zlib"):
        inflated_body(COMPRESSED, b"not compressed")


def test_a_compressed_body_inflating_without_bound_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import broker.format.compression as sysflag

    monkeypatch.setattr(sysflag, "MAX_INFLATED_BYTES", 1000)
    with pytest.raises(MessageIllegalError, match="inflates past 1000"):
        inflated_body(COMPRESSED, zlib.compress(bytes(5000)))


# ------------------------------------------------------------------------------------------------ round trips

_names = st.text(st.characters(blacklist_characters="\x00\x01\x02", blacklist_categories=("Cs",)), min_size=1,
                 max_size=12)
_props = st.dictionaries(_names, _names, max_size=5)
_hosts = st.one_of(
    st.tuples(st.ip_addresses(v=4), st.integers(0, 65535)).map(lambda t: f"{t[0]}:{t[1]}"),
    st.tuples(st.ip_addresses(v=6), st.integers(0, 65535)).map(lambda t: f"[{t[0]}]:{t[1]}"),
)
_i32 = st.integers(-(2**31), 2**31 - 1)
_i64 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(props=_props)
def test_properties_round_trip(props: dict[str, str]) -> None:
    assert parse_properties(format_properties(props)) == props


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    topic=st.text("abcXYZ09_-%|", min_size=1, max_size=127), body=st.binary(max_size=300), props=_props,
    born=_hosts, store=_hosts, ints=st.tuples(_i32, _i32, _i64, _i64, _i64, _i64, _i32, _i64),
    sys_flag=st.integers(0, 0xFFFF),
)
def test_stored_entries_round_trip(
    topic: str, body: bytes, props: dict[str, str], born: str, store: str,
    ints: tuple[int, int, int, int, int, int, int, int], sys_flag: int,
) -> None:
    qid, flag, qoff, coff, bts, sts, rt, ptx = ints
    m = StoredMessage(
        topic=topic, queue_id=qid, queue_offset=qoff, commitlog_offset=coff, body=body, properties=props, flag=flag,
        sys_flag=sys_flag, born_timestamp=bts, born_host=born, store_timestamp=sts, store_host=store,
        reconsume_times=rt, prepared_transaction_offset=ptx,
    )
    two = encode_stored(m) * 2
    back = list(iter_stored(two))
    assert len(back) == 2
    got = back[1]
    m.sys_flag = got.sys_flag  # the host bits follow the hosts
    m.store_size, m.msg_id = len(two) // 2, offset_msg_id(store, coff)
    assert got == m
    assert got.sys_flag & ~0x30 == sys_flag & ~0x30


@settings(max_examples=100, deadline=None, derandomize=True)
@given(items=st.lists(st.builds(BatchItem, st.binary(max_size=100), _i32, _props), min_size=1, max_size=8))
def test_batch_bodies_round_trip(items: list[BatchItem]) -> None:
    assert decode_batch(encode_batch(items)) == items


def test_the_spark_connector_reads_compressed_bodies_inflated() -> None:
    from connector.record_batch import RowFilter, decode_entries

    body = b"spark " * 2000
    packed, bits = compressed_body(body)
    entries = [encode_entry(b"T", 0, b"plain", physical_offset=0, queue_offset=0),
               encode_entry(b"T", 0, packed, sys_flag=bits, physical_offset=200, queue_offset=1),
               encode_entry(b"T", 0, packed, sys_flag=COMPRESSED | 0x100, physical_offset=900, queue_offset=2)]  # LZ4
    buffer = b"".join(entries)
    positions = [0, len(entries[0]), len(entries[0]) + len(entries[1])]
    rows = decode_entries(buffer, positions, topic="T", broker="b", include_properties=False,
                          row_filter=RowFilter(0, 1 << 62)).to_pylist()
    assert [r["body"] for r in rows] == [b"plain", body, packed]  # one it cannot inflate: as stored
