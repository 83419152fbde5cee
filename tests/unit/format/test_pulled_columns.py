"""The columns of broker/format/pulled_columns.py equal decode_entry's fields, entry by entry, byte for byte.

decode_entry is the definition. Random answers mix what the fast paths take (canonical properties, the same names
in every entry, one host, non-negative offsets) with what they must hand to the definitions (sections of other
writers' forms, invalid UTF-8, repeated names, negative offsets, many hosts and topics); edge cases add empty and
largest sections, unicode names and values, the largest topic and every port and address byte.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.format.message import (
    BODY_START,
    MAX_PROPERTIES_BYTES,
    MAX_TOPIC_BYTES,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    decode_entry,
    encode_entry,
    encode_properties,
)
from broker.format.pulled_columns import HeaderColumns, header_columns, properties_column, topic_column

I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
SEPARATORS = NAME_VALUE_SEPARATOR + PROPERTY_SEPARATOR
text = st.text(st.characters(blacklist_characters=SEPARATORS, blacklist_categories=("Cs",)), max_size=12)
NAMES = ["TAGS", "KEYS", "UNIQ_KEY", "app", "名前", "emoji 🚀", ""]


def other_forms() -> st.SearchStrategy[bytes]:
    """Sections not in encode_properties' form: no last \\x02, empty items, a name twice, no \\x01, not UTF-8."""
    return st.one_of(
        st.binary(max_size=40),
        st.lists(st.sampled_from([b"a\x01b", b"\x02", b"a\x01b\x02", b"a\x01c\x02", b"x\x01\x01y\x02", b"\xff\x02",
                                  b"\xe5\x90\x02", b"\x00\x01\x00\x02", b"n\x02"]), max_size=5).map(b"".join),
    )


@st.composite
def sections(draw: st.DrawFn, names: list[str], alike: bool) -> bytes:
    kind = 0 if alike else draw(st.integers(0, 9))
    if kind < 6:  # the template's names, in order: the shared-names path
        return encode_properties({n: draw(text) for n in names})
    if kind < 8:
        return encode_properties(draw(st.dictionaries(st.sampled_from(NAMES) | text, text, max_size=5)))
    return draw(other_forms())


@st.composite
def answers(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    names = draw(st.lists(st.sampled_from(NAMES), max_size=4, unique=True))
    one_host, alike = draw(st.booleans()), draw(st.booleans())
    store = (draw(st.binary(min_size=4, max_size=4)), draw(I32))
    born = (draw(st.binary(min_size=4, max_size=4)), draw(I32))
    topics = draw(st.lists(st.text("abZ09%|_-", min_size=1, max_size=MAX_TOPIC_BYTES), min_size=1, max_size=3))
    entries = []
    for i in range(draw(st.integers(1, 50))):
        other_store = (draw(st.sampled_from([store[0], b"\x00\x00\x00\x01"])), draw(I32))
        store_ip, store_port = store if one_host else other_store
        born_ip, born_port = born if one_host else (draw(st.binary(min_size=4, max_size=4)), draw(I32))
        entries.append(encode_entry(
            draw(st.sampled_from(topics)).encode("ascii"), draw(I32), draw(st.binary(max_size=40)),
            draw(sections(names, alike)), flag=draw(I32), sys_flag=draw(st.integers(0, 15)), born_timestamp=draw(I64),
            born_ip=born_ip, born_port=born_port, reconsume_times=draw(I32), prepared_transaction_offset=draw(I64),
            queue_offset=i, physical_offset=draw(st.one_of(st.integers(0, 2**63 - 1), I64)),
            store_timestamp=draw(I64), store_ip=store_ip, store_port=store_port,
        ))
    return answer(entries)


def answer(entries: list[bytes]) -> tuple[bytes, list[int]]:
    positions, at = [], 0
    for e in entries:
        positions.append(at)
        at += len(e)
    return b"".join(entries), positions


def tails_of(buf: bytes, positions: list[int]) -> np.ndarray:
    return np.array([p + BODY_START + int.from_bytes(buf[p + 84 : p + 88], "big") for p in positions], np.int64)


def assert_columns_equal(buf: bytes, positions: list[int]) -> None:
    ends = [*positions[1:], len(buf)]
    want = [decode_entry(buf, p, e) for p, e in zip(positions, ends, strict=True)]
    tails = tails_of(buf, positions)
    columns = header_columns(buf, np.array(positions, np.int64))
    got = {name: getattr(columns, name) for name in HeaderColumns._fields}
    got["topic"] = topic_column(buf, tails)
    got["properties"] = properties_column(buf, tails)
    for name, column in got.items():
        assert len(column) == len(want), name
        for i, (value, message) in enumerate(zip(column, want, strict=True)):
            expected = getattr(message, name)
            assert type(value) is type(expected) and value == expected, (name, i, value, expected)
            if isinstance(value, dict):  # the same order of names, too
                assert list(value.items()) == list(expected.items()), (name, i)
    dicts = got["properties"]
    assert len({id(d) for d in dicts}) == len(dicts)  # each entry its own dict: changing one changes no other


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(found=answers())
def test_columns_equal_decode_entry_on_random_answers(found: tuple[bytes, list[int]]) -> None:
    assert_columns_equal(*found)


def test_edge_sections_and_hosts() -> None:
    biggest = encode_properties({"K": "v" * (MAX_PROPERTIES_BYTES - 3)})
    assert len(biggest) == MAX_PROPERTIES_BYTES
    unicode_props = encode_properties({"名前": "値 ✓", "emoji 🚀": "", "": "empty name"})
    cases = [b"", biggest, unicode_props, encode_properties({"TAGS": "a", "KEYS": "k1 k2"}), b"\x01\x02"]
    hosts = [(b"\xff\xff\xff\xff", -1), (b"\x00\x00\x00\x00", 0), (b"\x7f\x00\x00\x01", 2**31 - 1)]
    entries = [
        encode_entry(b"t" * MAX_TOPIC_BYTES, 2**31 - 1, b"x" * i, props, born_ip=hosts[i % 3][0],
                     born_port=hosts[i % 3][1], store_ip=hosts[i % 2][0], store_port=hosts[i % 2][1],
                     physical_offset=(2**63 - 1) if i == 0 else i * 1000, queue_offset=i)
        for i, props in enumerate(cases * 8)
    ]
    assert_columns_equal(*answer(entries))
    for props in cases:  # each form alone, over a whole answer: the all-alike paths
        assert_columns_equal(*answer([encode_entry(b"T", 0, b"b", props, physical_offset=7)] * 40))


def test_an_answer_of_one_topic_and_one_host_shares_their_strings() -> None:
    entries = [encode_entry(b"Orders", 0, b"b", encode_properties({"TAGS": "a", "i": str(i)}), physical_offset=i * 99,
                            store_ip=b"\x0a\x00\x00\x07", store_port=10911) for i in range(50)]
    buf, positions = answer(entries)
    tails = tails_of(buf, positions)
    topics = topic_column(buf, tails)
    columns = header_columns(buf, np.array(positions, np.int64))
    assert topics == ["Orders"] * 50 and len({id(t) for t in topics}) == 1
    assert columns.store_host == ["10.0.0.7:10911"] * 50
    assert columns.msg_id[3] == f"0A00000700002A9F{3 * 99:016X}"
    assert properties_column(buf, tails)[7] == {"TAGS": "a", "i": "7"}


def test_answers_whose_entries_share_their_names_whatever_their_number() -> None:
    for count in range(1, 9):
        names = [f"n{j}" for j in range(count)]
        if count > 2:
            names[2] = names[0]  # a name twice: its first place, its last value
        entries = [encode_entry(b"T", 0, b"b", "".join(f"{n}\x01v{j}.{i}\x02" for j, n in enumerate(names)).encode())
                   for i in range(40)]
        assert_columns_equal(*answer(entries))
