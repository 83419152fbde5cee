"""The compiled twins (scan_kernel) against their definitions: _py_walk for framing, zlib.crc32 for body CRCs.

Then the scan property of test_batch runs again with the twins forced on for every size, so one suite covers both
ways of scanning (a scan below COMPILED_MIN_BYTES never reaches the twins otherwise).
"""

from __future__ import annotations

import zlib
from unittest.mock import patch

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.format import scan_kernel
from broker.format.batch import _py_walk, body_crcs, scan, walk
from broker.format.message import BLANK_MAGIC, PREFIX, encode_entry, encode_properties

_MAGIC = b"\xda\xa3\x20\xa7"
_bodies = st.lists(
    st.one_of(st.binary(max_size=200), st.builds(lambda k: _MAGIC * k, st.integers(1, 4))), min_size=0, max_size=40
)
# What may follow the entries: nothing, the unwritten zeros of a file, the end-of-file blank, garbage, a cut head,
# a head whose TOTALSIZE runs past the limit.
_tails = st.sampled_from(["", "zeros", "blank", "garbage", "cut", "partial"])


def _log(bodies: list[bytes], tail: str) -> bytes:
    props = encode_properties({"TAGS": "t"})
    buf = b"".join(encode_entry(b"W%d" % (i % 2), i % 3, b, props if i % 2 else b"") for i, b in enumerate(bodies))
    extra = {
        "": b"",
        "zeros": bytes(64),
        "blank": PREFIX.pack(64, BLANK_MAGIC) + bytes(56),
        "garbage": b"\x01\x02\x03\x04\x05\x06\x07\x08" * 4,
        "cut": PREFIX.pack(500, -626843481)[:5],
        "partial": PREFIX.pack(10_000, -626843481) + bytes(100),
    }[tail]
    return buf + extra


@settings(max_examples=300, deadline=None)
@given(
    bodies=_bodies,
    tail=_tails,
    flip=st.one_of(st.none(), st.tuples(st.integers(min_value=0), st.integers(1, 255))),
    start_at=st.integers(min_value=0),
    max_entries=st.sampled_from([1 << 62, 0, 1, 7]),
)
def test_compiled_walk_equals_the_definition(
    bodies: list[bytes], tail: str, flip: tuple[int, int] | None, start_at: int, max_entries: int
) -> None:
    """Property: positions, stop and reason of the compiled walk equal _py_walk's, on damaged input too, from any
    start (entry boundary or not) and with an entry budget."""
    buf = bytearray(_log(bodies, tail))
    if flip is not None and buf:
        buf[flip[0] % len(buf)] ^= flip[1]
    data = bytes(buf)
    start = start_at % (len(data) + 1)
    want_pos, want_stop, want_reason = _py_walk(data, start, len(data), max_entries)
    got_pos, got_stop, code = scan_kernel.walk(np.frombuffer(data, np.uint8), start, len(data), max_entries)
    assert got_pos.tolist() == want_pos and got_stop == want_stop
    if want_reason is None:
        assert code == scan_kernel.STOP_MAX_ENTRIES
    else:
        with patch.object(scan_kernel, "COMPILED_MIN_BYTES", 0):
            assert walk(data, start, len(data))[2] == want_reason  # the code is turned back into the same words


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=2000), cuts=st.lists(st.tuples(st.integers(0), st.integers(0, 300)), max_size=30))
def test_compiled_crc_equals_zlib(data: bytes, cuts: list[tuple[int, int]]) -> None:
    """Property: every slice (any start, any length from 0, so every alignment and tail length) has zlib's CRC."""
    n = len(data)
    starts = np.array([a % (n + 1) for a, _ in cuts], np.int64)
    lengths = np.array([min(length, n - s) for (_, length), s in zip(cuts, starts.tolist(), strict=True)], np.int64)
    got = scan_kernel.crc32s(np.frombuffer(data, np.uint8), starts, lengths)
    want = [zlib.crc32(data[s : s + k]) for s, k in zip(starts.tolist(), lengths.tolist(), strict=True)]
    assert got.tolist() == want


def test_body_crcs_pick_either_way_with_the_same_answer() -> None:
    """body_crcs sends many small bodies to the compiled loop and large ones to zlib: both give RocketMQ's
    31-bit CRC."""
    rng = np.random.default_rng(7)
    blob = rng.integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    for size in (100, 8000):  # below and above COMPILED_CRC_MAX_AVG_BYTES
        starts = np.arange(0, len(blob) - size, size + 3, dtype=np.int64)
        lengths = np.full(starts.size, size, np.int64)
        want = [zlib.crc32(blob[s : s + size]) & 0x7FFFFFFF for s in starts.tolist()]
        assert body_crcs(blob, starts, lengths).tolist() == want


_scan_bodies = st.lists(st.binary(max_size=300), min_size=1, max_size=60)


_TAIL_REASONS = {
    "": "",
    "zeros": "zeros",
    "blank": "blank",
    "garbage": "bad entry head (TOTALSIZE 16909060, MAGIC 0x5060708)",
    "cut": "entry head cut short",
    "partial": "partial",
}


@settings(max_examples=120, deadline=None)
@given(bodies=_scan_bodies, flip=st.integers(min_value=0), tail=_tails)
def test_scan_is_the_same_either_way(bodies: list[bytes], flip: int, tail: str) -> None:
    """Property: scan with CRC, through the twins and through the Python loops, finds exactly the entries and
    the tail's reason; after one flipped byte both give the same prefix, reason and CRCs."""
    clean = _log(bodies, tail)
    damaged = bytearray(clean)
    damaged[flip % len(damaged)] ^= 0x5A
    entries: list[int] = []
    for data in (clean, bytes(damaged)):
        with patch.object(scan_kernel, "COMPILED_MIN_BYTES", 0):
            run = scan(data, 0, len(data), verify_crc=True)
        with patch.object(scan_kernel, "COMPILED_MIN_BYTES", 1 << 62):
            ref = scan(data, 0, len(data), verify_crc=True)
        assert run.positions.tolist() == ref.positions.tolist()
        assert (run.end, run.stop_reason) == (ref.end, ref.stop_reason)
        assert run.body_crcs.tolist() == ref.body_crcs.tolist()
        if data is clean:
            assert len(run) == len(bodies) and run.stop_reason == _TAIL_REASONS[tail]
            entries = run.positions.tolist()
        else:
            assert run.positions.tolist() == entries[: len(run)]  # a prefix of the real entries, nothing invented
