"""The canonical PROPERTIES check: the compiled twin (scan_kernel) answers as the definition (section_fault) on
damaged, hostile and well-formed sections; numbers in properties are ASCII digits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import MessageIllegalError
from broker.format import scan_kernel
from broker.format.message import decode_properties, encode_properties
from broker.format.properties import first_bad_section, property_number, section_fault

PIECES = [b"\x00", b"\x01", b"\x02", b"a", b"bc", b"KEYS", b"\xff", b"\xc3\xa9", b"\xc2", b"\xe2\x82\xac",
          b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xed\x9f\xbf", b"\xf0\x90\x80\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf",
          b"\xef\xbf\xbd", b"\x80"]
texts = st.text(st.characters(exclude_characters="\x01\x02", codec="utf-8"), max_size=6)
canonical = st.dictionaries(texts.filter(bool), texts, max_size=40).map(encode_properties)
repeated = st.tuples(canonical, st.integers(0, 39)).map(lambda c: c[0] + _nth_pair(c[0], c[1]))
raw = st.lists(st.sampled_from(PIECES), max_size=30).map(b"".join)
sections = st.lists(st.one_of(canonical, canonical, repeated, raw, st.just(b"")), min_size=1, max_size=60)


def _nth_pair(section: bytes, n: int) -> bytes:
    """One of the section's pairs again (a repeated name), or nothing if it has fewer."""
    pairs = section.split(b"\x02")[:-1]
    return pairs[n] + b"\x02" if n < len(pairs) else b""


def _reference(parts: list[bytes]) -> int:
    return next((i for i, p in enumerate(parts) if section_fault(p)), -1)


@settings(max_examples=300, deadline=None)
@given(sections, st.booleans())
def test_the_compiled_check_answers_as_the_definition(parts: list[bytes], big: bool) -> None:
    """Both ways of first_bad_section (the definition under scan_kernel.COMPILED_MIN_BYTES, the compiled twin
    above it) name the section the definition names first."""
    buf = b"".join(parts)
    starts, at = [], 0
    for p in parts:
        starts.append(at)
        at += len(p)
    if big:
        buf += bytes(scan_kernel.COMPILED_MIN_BYTES)  # past the threshold: the compiled path
    index, why = first_bad_section(buf, starts, [len(p) for p in parts])
    assert index == _reference(parts), (index, why, parts)
    assert (why == "") == (index < 0)


@settings(max_examples=300, deadline=None)
@given(st.one_of(canonical, repeated, raw))
def test_a_canonical_section_decodes_and_encodes_to_itself(section: bytes) -> None:
    """What canonical means: accepted sections survive decode + encode byte for byte (a send-back, a delayed
    delivery or a commit stores them so), and every section that does is accepted, apart from the empty name
    RocketMQ's decoder drops."""
    decoded = decode_properties(section)
    try:
        again = encode_properties(decoded)
    except MessageIllegalError:
        again = None
    if not section_fault(section):
        assert again == section
    elif again == section:
        assert "" in decoded, section


@pytest.mark.parametrize("value", ["0", "7", "0003", "2147483647"])
def test_property_numbers_are_ascii_digits(value: str) -> None:
    assert property_number("DELAY", value) == int(value)
    assert property_number("DELAY", value.encode()) == int(value)


@pytest.mark.parametrize("value", ["", "-1", "+1", " 1", "1 ", "\u0663", "\uff11", "\u00b2", "1.0", "2147483648",
                                   "9" * 5000])
def test_other_property_numbers_are_refused(value: str) -> None:
    with pytest.raises(MessageIllegalError, match="ASCII digits") as info:
        property_number("REAL_QID", value)
    assert len(info.value.message) < 300
