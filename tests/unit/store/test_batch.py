"""put_batch: client-encoded buffers, validated completely before one write; bad ones change nothing."""

from __future__ import annotations

import struct
import threading
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import MessageIllegalError
from broker.format.batch import (
    SMALL_BATCH_ENTRIES,
    _py_walk,
    _small_entry,
    _small_topic,
    scan,
    validate_small_batch,
    walk,
)
from broker.format.message import (
    SysFlag,
    encode_entry,
    encode_properties,
    parse_layout,
    tag_hash_code,
    takes_queue_offset,
)
from broker.store import GetStatus, MessageStore, PutStatus


def _entry(
    topic: bytes = b"B", qid: int = 0, body: bytes = b"body", tags: str = "", keys: str = "", **kw: int
) -> bytes:
    props = {k: v for k, v in (("TAGS", tags), ("KEYS", keys)) if v}
    return encode_entry(topic, qid, body, encode_properties(props), **kw)


def _snapshot(store: MessageStore) -> tuple[int, dict[tuple[str, int], int], bytes]:
    f = store.commit_log.files.last()
    return store.commit_log.max_offset, dict(store.commit_log.queue_table), f.mm[:] if f else b""


def test_batch_assigns_offsets_per_queue_in_order(store: MessageStore) -> None:
    store.put_message("B", 0, b"before")
    buf = b"".join(
        _entry(b"B" if i % 2 else b"C", i % 3, b"%d" % i, tags=f"t{i % 2}" if i % 4 else "", keys=f"k{i}")
        for i in range(12)
    )
    r = store.put_batch(buf)
    assert r.status is PutStatus.PUT_OK and len(r.msg_ids) == 12
    expected: dict[tuple[str, int], int] = {("B", 0): 1}
    for i in range(12):
        key = ("B" if i % 2 else "C", i % 3)
        assert r.queue_offsets[i] == expected.get(key, 0)
        expected[key] = expected.get(key, 0) + 1
    assert r.commitlog_offsets == sorted(r.commitlog_offsets) and r.wrote_bytes == len(buf)
    store.wait_dispatched()
    for i, off in enumerate(r.commitlog_offsets):
        m = store.lookup_message(off)
        assert m is not None and m.body == b"%d" % i and m.queue_offset == r.queue_offsets[i]
        assert m.msg_id == r.msg_ids[i] and m.store_timestamp == r.store_timestamp
    assert [m.body for m in store.query_by_key("C", "k4")] == [b"4"]
    tagged = store.get_message("g", "B", 1, 0, 32, tag_codes={tag_hash_code("t1")})
    assert [m.body for m in tagged.messages()] == [b"1", b"7"]
    assert store.check() == []  # units (with tag hashes) and index built from the batch's dispatch hint


@pytest.mark.parametrize("pad", [0, 40])
def test_batch_with_transaction_halves(store: MessageStore, pad: int) -> None:
    buf = b"".join(_entry(qid=1, body=b"p") for _ in range(pad))
    buf += _entry(body=b"a") + _entry(body=b"half", sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE) + _entry(body=b"b")
    r = store.put_batch(buf)
    assert r.queue_offsets[pad:] == [0, 0, 1] and r.queue_offsets[:pad] == list(range(pad))
    store.wait_dispatched()
    assert [m.body for m in store.get_message("g", "B", 0, 0).messages()] == [b"a", b"b"]
    assert store.check() == []


@pytest.mark.parametrize(
    ("make_bad", "reason"),
    [
        (lambda good: b"\x00garbage" * 20, "malformed"),
        (lambda good: good[:-1], "malformed"),  # cut short: TOTALSIZE runs past the end
        (lambda good: good + b"\x01\x02\x03", "malformed"),  # trailing bytes
        (lambda good: good[:8] + struct.pack(">i", 12345) + good[12:], "CRC"),  # bad CRC, entry 0
        (lambda good: good[:84] + struct.pack(">i", 9999) + good[88:], "malformed"),  # bad BODY length
        (lambda good: good + _entry(topic=b"bad topic!"), "topic"),
        (lambda good: good + _entry(qid=-4), "queue id"),
        (lambda good: good + _entry(body=b"x" * 5000), "MESSAGE_SIZE_EXCEEDED"),
        (lambda good: good * 200, "MESSAGE_SIZE_EXCEEDED"),  # over max_batch_bytes
        (lambda good: b"", "empty"),
    ],
)
@pytest.mark.parametrize("pad", [0, 40], ids=["entry-by-entry", "vectorised"])
def test_bad_batches_change_nothing(store: MessageStore, make_bad: object, reason: str, pad: int) -> None:
    """Both validation paths (up to 32 entries one by one, more with numpy) refuse the same faults."""
    store.put_message("B", 0, b"existing")
    before = _snapshot(store)
    good = _entry(body=b"x" * 60)
    bad = b"".join(_entry(body=b"p%d" % i) for i in range(pad)) + make_bad(good)  # type: ignore[operator]
    if not make_bad(good):  # type: ignore[operator]
        bad = b""
    r = store.put_batch(bad)
    assert r.status is PutStatus.MESSAGE_ILLEGAL
    assert reason in r.error, r.error
    assert _snapshot(store) == before
    assert store.put_batch(good).queue_offsets == [1]  # the store still works, offsets unaffected
    assert store.check() == []


@pytest.mark.parametrize("pad", [0, 40])
def test_flipped_body_byte_names_the_entry(store: MessageStore, pad: int) -> None:
    good = b"".join(_entry(body=b"a" * 50) for _ in range(pad + 1)) + _entry(body=b"b" * 50) + _entry(body=b"c" * 50)
    pos = len(_entry(body=b"a" * 50)) * (pad + 1) + 88 + 7  # a byte inside body number pad + 1
    bad = bytearray(good)
    bad[pos] ^= 0xFF
    r = store.put_batch(bytes(bad))
    assert r.status is PutStatus.MESSAGE_ILLEGAL and f"batch entry {pad + 1}" in r.error and "CRC" in r.error
    assert store.commit_log.max_offset == 0


def test_scan_finds_entries_when_a_body_contains_the_magic(store: MessageStore) -> None:
    tricky = b"\xda\xa3\x20\xa7" * 3  # false candidates for the vectorised magic search
    bodies = [b"%d" % i + (tricky if i % 5 == 3 else b"") + b"." * (i % 7) for i in range(60)]  # varied sizes
    buf = b"".join(_entry(body=b) for b in bodies)
    run = scan(buf, 0, len(buf), verify_crc=True)
    assert len(run) == 60 and run.end == len(buf) and run.stop_reason == ""
    r = store.put_batch(buf)
    assert r.ok
    store.wait_dispatched()
    got: list[bytes] = []
    while len(got) < 60:  # a get stops at a consume-queue file's end (10 units here)
        got += [m.body for m in store.get_message("g", "B", 0, len(got), 64).messages()]
    assert got == bodies
    assert store.check() == []


def test_batch_rolls_to_the_next_file_whole(store: MessageStore) -> None:
    size = store.config.mapped_file_size_commit_log
    buf = b"".join(_entry(body=b"%04d" % i + b"." * 300) for i in range(20))  # ~8 KiB per batch
    offsets: list[int] = []
    for _ in range(5):
        r = store.put_batch(buf)
        assert r.ok
        offsets += r.commitlog_offsets
        first, last = r.commitlog_offsets[0], r.commitlog_offsets[-1]
        assert first // size == last // size  # a batch never straddles two files
    store.wait_dispatched()
    assert store.max_offset("B", 0) == 100
    assert store.check() == []


_MAGIC = b"\xda\xa3\x20\xa7"
_bodies = st.lists(
    st.one_of(
        st.binary(max_size=300), st.builds(lambda k, b: _MAGIC * k + b, st.integers(1, 4), st.binary(max_size=40))
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(bodies=_bodies, flip=st.integers(min_value=0), same_size=st.booleans())
def test_scan_finds_exactly_the_entries_and_never_invents_one(bodies: list[bytes], flip: int, same_size: bool) -> None:
    """Property: the vectorised walk equals following TOTALSIZE; after one flipped byte it returns a prefix."""
    if same_size:
        bodies = [b[:8].ljust(8, b"-") for b in bodies]  # exercises the same-size proof
    entries = [
        _entry(topic=b"T%d" % (i % 3), qid=i % 2, body=b, tags="x" if i % 2 else "") for i, b in enumerate(bodies)
    ]
    buf = b"".join(entries)
    expected = [sum(len(e) for e in entries[:i]) for i in range(len(entries))]
    run = scan(buf, 0, len(buf), verify_crc=True)
    assert run.positions.tolist() == expected and run.end == len(buf) and run.stop_reason == ""
    damaged = bytearray(buf)
    damaged[flip % len(buf)] ^= 0x5A
    run2 = scan(bytes(damaged), 0, len(damaged), verify_crc=True)
    got = run2.positions.tolist()
    assert got == expected[: len(got)]  # a prefix of the real entries, nothing invented
    if len(got) < len(expected):
        assert run2.stop_reason != ""


def _small_batch_by_definition(buf: bytes, max_body: int) -> tuple[list[int], list[tuple[str, int]], list[bool]]:
    """What validate_small_batch must return, from the definitions: parse_layout + check_crc on every entry."""
    positions, end, reason = _py_walk(buf, 0, len(buf), SMALL_BATCH_ENTRIES)
    assert reason is not None
    if reason or end != len(buf):
        raise MessageIllegalError("framing")
    ends = [*positions[1:], len(buf)]
    keys, counted = [], []
    for i, (pos, nxt) in enumerate(zip(positions, ends, strict=True)):
        raw = _small_entry(buf, pos, nxt, i, max_body)
        lay = parse_layout(buf, pos, nxt)
        keys.append((_small_topic(raw, i), lay.header.queue_id))
        counted.append(takes_queue_offset(lay.header.sys_flag, lay.header.prepared_transaction_offset))
    return positions, keys, counted


@settings(max_examples=300, deadline=None)
@given(
    bodies=st.lists(st.binary(max_size=120), min_size=1, max_size=SMALL_BATCH_ENTRIES),
    flips=st.lists(st.tuples(st.integers(min_value=0), st.integers(1, 255)), max_size=3),
    max_body=st.sampled_from([60, 1000]),
)
def test_small_batch_check_equals_the_definition(
    bodies: list[bytes], flips: list[tuple[int, int]], max_body: int
) -> None:
    """Property: the small-batch fast path (quick_layout, inline CRC and limits) accepts exactly what parse_layout
    + check_crc + the limits accept, with the same result, and refuses with the definition's message."""
    entries = [
        _entry(topic=b"T%d" % (i % 3), qid=i % 2, body=b, tags="x" if i % 2 else "", sys_flag=(i % 4) << 2)
        for i, b in enumerate(bodies)
    ]
    damaged = bytearray(b"".join(entries))
    for at, xor in flips:
        damaged[at % len(damaged)] ^= xor
    buf = bytes(damaged)
    try:
        want = _small_batch_by_definition(buf, max_body)
    except MessageIllegalError as e:
        with pytest.raises(MessageIllegalError) as got:
            validate_small_batch(buf, 1 << 20, max_body)
        if str(e) != "framing":
            assert got.value.message == e.message
        return
    small = validate_small_batch(buf, 1 << 20, max_body)
    assert small is not None
    assert (small.positions, small.keys, small.counted) == want


@settings(max_examples=150, deadline=None)
@given(
    bodies=_bodies,
    nudge=st.one_of(st.none(), st.tuples(st.integers(min_value=0), st.integers(-3, 3))),
    drop=st.booleans(),
    flip=st.one_of(st.none(), st.integers(min_value=0)),
)
def test_known_positions_change_nothing_the_walk_finds(
    bodies: list[bytes], nudge: tuple[int, int] | None, drop: bool, flip: int | None
) -> None:
    """Property: positions handed to the walk are used only when they are exactly what following TOTALSIZE finds;
    wrong ones (nudged, one missing) and damaged bytes give the walk's own answer."""
    entries = [_entry(topic=b"K", qid=i % 3, body=b) for i, b in enumerate(bodies)]
    buf = bytearray(b"".join(entries))
    known = np.cumsum([0] + [len(e) for e in entries[:-1]]).astype(np.int64)
    if nudge is not None:
        known[nudge[0] % known.size] += nudge[1]
    if drop and known.size > 1:
        known = np.delete(known, known.size // 2)
    if flip is not None:
        buf[flip % len(buf)] ^= 0x41
    data = bytes(buf)
    want = walk(data, 0, len(data))
    got = walk(data, 0, len(data), known)
    assert got[0].tolist() == want[0].tolist() and got[1:] == want[1:]


def test_topic_deletion_racing_small_batches_gives_no_offset_twice(make_store: Any) -> None:
    """A small batch read the queue-offset table before taking the append lock, and delete_topic replaced that
    table under the lock: the batch took its offsets from the old table, later puts took them again, and the
    first batch's messages had no consume-queue unit (acknowledged, never readable)."""
    s = make_store(mapped_file_size_commit_log=1 << 20)
    stop = threading.Event()
    acked: list[int] = []

    def sender() -> None:
        i = 0
        while not stop.is_set():
            r = s.put_batch(b"".join(encode_entry(b"Keep", 0, b"%d" % (i + k)) for k in range(5)))
            assert r.ok, r.error
            acked.extend(r.queue_offsets)
            i += 5
            time.sleep(0.0002)  # paced: a few thousand messages, many of them blocked behind a deletion

    t = threading.Thread(target=sender)
    t.start()
    try:
        for i in range(80):
            assert s.put_message(f"Del{i}", 0, b"x").ok
            s.delete_topic(f"Del{i}")
    finally:
        stop.set()
        t.join()
    assert sorted(acked) == list(range(len(acked)))  # every acknowledged offset once
    assert s.wait_dispatched()
    bodies: list[bytes] = []
    while len(bodies) < len(acked):
        got = s.get_message("g", "Keep", 0, len(bodies), 1000, max_bytes=1 << 24)
        assert got.status == GetStatus.FOUND, (got.status, len(bodies))
        bodies.extend(m.body for m in got.messages())
    assert bodies == [b"%d" % i for i in range(len(acked))]
