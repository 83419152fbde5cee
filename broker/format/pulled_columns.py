"""The fields of many entries of one buffer at once: what ``decode_entry`` gives each entry, as one column a field.

Why: a consumer that reads every field of every pulled message (body, tags, keys, properties, ids, offsets,
timestamps) paid ``decode_entry``'s cost entry by entry, some 8 us a message, four times what the pull itself
costs; a Redis Streams client builds every field of an entry for less. Most of it was fixed Python cost per entry
and field (a header NamedTuple, two host strings and a message id formatted, a UTF-8 decode and a split for the
properties), which the columns here pay once an answer:

- the header's numbers come from one numpy record array (``batch.headers``), a ``tolist`` a field;
- a host string is made once for each distinct (address, port) of the answer (an answer comes from one broker,
  and its producers are few), a message id's 16 hexadecimal digits for all entries at once;
- a topic is decoded once when every entry has the same (a pull reads one queue of one topic);
- the PROPERTIES sections are gathered into one buffer, checked in one pass to be ``name\\x01value\\x02`` pairs
  and valid UTF-8 (what every send path stores: ``properties.py``), decoded and split once, and each entry's dict
  built from its share of the pairs (with the names shared by every entry when their names agree).

Each column equals ``decode_entry``'s field for every entry, including the replacement characters of a section
that is not UTF-8 and the last value of a repeated name: whatever the fast path cannot prove it decodes exactly
(a section of another writer's form, invalid UTF-8, negative offsets in a message id) goes through the
definitions in ``message.py`` entry by entry. Property tests hold the two together
(tests/unit/format/test_pulled_columns.py).

The entries must be well framed (``parse_layout``'s rules): callers check the framing first, as
``broker/client/lazy_message.py`` does.
"""

from __future__ import annotations

from itertools import repeat
from typing import NamedTuple

import numpy as np

from broker.format.batch import gather, headers, rows_at
from broker.format.message import (
    ENTRY_HEADER,
    PROPS_LEN,
    decode_properties,
    msg_id_at,
    msg_id_prefix_of,
)

NAME_END = 1  # \x01 ends a property name
PAIR_END = 2  # \x02 ends a property value
OFFSET_DIGITS = 16  # a 64-bit commit-log offset in hexadecimal, as msg_id_at writes it
_NEWLINE = ord("\n")  # ends each id's row: never a hexadecimal digit
_BORN_IP_AT, _STORE_IP_AT = 48, 64  # ENTRY_HEADER's BORNHOST and STOREHOST addresses
assert ENTRY_HEADER.unpack(bytes(range(88)))[9] == bytes(range(_BORN_IP_AT, _BORN_IP_AT + 4))
assert ENTRY_HEADER.unpack(bytes(range(88)))[12] == bytes(range(_STORE_IP_AT, _STORE_IP_AT + 4))


class HeaderColumns(NamedTuple):
    """The fields of the 88-byte headers that StoredMessage exposes, besides queue id and offsets."""

    flag: list[int]
    sys_flag: list[int]
    born_timestamp: list[int]
    born_host: list[str]
    store_timestamp: list[int]
    store_host: list[str]
    reconsume_times: list[int]
    prepared_transaction_offset: list[int]
    store_size: list[int]
    msg_id: list[str]


def host_text(ip: bytes, port: int) -> str:
    """``decode_entry``'s host string (``socket.inet_ntoa``'s dotted address, then the port) without its calls."""
    return f"{ip[0]}.{ip[1]}.{ip[2]}.{ip[3]}:{port}"


def header_columns(buf: bytes, positions: np.ndarray) -> HeaderColumns:
    """The header fields of the entries starting at ``positions`` (int64), one list a field."""
    arr = np.frombuffer(buf, np.uint8)
    h = headers(arr, positions)
    physical = h["physical_offset"]
    born_hosts, _ = _hosts(arr, positions, _BORN_IP_AT, h["born_port"])
    store_hosts, store_keys = _hosts(arr, positions, _STORE_IP_AT, h["store_port"])
    return HeaderColumns(
        h["flag"].tolist(), h["sys_flag"].tolist(), h["born_timestamp"].tolist(), born_hosts,
        h["store_timestamp"].tolist(), store_hosts, h["reconsume_times"].tolist(),
        h["prepared_transaction_offset"].tolist(), h["total_size"].tolist(),
        _msg_ids(buf, positions, store_keys, physical.astype(np.int64)),
    )


def _hosts(arr: np.ndarray, positions: np.ndarray, ip_at: int, ports: np.ndarray) -> tuple[list[str], np.ndarray]:
    """(the host string of each entry, a key per entry that is equal exactly when address and port are): one
    string made for each distinct key."""
    ips = gather(arr, positions + ip_at, 4, ">u4").astype(np.uint64)
    keys = (ips << np.uint64(32)) | (ports.astype(np.int64) & 0xFFFFFFFF).astype(np.uint64)
    n = len(keys)
    if n == 0:
        return [], keys
    if (keys == keys[0]).all():  # the common case: one broker, one kind of producer
        return [_host_of(int(keys[0]))] * n, keys
    distinct, inverse = np.unique(keys, return_inverse=True)
    texts = [_host_of(k) for k in distinct.tolist()]
    return [texts[i] for i in inverse.ravel().tolist()], keys


def _host_of(key: int) -> str:
    port = key & 0xFFFFFFFF
    return host_text((key >> 32).to_bytes(4, "big"), port - (1 << 32) if port & 0x80000000 else port)


def _msg_ids(buf: bytes, positions: np.ndarray, store_keys: np.ndarray, physical: np.ndarray) -> list[str]:
    """``make_msg_id`` of each entry: its store host's prefix and the commit-log offset in 16 hexadecimal digits.
    The ids of all entries are made at once when they share one store host and no offset is negative (a negative
    one is written with a sign, as ``msg_id_at`` writes it): the offsets' big-endian bytes in hexadecimal
    (``bytes.hex``), each row prefixed and ended by a newline, then one decode and one split (half the time of
    numpy's digit lookup and a slice an id)."""
    n = len(physical)
    if n == 0:
        return []
    if not ((store_keys == store_keys[0]).all() and (physical >= 0).all()):
        out = []
        for p, offset in zip(positions.tolist(), physical.tolist(), strict=True):
            head = ENTRY_HEADER.unpack_from(buf, p)
            out.append(msg_id_at(msg_id_prefix_of(head[12], head[13]), offset))
        return out
    head = ENTRY_HEADER.unpack_from(buf, int(positions[0]))
    prefix = msg_id_prefix_of(head[12], head[13]).encode("ascii")
    width = len(prefix)
    rows = np.empty((n, width + OFFSET_DIGITS + 1), np.uint8)
    rows[:, :width] = np.frombuffer(prefix, np.uint8)
    digits = physical.astype(">u8").tobytes().hex().upper().encode("ascii")
    rows[:, width:-1] = np.frombuffer(digits, np.uint8).reshape(n, OFFSET_DIGITS)
    rows[:, -1] = _NEWLINE
    ids = rows.tobytes().decode("ascii").split("\n")
    ids.pop()  # after the last newline
    return ids


def topic_column(buf: bytes, tails: np.ndarray) -> list[str]:
    """The topic of each entry whose TOPIC LEN byte is at ``tails`` (int64), decoded as ``decode_entry`` does."""
    n = len(tails)
    if n == 0:
        return []
    arr = np.frombuffer(buf, np.uint8)
    lengths = arr[tails].astype(np.int64)
    first_len, first = int(lengths[0]), int(tails[0])
    if (lengths == first_len).all():
        rows = rows_at(arr, tails + 1, first_len)
        if (rows == rows[0]).all():  # one topic for every entry: a pull reads one queue
            return [buf[first + 1 : first + 1 + first_len].decode("ascii", "replace")] * n
    seen: dict[bytes, str] = {}
    out = []
    for t, length in zip(tails.tolist(), lengths.tolist(), strict=True):
        raw = buf[t + 1 : t + 1 + length]
        text = seen.get(raw)
        if text is None:
            text = seen[raw] = raw.decode("ascii", "replace")
        out.append(text)
    return out


def properties_column(buf: bytes, tails: np.ndarray) -> list[dict[str, str]]:
    """The properties of each entry whose TOPIC LEN byte is at ``tails`` (int64), as ``decode_properties`` gives
    them."""
    n = len(tails)
    if n == 0:
        return []
    arr = np.frombuffer(buf, np.uint8)
    length_at = tails + 1 + arr[tails].astype(np.int64)
    starts = length_at + PROPS_LEN.size
    lengths = gather(arr, length_at, PROPS_LEN.size, ">i2")
    begin, end = starts.tolist(), (starts + lengths).tolist()
    found = _canonical_sections(buf, begin, end, np.cumsum(lengths), lengths > 0)
    if found is None:
        return [decode_properties(buf[a:b]) for a, b in zip(begin, end, strict=True)]
    return found


def _canonical_sections(
    buf: bytes, begin: list[int], end: list[int], ends: np.ndarray, filled: np.ndarray
) -> list[dict[str, str]] | None:
    """Every section's dict from one decode and one split, or None when some section is not a run of
    ``name\\x01value\\x02`` pairs in UTF-8 (then ``decode_properties``, the definition, decodes each). ``ends``:
    where each section ends in their concatenation; ``filled``: which are not empty."""
    joined = b"".join([buf[a:b] for a, b in zip(begin, end, strict=True)])
    if not joined:
        return [{} for _ in begin]
    data = np.frombuffer(joined, np.uint8)
    if (data[ends[filled] - 1] != PAIR_END).any():  # a section must end where a pair does
        return None
    seps = data[(data == NAME_END) | (data == PAIR_END)]
    # Each pair holds exactly one \x01 and ends with one \x02 (so no item is empty or lacks a name's end): then
    # splitting the whole text at both separators gives name, value, name, value... in order.
    if len(seps) % 2 or not ((seps[0::2] == NAME_END).all() and (seps[1::2] == PAIR_END).all()):
        return None
    try:
        flat = joined.replace(b"\x02", b"\x01").decode("utf-8").split("\x01")
    except UnicodeDecodeError:
        return None  # decode_properties decodes with replacement, section by section
    names, values = flat[0:-1:2], flat[1::2]
    bounds = np.searchsorted(np.flatnonzero(data == PAIR_END), ends)  # pairs before each section's end
    count = int(bounds[0])
    n = len(bounds)
    if count and (np.diff(bounds) == count).all() and all(names[j::count].count(names[j]) == n for j in range(count)):
        # every section holds the same names in the same order: one tuple of names (hashes computed once)
        columns = [values[j::count] for j in range(count)]
        alike = _ALIKE.get(count)
        if alike is not None:
            return alike(names[:count], columns)
        shared = tuple(names[:count])
        return list(map(dict, map(zip, repeat(shared), zip(*columns, strict=True))))
    ends_of = bounds.tolist()
    return [dict(zip(names[a:b], values[a:b], strict=True)) for a, b in zip([0, *ends_of[:-1]], ends_of, strict=True)]


# Dicts of the same names built by a dict display (about half what dict(zip(...)) costs a message), for the common
# numbers of properties: TAGS, KEYS and UNIQ_KEY with a few of the application's own. A name twice keeps its first
# place and its last value in a display as in dict(zip(...)).
def _alike_1(k: list[str], c: list[list[str]]) -> list[dict[str, str]]:
    (k0,) = k
    return [{k0: a} for a in c[0]]


def _alike_2(k: list[str], c: list[list[str]]) -> list[dict[str, str]]:
    k0, k1 = k
    return [{k0: a, k1: b} for a, b in zip(*c, strict=True)]


def _alike_3(k: list[str], c: list[list[str]]) -> list[dict[str, str]]:
    k0, k1, k2 = k
    return [{k0: a, k1: b, k2: d} for a, b, d in zip(*c, strict=True)]


def _alike_4(k: list[str], c: list[list[str]]) -> list[dict[str, str]]:
    k0, k1, k2, k3 = k
    return [{k0: a, k1: b, k2: d, k3: e} for a, b, d, e in zip(*c, strict=True)]


def _alike_5(k: list[str], c: list[list[str]]) -> list[dict[str, str]]:
    k0, k1, k2, k3, k4 = k
    return [{k0: a, k1: b, k2: d, k3: e, k4: f} for a, b, d, e, f in zip(*c, strict=True)]


def _alike_6(k: list[str], c: list[list[str]]) -> list[dict[str, str]]:
    k0, k1, k2, k3, k4, k5 = k
    return [{k0: a, k1: b, k2: d, k3: e, k4: f, k5: g} for a, b, d, e, f, g in zip(*c, strict=True)]


_ALIKE = {1: _alike_1, 2: _alike_2, 3: _alike_3, 4: _alike_4, 5: _alike_5, 6: _alike_6}

__all__ = ["HeaderColumns", "header_columns", "host_text", "properties_column", "topic_column"]
