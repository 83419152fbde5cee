"""Compiled twins of the two per-entry loops of a large scan: the framing walk and the body CRCs.

Why compiled: in CPython a step of the walk costs about 250 ns and a ``zlib.crc32`` call on a 100-byte body about
350 ns (zlib's small-input path plus the call), so a recovery scan of 100-byte messages tops out near 150 MB/s.
numba compiles these two loops to machine code (measured: about 50 ns per entry of the walk, most of it waiting
for memory, and 1 ns per byte of CRC), which lets recovery, the dispatcher and large batches go several times
faster. The loops release the GIL; the array they read holds a buffer export on its mmap, so the file cannot be
unmapped under them (mmap.close refuses while an export exists).

The Python versions stay the definitions: ``batch._py_walk`` for framing and ``zlib.crc32`` for the CRC. Property
tests hold the twins to them on damaged, cut and random input. The twins are used only for ranges of at least
COMPILED_MIN_BYTES, so a small store (tests, a fresh broker) never pays numba's start-up: about 0.2 s to import
and 0.3 s to load the cached machine code (about 2 s to compile on the very first run of a checkout).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from broker.store.message import BLANK_MAGIC, MESSAGE_MAGIC, MIN_ENTRY_SIZE

COMPILED_MIN_BYTES = 64 * 1024  # below this the Python loops finish before numba would have loaded

# Walk stop codes (the kernel cannot return strings); batch.walk turns them into _py_walk's reasons.
STOP_MAX_ENTRIES = 0  # max_entries taken without stopping
STOP_AT_LIMIT = 1  # the last entry ends exactly at the limit
STOP_HEAD_CUT = 2  # fewer than 8 bytes left before the limit: "entry head cut short"
STOP_PARTIAL = 3  # a message head whose TOTALSIZE runs past the limit
STOP_BLANK = 4  # the blank entry that fills the end of a file
STOP_ZEROS = 5  # TOTALSIZE 0 and MAGIC 0: the unwritten end of a file
STOP_BAD_HEAD = 6  # anything else: a damaged head


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
            )  # fmt: skip
            c = (
                t[7, lo & 0xFF] ^ t[6, (lo >> 8) & 0xFF] ^ t[5, (lo >> 16) & 0xFF] ^ t[4, lo >> 24]
                ^ t[3, buf[p + 4]] ^ t[2, buf[p + 5]] ^ t[1, buf[p + 6]] ^ t[0, buf[p + 7]]
            )  # fmt: skip
            p += 8
        while p < end:
            c = t[0, (c ^ buf[p]) & 0xFF] ^ (c >> 8)
            p += 1
        out[k] = c ^ np.uint32(0xFFFFFFFF)


class _Kernels(NamedTuple):
    walk_loop: Callable[..., Any]
    crc_loop: Callable[..., Any]


@functools.cache
def _compiled() -> _Kernels:
    """The two kernels, compiled on first use (numba is imported here, not at module import, for the reason in
    the module docstring). ``cache=True`` keeps the machine code in __pycache__ for later processes."""
    import numba

    jit = numba.njit(cache=True, nogil=True, boundscheck=False)
    return _Kernels(jit(_walk_loop), jit(_crc_loop))


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


def warm() -> None:
    """Compile (or load) both loops for the buffers they meet: bytes (read-only arrays) and mmaps (writable).
    The broker image runs this at build time so a container never compiles."""
    for arr in (np.frombuffer(bytes(MIN_ENTRY_SIZE), np.uint8), np.zeros(MIN_ENTRY_SIZE, np.uint8)):
        walk(arr, 0, arr.size, 1)
        crc32s(arr, np.zeros(1, np.int64), np.ones(1, np.int64))
