"""Index runs: ``IndexService.put_many`` (numpy hashes, entries written a run at a time) against a reference
written from the format alone, byte for byte, on random keys, collisions, file rolls and torn slots."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.format.message import java_string_hash
from broker.store.index_file import (
    INDEX_ENTRY,
    INDEX_HEADER,
    INDEX_SLOT,
    VECTOR_MIN_KEYS,
    IndexService,
    key_hash,
    key_hashes,
    prefixed_key_hashes,
)

Message = tuple[str, list[str], int, int]


def reference_index(messages: list[Message], slots: int, entries: int) -> list[bytes]:
    """The index files that messages indexed one by one, from the module docstring's layout, must give."""
    files: list[bytearray] = []
    size = INDEX_HEADER.size + slots * INDEX_SLOT.size + entries * INDEX_ENTRY.size
    header = [0, 0, 0, 0, slots, 1]
    for topic, keys, phys, ts in messages:
        hashes = list(dict.fromkeys(key_hash(f"{topic}#{k}") for k in keys if k))[: entries - 2]
        if not hashes:
            continue
        if not files or header[5] + len(hashes) > entries:
            files.append(bytearray(size))
            header = [0, 0, 0, 0, slots, 1]
        f = files[-1]
        begin_ts = header[0] or ts
        begin_phy = header[2] if header[5] > 1 else phys
        for kh in hashes:
            slot_at = INDEX_HEADER.size + (kh % slots) * INDEX_SLOT.size
            prev = INDEX_SLOT.unpack_from(f, slot_at)[0]
            at = INDEX_HEADER.size + slots * INDEX_SLOT.size + header[5] * INDEX_ENTRY.size
            INDEX_ENTRY.pack_into(f, at, kh, phys, max(0, (ts - begin_ts) // 1000), prev)
            INDEX_SLOT.pack_into(f, slot_at, header[5])
            header[5] += 1
        header[:4] = [begin_ts, ts, begin_phy, phys]
        INDEX_HEADER.pack_into(f, 0, *header)
    return [bytes(f) for f in files]


def written(directory: Path) -> list[bytes]:
    return [(directory / name).read_bytes() for name in sorted(os.listdir(directory))]


def service(directory: Path, slots: int, entries: int) -> IndexService:
    index = IndexService(str(directory), slots, entries, os.fsync, sync_dir=lambda _: None)
    index.load()
    return index


KEY = st.text(alphabet=st.sampled_from("0123456789ABCDEF#é"), min_size=0, max_size=6) | st.sampled_from(
    ["K" * 32, "L" * 32, "ü" * 3]
)


@st.composite
def message_runs(draw: st.DrawFn) -> list[Message]:
    n = draw(st.integers(1, 3 * VECTOR_MIN_KEYS))
    phys, ts = 0, draw(st.integers(1, 10**12))  # a store time is never 0 (0 marks an empty header)
    out: list[Message] = []
    for _ in range(n):
        phys += draw(st.integers(1, 500))
        ts += draw(st.integers(0, 2_500))
        out.append((draw(st.sampled_from(["T", "Topic", "ü"])), draw(st.lists(KEY, max_size=4)), phys, ts))
    return out


@settings(max_examples=100, deadline=None)
@given(runs=st.lists(message_runs(), min_size=1, max_size=4), slots=st.sampled_from([1, 7, 64]),
       entries=st.sampled_from([3, 9, 40, 1000]))
def test_runs_write_the_files_one_by_one_indexing_writes(
    tmp_path_factory: object, runs: list[list[Message]], slots: int, entries: int
) -> None:
    directory = tmp_path_factory.mktemp("index")  # type: ignore[attr-defined]
    index = service(directory, slots, entries)
    base = 0  # each run follows the one before in the commit log, as dispatch passes do
    for run in runs:
        run[:] = [(topic, keys, base + phys, ts) for topic, keys, phys, ts in run]
        base = run[-1][2]
        index.put_many(run)
    expected = reference_index([m for run in runs for m in run], slots, entries)
    assert written(directory) == expected
    index.close()


def test_a_run_of_one_key_a_message_rolls_files_as_one_by_one_indexing(tmp_path: Path) -> None:
    run = [("T", [f"{i:032X}"], 100 * (i + 1), 1_000 * (i + 1)) for i in range(3 * VECTOR_MIN_KEYS + 5)]
    index = service(tmp_path, 8, 9)
    index.put_many(run)
    assert written(tmp_path) == reference_index(run, 8, 9)
    assert len(index.files) == 7  # 53 entries, 8 to a file of 9 (entry 0 is unused)
    index.close()


def test_a_run_already_indexed_is_skipped_whole_and_a_later_one_appended(tmp_path: Path) -> None:
    index = service(tmp_path, 16, 1000)
    run = [("T", [f"{i:032X}"], 100 * (i + 1), 1_000 + i) for i in range(40)]
    index.put_many(run)
    index.put_many(run)  # a re-dispatch after recovery: nothing twice
    later = [("T", ["k"], 9_000, 2_000)]
    index.put_many(later)
    assert written(tmp_path) == reference_index(run + later, 16, 1000)
    index.close()


def test_a_torn_slot_past_the_count_starts_a_new_chain(tmp_path: Path) -> None:
    index = service(tmp_path, 4, 1000)
    index.put_many([("T", [f"a{i}"], i + 1, 0) for i in range(3)])
    f = index.files[0]
    slot = key_hash("T#b0") % 4
    struct.pack_into(">i", f.mm, INDEX_HEADER.size + slot * INDEX_SLOT.size, 999)  # as a crash may leave it
    index.put_many([("T", [f"b{i}"], 10 + i, 0) for i in range(VECTOR_MIN_KEYS)])
    first_b = f.entry(4)
    assert first_b.key_hash == key_hash("T#b0") and first_b.prev_index == 0
    index.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=40) | st.text(alphabet="0123456789ABCDEF", min_size=32, max_size=32), max_size=60))
def test_vector_hashes_are_javas_string_hash(keys: list[str]) -> None:
    assert key_hashes(keys).tolist() == [key_hash(k) for k in keys]


def test_the_hash_of_min_int_is_zero_in_both_paths() -> None:
    # "polygenelubricants".hashCode() is Integer.MIN_VALUE in Java
    assert java_string_hash("polygenelubricants") == -(1 << 31)
    assert key_hashes(["polygenelubricants"] * VECTOR_MIN_KEYS).tolist() == [0] * VECTOR_MIN_KEYS


@settings(max_examples=100, deadline=None)
@given(length=st.integers(0, 300), count=st.integers(VECTOR_MIN_KEYS, 80), data=st.data())
def test_keys_of_one_length_hash_in_one_product_as_javas_string_hash(
    length: int, count: int, data: st.DataObject
) -> None:
    ascii_text = st.text(alphabet=st.characters(max_codepoint=127), min_size=length, max_size=length)
    keys = [data.draw(ascii_text) for _ in range(count)]
    assert key_hashes(keys).tolist() == [key_hash(k) for k in keys]


@settings(max_examples=200, deadline=None)
@given(prefixes=st.lists(st.text(max_size=20).map(lambda t: t + "#"), min_size=1, max_size=4),
       length=st.integers(0, 40), data=st.data())
def test_prefixed_hashes_are_the_hash_of_the_whole_key(prefixes: list[str], length: int, data: st.DataObject) -> None:
    """The dispatcher's UNIQ_KEY path: "topic#" hashed once, each key's printable ASCII bytes in one product; the
    same as ``key_hash`` of the whole string, whatever the topic (even beyond ASCII: it is hashed in UTF-16)."""
    printable = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=length,
                        max_size=length)
    keys = data.draw(st.lists(printable, min_size=1, max_size=30))
    which = np.array(data.draw(st.lists(st.integers(0, len(prefixes) - 1), min_size=len(keys), max_size=len(keys))))
    chars = np.frombuffer("".join(keys).encode("ascii"), np.uint8).reshape(len(keys), length)
    expected = [key_hash(prefixes[w] + k) for w, k in zip(which.tolist(), keys, strict=True)]
    assert prefixed_key_hashes(prefixes, which, chars).tolist() == expected


def test_the_prefixed_hash_of_min_int_is_zero() -> None:
    chars = np.frombuffer(b"ubricants", np.uint8).reshape(1, 9)
    assert prefixed_key_hashes(["polygenel"], np.array([0]), chars).tolist() == [0]


@settings(max_examples=60, deadline=None)
@given(count=st.integers(1, 3 * VECTOR_MIN_KEYS), slots=st.sampled_from([1, 7, 64]),
       entries=st.sampled_from([3, 9, 1000]), skip=st.integers(0, 5))
def test_hashed_runs_write_what_put_many_writes(
    tmp_path_factory: object, count: int, slots: int, entries: int, skip: int
) -> None:
    """``put_hashed`` (one key a message, hashed by the caller) against ``put_many`` of the same messages, byte
    for byte: file rolls, a single message, and a re-dispatch of messages already indexed."""
    run = [("T", [f"{i:032X}"], 100 * (i + 1), 1_000 * (i + 1)) for i in range(count)]
    by_key, hashed = (tmp_path_factory.mktemp(n) for n in ("by-key", "hashed"))  # type: ignore[attr-defined]
    reference, index = service(by_key, slots, entries), service(hashed, slots, entries)
    for target in (reference, index):
        target.put_many(run[:skip])  # indexed before: put_hashed must skip them as put_many does
    reference.put_many(run)
    index.put_hashed(np.array([key_hash(f"T#{keys[0]}") for _t, keys, _p, _ts in run], np.int64),
                     np.array([p for *_, p, _ts in run], np.int64), np.array([ts for *_, ts in run], np.int64))
    assert written(hashed) == written(by_key) == reference_index(run, slots, entries)
    reference.close()
    index.close()
