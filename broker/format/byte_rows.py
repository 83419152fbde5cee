"""Byte rows: numpy views and gathers over a uint8 buffer of entries (fixed-width fields at many positions at once,
the entries' 88-byte headers as one record array, many slices joined with one gather).

What batch.py's scans and the readers of runs of entries (the dispatcher, half runs, lazy decoding) share; they take
no Python loop per entry.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from broker.format.message import ENTRY_HEADER, EntryHeader


def row_view(arr: np.ndarray, width: int) -> np.ndarray:
    """A zero-copy view whose row ``i`` is ``arr[i : i + width]``: fancy-indexing it copies whole rows at once."""
    return as_strided(arr, shape=(max(arr.size - width + 1, 0), width), strides=(1, 1), writeable=False)


def rows_at(arr: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """``arr[s : s + width]`` for every ``s`` in ``starts``, as one (len(starts), width) copy (no index matrix)."""
    return row_view(arr, width)[starts]


def put_rows(arr: np.ndarray, starts: np.ndarray, rows: np.ndarray) -> None:
    """``arr[s : s + width] = rows[i]`` for every ``starts[i]`` (rows: (len(starts), width) uint8), through one
    writable strided view: no (len(starts), width) index matrix. Ranges must not overlap."""
    width = rows.shape[1]
    view = as_strided(arr, shape=(max(arr.size - width + 1, 0), width), strides=(1, 1))
    view[starts] = rows


def gather(arr: np.ndarray, idx: np.ndarray, width: int, dtype: str) -> np.ndarray:
    """Big-endian fields of ``width`` bytes at byte positions ``idx`` of the uint8 array ``arr``, as int64."""
    if idx.size == 0:
        return np.zeros(0, np.int64)
    return row_view(arr, width)[idx].view(dtype).ravel().astype(np.int64)


def splice(source: bytes | bytearray, starts: np.ndarray, lengths: np.ndarray) -> bytes:
    """The concatenation of ``source[starts[i] : starts[i] + lengths[i]]`` for every i, with one index array and
    one numpy gather instead of a slice per piece (how batches are re-addressed without a per-entry loop)."""
    lengths = lengths.astype(np.int64)
    total = int(lengths.sum())
    dst = np.cumsum(lengths) - lengths
    index_type = np.int32 if len(source) < (1 << 31) and total < (1 << 31) else np.int64  # half the memory traffic
    idx = np.repeat((starts.astype(np.int64) - dst).astype(index_type), lengths) + np.arange(total, dtype=index_type)
    return np.frombuffer(source, np.uint8)[idx].tobytes()


def _header_dtype() -> np.dtype:
    """ENTRY_HEADER as a numpy record type (same struct, so the layout is still declared once)."""
    codes = {"i": ">i4", "q": ">i8", "4s": "S4"}
    fmt = ENTRY_HEADER.format.lstrip(">")
    tokens = []
    while fmt:
        tok = "4s" if fmt.startswith("4s") else fmt[0]
        tokens.append(codes[tok])
        fmt = fmt[len(tok) :]
    dt = np.dtype(list(zip(EntryHeader._fields, tokens, strict=True)))
    assert dt.itemsize == ENTRY_HEADER.size, dt.itemsize
    return dt


HEADER_DTYPE = _header_dtype()


def headers(arr: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The 88-byte fixed headers of the entries at ``positions``, as one record array (one row copy each)."""
    return row_view(arr, ENTRY_HEADER.size)[positions].view(HEADER_DTYPE).ravel()
