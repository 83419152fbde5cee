"""Compiled twins of the per-entry loops of a large scan: the framing walk, the body CRCs and the property check.

Why compiled: in CPython a step of the walk costs about 250 ns and a ``zlib.crc32`` call on a 100-byte body about
350 ns (zlib's small-input path plus the call), so a recovery scan of 100-byte messages tops out near 150 MB/s.
numba compiles these two loops to machine code (measured: about 50 ns per entry of the walk, most of it waiting
for memory, and 1 ns per byte of CRC), which lets recovery, the dispatcher and large batches go several times
faster. The loops release the GIL; the array they read holds a buffer export on its mmap, so the file cannot be
unmapped under them (mmap.close refuses while an export exists).

The Python versions stay the definitions: ``batch._py_walk`` for framing, ``zlib.crc32`` for the CRC and
``properties.section_fault`` for a PROPERTIES section (about 3 us a section in Python, a few ns a byte here).
Property tests hold the twins to them on damaged, cut and random input. The twins are used only for ranges of at least
COMPILED_MIN_BYTES, so a small store (tests, a fresh broker) never pays numba's start-up: about 0.2 s to import
and 0.3 s to load the cached machine code (about 2 s to compile on the very first run of a checkout).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from broker.format.message import BLANK_MAGIC, MESSAGE_MAGIC, MIN_ENTRY_SIZE

COMPILED_MIN_BYTES = 64 * 1024  # below this the Python loops finish before numba would have loaded

# Walk stop codes (the kernel cannot return strings); batch.walk turns them into _py_walk's reasons.
STOP_MAX_ENTRIES = 0  # max_entries taken without stopping
STOP_AT_LIMIT = 1  # the last entry ends exactly at the limit
STOP_HEAD_CUT = 2  # fewer than 8 bytes left before the limit: "entry head cut short"
STOP_PARTIAL = 3  # a message head whose TOTALSIZE runs past the limit
STOP_BLANK = 4  # the blank entry that fills the end of a file
STOP_ZEROS = 5  # TOTALSIZE 0 and MAGIC 0: the unwritten end of a file
STOP_BAD_HEAD = 6  # anything else: a damaged head


# Property check answers (a section's index comes with it).
PROPS_OK = 0  # every section from ``begin`` on is canonical
PROPS_BAD = 1  # this section is not
PROPS_ASK = 2  # this section names more pairs than are compared here: the definition decides about repeated names
MAX_PAIRS_COMPARED = 32  # names of a section compared pairwise (at most 496 comparisons); past this, PROPS_ASK


def _crc_tables() -> np.ndarray:
    """Slice-by-8 tables of the reflected CRC-32 (polynomial 0xEDB88320, zlib's): row k maps a byte to its
    contribution k bytes before the end of an 8-byte step."""
    t = np.zeros((8, 256), np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0xEDB88320 if c & 1 else 0)
        t[0, i] = c
    for k in range(1, 8):
        t[k] = (t[k - 1] >> 8) ^ t[0, t[k - 1] & 0xFF]
    return t


CRC_TABLES = _crc_tables()
assert CRC_TABLES.shape == (8, 256) and int(CRC_TABLES[0, 1]) == 0x77073096  # the table every CRC-32 text prints


def _walk_loop(buf: np.ndarray, pos: int, limit: int, max_entries: int, out: np.ndarray) -> tuple[int, int, int]:
    """Follow TOTALSIZE from ``pos``: (entries written to ``out``, where it stopped, STOP_* code)."""
    n = 0
    while pos + 8 <= limit:
        if n >= max_entries:
            return n, pos, STOP_MAX_ENTRIES
        # TOTALSIZE and MAGICCODE: big-endian signed ints, as Java's ByteBuffer wrote them
        # (np.int64 throughout: numba types int(uint8) arithmetic as unsigned, which would not go negative)
        total = np.int64(0)
        magic = np.int64(0)
        for i in range(4):
            total = (total << 8) | np.int64(buf[pos + i])
            magic = (magic << 8) | np.int64(buf[pos + 4 + i])
        total -= (total >> 31) << 32
        magic -= (magic >> 31) << 32
        if magic != MESSAGE_MAGIC or total < MIN_ENTRY_SIZE or pos + total > limit:
            if magic == MESSAGE_MAGIC and total >= MIN_ENTRY_SIZE:
                return n, pos, STOP_PARTIAL
            if magic == BLANK_MAGIC:
                return n, pos, STOP_BLANK
            if total == 0 and magic == 0:
                return n, pos, STOP_ZEROS
            return n, pos, STOP_BAD_HEAD
        out[n] = pos
        n += 1
        pos += int(total)
    return n, pos, (STOP_HEAD_CUT if pos < limit else STOP_AT_LIMIT)


def _crc_loop(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray, t: np.ndarray, out: np.ndarray) -> None:
    """zlib.crc32 of each ``buf[starts[k] : starts[k] + lengths[k]]`` into ``out[k]`` (slice-by-8)."""
    for k in range(starts.size):
        c = np.uint32(0xFFFFFFFF)
        p = starts[k]
        end = p + lengths[k]
        while p + 8 <= end:
            lo = c ^ (
                np.uint32(buf[p]) | (np.uint32(buf[p + 1]) << 8) | (np.uint32(buf[p + 2]) << 16)
                | (np.uint32(buf[p + 3]) << 24)
            )
            c = (
                t[7, lo & 0xFF] ^ t[6, (lo >> 8) & 0xFF] ^ t[5, (lo >> 16) & 0xFF] ^ t[4, lo >> 24]
                ^ t[3, buf[p + 4]] ^ t[2, buf[p + 5]] ^ t[1, buf[p + 6]] ^ t[0, buf[p + 7]]
            )
            p += 8
        while p < end:
            c = t[0, (c ^ buf[p]) & 0xFF] ^ (c >> 8)
            p += 1
        out[k] = c ^ np.uint32(0xFFFFFFFF)


def _props_loop(
    buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray, begin: int, names: np.ndarray
) -> tuple[int, int]:
    """From section ``begin`` on: (index, PROPS_BAD or PROPS_ASK) of the first section that is not canonical or
    needs the definition, or (len(starts), PROPS_OK). ``names``: scratch, (MAX_PAIRS_COMPARED, 2) int64.

    One pass per section: pairs are a non-empty name, \x01, a value, \x02, no name twice; non-ASCII bytes are
    checked as CPython's strict UTF-8 decoder does (Unicode Table 3-7: no overlong forms, no surrogates, nothing
    past U+10FFFF). A sequence cannot run into the closing \x02, which is ASCII."""
    for k in range(begin, starts.size):
        n = lengths[k]
        if n == 0:
            continue
        p = starts[k]
        end = p + n
        if buf[end - 1] != 2:
            return k, PROPS_BAD
        pairs = 0
        in_name = True
        name_start = p
        name_end = p
        i = p
        while i < end:
            while i < end and 2 < buf[i] < 0x80:  # the usual byte: printable ASCII, nothing to decide
                i += 1
            if i == end:
                break
            b = np.int64(buf[i])
            if b >= 0x80:
                lo, hi = np.int64(0x80), np.int64(0xBF)
                if 0xC2 <= b <= 0xDF:
                    need = 1
                elif b == 0xE0:
                    need, lo = 2, np.int64(0xA0)
                elif 0xE1 <= b <= 0xEC or b == 0xEE or b == 0xEF:
                    need = 2
                elif b == 0xED:
                    need, hi = 2, np.int64(0x9F)
                elif b == 0xF0:
                    need, lo = 3, np.int64(0x90)
                elif 0xF1 <= b <= 0xF3:
                    need = 3
                elif b == 0xF4:
                    need, hi = 3, np.int64(0x8F)
                else:
                    return k, PROPS_BAD
                if i + need > end - 1:
                    return k, PROPS_BAD
                c = np.int64(buf[i + 1])
                if c < lo or c > hi:
                    return k, PROPS_BAD
                for j in range(2, need + 1):
                    c = np.int64(buf[i + j])
                    if c < 0x80 or c > 0xBF:
                        return k, PROPS_BAD
                i += need + 1
                continue
            if b == 1:
                if not in_name or i == name_start:
                    return k, PROPS_BAD
                name_end = i
                in_name = False
            elif b == 2:
                if in_name:
                    return k, PROPS_BAD
                if pairs < MAX_PAIRS_COMPARED:
                    width = name_end - name_start
                    for q in range(pairs):
                        a, z = names[q, 0], names[q, 1]
                        if z - a == width:
                            same = True
                            for j in range(width):
                                if buf[a + j] != buf[name_start + j]:
                                    same = False
                                    break
                            if same:
                                return k, PROPS_BAD
                    names[pairs, 0] = name_start
                    names[pairs, 1] = name_end
                pairs += 1
                in_name = True
                name_start = i + 1
            i += 1
        if pairs > MAX_PAIRS_COMPARED:
            return k, PROPS_ASK
    return starts.size, PROPS_OK


class _Kernels(NamedTuple):
    walk_loop: Callable[..., Any]
    crc_loop: Callable[..., Any]
    props_loop: Callable[..., Any]


@functools.cache
def _compiled() -> _Kernels:
    """The kernels, compiled on first use (numba is imported here, not at module import, for the reason in the
    module docstring). ``cache=True`` keeps the machine code in __pycache__ for later processes."""
    import numba

    jit = numba.njit(cache=True, nogil=True, boundscheck=False)
    return _Kernels(jit(_walk_loop), jit(_crc_loop), jit(_props_loop))


def walk(buf: np.ndarray, start: int, limit: int, max_entries: int) -> tuple[np.ndarray, int, int]:
    """Compiled ``batch._py_walk`` over a uint8 array: (positions, stop, STOP_* code)."""
    assert 0 <= start <= limit <= buf.size, (start, limit, buf.size)
    cap = min(max_entries, (limit - start) // MIN_ENTRY_SIZE + 1)
    out = np.empty(cap, np.int64)
    n, stop, code = _compiled().walk_loop(buf, start, limit, max_entries, out)
    return out[:n], int(stop), int(code)


def crc32s(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """zlib.crc32 of many slices of a uint8 array, as uint32."""
    assert starts.size == lengths.size
    assert starts.size == 0 or (
        int(starts.min()) >= 0 and int(lengths.min()) >= 0 and int((starts + lengths).max()) <= buf.size
    ), "slices must lie inside the buffer (boundscheck is off in the compiled loop)"
    out = np.empty(starts.size, np.uint32)
    starts, lengths = starts.astype(np.int64, copy=False), lengths.astype(np.int64, copy=False)
    _compiled().crc_loop(buf, starts, lengths, CRC_TABLES, out)
    return out


def first_bad_properties(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray, begin: int = 0) -> tuple[int, int]:
    """Compiled twin of ``properties.section_fault`` over sections ``buf[starts[k] : starts[k] + lengths[k]]``
    from ``begin``: (index, PROPS_BAD | PROPS_ASK) of the first one the caller must look at, or
    (len(starts), PROPS_OK)."""
    assert starts.size == lengths.size
    assert starts.size == 0 or (
        int(starts.min()) >= 0 and int(lengths.min()) >= 0 and int((starts + lengths).max()) <= buf.size
    ), "sections must lie inside the buffer (boundscheck is off in the compiled loop)"
    starts, lengths = starts.astype(np.int64, copy=False), lengths.astype(np.int64, copy=False)
    names = np.empty((MAX_PAIRS_COMPARED, 2), np.int64)
    index, code = _compiled().props_loop(buf, starts, lengths, begin, names)
    return int(index), int(code)


def warm() -> None:
    """Compile (or load) the loops for the buffers they meet: bytes (read-only arrays) and mmaps or bytearrays
    (writable). The broker image runs this at build time so a container never compiles."""
    for arr in (np.frombuffer(bytes(MIN_ENTRY_SIZE), np.uint8), np.zeros(MIN_ENTRY_SIZE, np.uint8)):
        walk(arr, 0, arr.size, 1)
        crc32s(arr, np.zeros(1, np.int64), np.ones(1, np.int64))
        first_bad_properties(arr, np.zeros(1, np.int64), np.ones(1, np.int64))
