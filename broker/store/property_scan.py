"""Reading a message's properties in place: one property's raw value, the index keys, and the numpy tests the
dispatcher uses to skip parsing (no TAGS / KEYS / UNIQ_KEY name in a run; one shared properties string; a
producer's shared prefix followed by each message's UNIQ_KEY).

Properties are ``name\\x01value\\x02`` pairs (broker/format/properties.py); these functions read the bytes as stored,
without decoding the other pairs, because the dispatcher reads every message's tag and keys.
"""

from __future__ import annotations

import mmap
from typing import NamedTuple

import numpy as np

from broker.format.batch import Buffer, rows_at
from broker.format.message import Prop

TAGS_NAME = (Prop.TAGS + "\x01").encode()
KEYS_NAME = (Prop.KEYS + "\x01").encode()
UNIQ_NAME = (Prop.UNIQ_KEY + "\x01").encode()
SEP_TAGS = b"\x02" + TAGS_NAME
# The 4 bytes before the \x01 that ends each name the dispatcher parses (TAGS; KEYS and UNIQ_KEY when indexing).
TAG_NAME_END = np.frombuffer(b"TAGS", "<u4")
INDEXED_NAME_ENDS = np.frombuffer(b"TAGSKEYS_KEY", "<u4")
assert Prop.TAGS[-4:] == "TAGS" and Prop.KEYS[-4:] == "KEYS" and Prop.UNIQ_KEY[-4:] == "_KEY", "name ends above"
UNIQ_KEY_CHARS = 32  # a producer's UNIQ_KEY: 32 hex characters (broker/client/producer.py, UniqKeys)
_UNIQ_TAIL_BYTES = len(UNIQ_NAME) + UNIQ_KEY_CHARS + 1  # UNIQ_KEY\x01 <32 characters> \x02
_UNIQ_NAME_BYTES = np.frombuffer(UNIQ_NAME, np.uint8)
TAGS_LEN = len(TAGS_NAME)
SEP_TAGS_LEN = len(SEP_TAGS)


def property_value(props: bytes, name: bytes) -> bytes | None:
    """The raw value of one property (``name`` ends with \\x01) without decoding the others."""
    if props.startswith(name):
        i = len(name)
    else:
        i = props.find(b"\x02" + name)
        if i < 0:
            return None
        i += len(name) + 1
    j = props.find(b"\x02", i)
    return props[i : j if j >= 0 else len(props)]


def message_keys(props: bytes) -> list[str]:
    """KEYS (space-separated) and UNIQ_KEY: what the index holds for a message."""
    keys: list[str] = []
    raw = property_value(props, KEYS_NAME)
    if raw:
        keys.extend(k for k in raw.decode("utf-8", "replace").split(" ") if k)
    uniq = property_value(props, UNIQ_NAME)
    if uniq:
        keys.append(uniq.decode("utf-8", "replace"))
    return keys


def may_have_keys(props: bytes) -> bool:
    """False when ``props`` certainly holds neither KEYS nor UNIQ_KEY (message_keys would return []): one bytes
    search each instead of parsing, for the common message without keys."""
    return KEYS_NAME in props or UNIQ_NAME in props


def contains(buf: Buffer, needle: bytes, start: int, end: int) -> bool:
    """Whether ``needle`` occurs in ``buf[start:end]``, searched in place when the buffer can (mmap, bytes)."""
    if isinstance(buf, (bytes, bytearray, mmap.mmap)):
        return buf.find(needle, start, end) >= 0
    return needle in bytes(buf[start:end])


def names_may_occur(buf: Buffer, start: int, end: int, name_ends: np.ndarray) -> bool:
    """Whether some \x01 in ``buf[start:end]`` follows one of the 4-byte ``name_ends`` (little-endian uint32s).

    A property name is always followed by \x01, so this is a superset of "one of the names occurs": "_KEY" stands
    for UNIQ_KEY and also admits names such as MY_KEY, which only sends the run down the per-entry path. One
    comparison over the bytes finds the \x01s (a few per entry), then one gather reads the 4 bytes before each.
    """
    arr = np.frombuffer(buf, np.uint8, count=end - start, offset=start)
    ends = np.flatnonzero(arr[4:] == 1)  # index i: a \x01 at i + 4, with 4 bytes before it
    found = ends.size > 0 and bool(np.isin(rows_at(arr, ends, 4).view("<u4").ravel(), name_ends).any())
    del arr  # the view holds an export of the mapped file (it could not be closed while one is alive)
    return found


class UniqTails(NamedTuple):
    """A producer's run of properties sections: the prefix they share, and each one's UNIQ_KEY as a row of
    UNIQ_KEY_CHARS printable ASCII bytes (one character each: the index hashes them without making strings)."""

    prefix: bytes
    chars: np.ndarray  # (sections, UNIQ_KEY_CHARS) uint8

    def keys(self) -> list[str]:
        """Each section's UNIQ_KEY as text."""
        text = self.chars.tobytes().decode("ascii")
        return [text[k : k + UNIQ_KEY_CHARS] for k in range(0, len(text), UNIQ_KEY_CHARS)]


def uniq_tails(buf: Buffer, starts: np.ndarray, lengths: np.ndarray) -> UniqTails | None:
    """The shared prefix and each section's UNIQ_KEY when every properties section is one shared prefix followed by
    a UNIQ_KEY of UNIQ_KEY_CHARS printable ASCII characters, last, as a Sluice producer appends it; else None.
    Then ``message_keys`` of each section is the prefix's keys and its UNIQ_KEY (the prefix holds no UNIQ_KEY name,
    so the tail's is the first), found with a few numpy comparisons instead of parsing every section."""
    prefix_lengths = lengths - _UNIQ_TAIL_BYTES
    if (prefix_lengths < 0).any():
        return None
    arr = np.frombuffer(buf, np.uint8)
    tails = rows_at(arr, starts + prefix_lengths, _UNIQ_TAIL_BYTES)
    del arr
    values = tails[:, len(UNIQ_NAME) : -1]
    if not ((tails[:, : len(UNIQ_NAME)] == _UNIQ_NAME_BYTES).all() and (tails[:, -1] == 2).all()):
        return None
    if ((values < 0x20) | (values >= 0x7F)).any():  # separators, other controls or UTF-8: the parsing path
        return None
    if (prefix_lengths == 0).all():
        prefix = b""
    else:
        same = same_bytes(buf, starts, prefix_lengths)
        if same is None or not same.endswith(b"\x02") or same.startswith(UNIQ_NAME) or b"\x02" + UNIQ_NAME in same:
            return None
        prefix = same
    return UniqTails(prefix, np.ascontiguousarray(values))


def same_bytes(buf: Buffer, starts: np.ndarray, lengths: np.ndarray) -> bytes | None:
    """The bytes at every (start, length) when they are all the same, else None (no per-entry Python loop)."""
    width = int(lengths[0])
    first = bytes(buf[int(starts[0]) : int(starts[0]) + width])
    last = int(starts[-1])
    if bytes(buf[last : last + int(lengths[-1])]) != first:  # cheap early exit for the varied case
        return None
    if starts.size == 1:
        return first
    if (lengths != width).any():
        return None
    arr = np.frombuffer(buf, np.uint8)
    rows = rows_at(arr, starts, width)
    del arr
    same = bool((rows == np.frombuffer(first, np.uint8)).all())
    return first if same else None
