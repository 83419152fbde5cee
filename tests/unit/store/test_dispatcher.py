"""Dispatcher: idempotent re-dispatch, batch hints equal to scanning, listeners, property parsing."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.format.message import encode_entry, encode_properties, tag_hash_code
from broker.store import MessageStore, property_scan
from broker.store import dispatcher as dispatcher_module
from broker.store.consume_queue import ConsumeQueue
from broker.store.property_scan import message_keys, names_may_occur, property_value
from broker.store.store_results import PutStatus
from tests.unit.store.conftest import small_config


def _batch(n: int, start: int = 0) -> bytes:
    return b"".join(
        encode_entry(b"D", i % 4, b"m%d" % i, encode_properties({"TAGS": f"t{i % 3}", "KEYS": f"k{i} x{i}"}))
        for i in range(start, start + n)
    )


def test_redispatch_from_the_start_changes_nothing(store: MessageStore) -> None:
    assert store.put_batch(_batch(40)).ok
    for i in range(10):
        assert store.put_message("D", i % 4, b"single%d" % i).ok
    assert store.wait_dispatched()
    units_before = {k: cq.max_offset for k, cq in store.queues.queues.items()}
    index_count = sum(f.header.index_count for f in store.index.files) if store.index else 0
    with store.dispatcher.lock:
        store.dispatcher.dispatched_offset = 0
    assert store.dispatcher.dispatch_available() == 50  # every entry seen again...
    assert {k: cq.max_offset for k, cq in store.queues.queues.items()} == units_before  # ...nothing added twice
    assert (sum(f.header.index_count for f in store.index.files) if store.index else 0) == index_count
    assert store.check() == []


def test_scanned_and_hinted_batches_build_the_same_units(
    make_store: Callable[..., MessageStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    hinted = make_store()
    assert hinted.put_batch(_batch(60)).ok
    assert hinted.wait_dispatched()
    expected = {k: cq.read_units(0, 1000) for k, cq in hinted.queues.queues.items()}
    hinted.shutdown()
    # same batch, but no hint accepted: the dispatcher scans the file itself
    monkeypatch.setattr(dispatcher_module, "MAX_HINTED_ENTRIES", 0)
    shutil.rmtree(hinted.config.store_path)
    scanned = make_store()
    assert scanned.put_batch(_batch(60)).ok
    assert scanned.wait_dispatched()
    got = {k: cq.read_units(0, 1000) for k, cq in scanned.queues.queues.items()}
    assert got.keys() == expected.keys()
    for k in got:  # same offsets, sizes and tag hashes (commit-log offsets equal: same bytes, same order)
        assert got[k] == expected[k], k
    assert scanned.check() == []


def test_listeners_hear_each_queue_once_per_pass(store: MessageStore) -> None:
    heard: list[tuple[str, int, int]] = []
    store.add_arrival_listener(lambda t, q, m: heard.append((t, q, m)))
    assert store.put_batch(_batch(20)).ok
    assert store.wait_dispatched()
    assert sorted(heard) == [("D", 0, 5), ("D", 1, 5), ("D", 2, 5), ("D", 3, 5)]


def test_property_parsing_without_decoding_everything() -> None:
    props = encode_properties({"KEYS": "a b  c", "TAGS": "TagA", "UNIQ_KEY": "U1", "XTAGS": "no"})
    assert property_value(props, b"TAGS\x01") == b"TagA"
    assert property_value(props, b"KEYS\x01") == b"a b  c"
    assert property_value(props, b"NOPE\x01") is None
    assert property_value(encode_properties({"XTAGS": "no"}), b"TAGS\x01") is None
    assert message_keys(props) == ["a", "b", "c", "U1"]


def _reference_tag(props: dict[str, str]) -> int:
    return tag_hash_code(props.get("TAGS") or None)


@pytest.mark.parametrize("census", [False, True], ids=["searched", "census"])
@pytest.mark.parametrize("shape", ["same", "varied", "single", "single_vectorised", "small_batches"])
def test_tag_codes_and_keys_equal_full_decoding(
    make_store: Callable[..., MessageStore], shape: str, census: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dispatcher's shortcuts (one parse for identical properties, cached tag codes, no key parsing without
    KEYS/UNIQ_KEY) give the units and index entries a full decode of every message gives. ``census``: passes of
    any size look for the names with names_may_occur (long runs do), else with one search per name."""
    monkeypatch.setattr(dispatcher_module, "CENSUS_MIN_BYTES", 0 if census else 1 << 40)
    variants = [
        {"TAGS": "TagA"},
        {"a": "1", "TAGS": "\u00e9t\u00e9", "KEYS": "k1 k2"},  # TAGS not first, non-ASCII
        {"XTAGS": "no", "UNIQ_KEY": "U9"},  # a name ending in TAGS is not TAGS
        {"TAGS": ""},  # empty tag: code 0
        {"b": "KEYS"},  # the word KEYS as a value is not a key
        {},
    ]
    n = 90  # over SMALL_BATCH_ENTRIES, under the test store's batch limit
    chosen = [variants[0] if shape == "same" else variants[i % len(variants)] for i in range(n)]
    if shape == "single_vectorised":  # unhinted runs of any size through the numpy pass, not the scalar one
        monkeypatch.setattr(dispatcher_module, "SCALAR_DISPATCH_BYTES", 0)
    s = make_store()
    if shape.startswith("single"):
        for i, p in enumerate(chosen[:40]):
            assert s.put_message("P", 0, b"m%d" % i, p).ok
        chosen = chosen[:40]
    elif shape == "small_batches":  # several small batches per dispatcher pass: the per-entry (scalar) path
        entries = [encode_entry(b"P", 0, b"m%d" % i, encode_properties(p)) for i, p in enumerate(chosen)]
        for at in range(0, n, 7):
            assert s.put_batch(b"".join(entries[at : at + 7])).ok
    else:
        assert s.put_batch(
            b"".join(encode_entry(b"P", 0, b"m%d" % i, encode_properties(p)) for i, p in enumerate(chosen))
        ).ok
    assert s.wait_dispatched()
    cq = s.queues.find("P", 0)
    assert cq is not None
    units = [cq.unit(k) for k in range(len(chosen))]
    got = [u.tag_hash if u is not None else None for u in units]
    assert got == [_reference_tag(p) for p in chosen]
    for key in ("k1", "k2", "U9", "KEYS", "1"):
        want = sum(1 for p in chosen if key in [*p.get("KEYS", "").split(" "), p.get("UNIQ_KEY", "")])
        assert len(s.query_by_key("P", key, max_num=1000)) == want, key
    assert s.check() == []


@pytest.mark.parametrize("census", [False, True], ids=["searched", "census"])
@pytest.mark.parametrize("tagged_at", [None, 0, 17, 39])
def test_varied_properties_with_and_without_tags(
    store: MessageStore, tagged_at: int | None, census: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Varied properties without TAGS skip the per-entry parse; one tagged entry anywhere (or a body that merely
    contains the bytes TAGS\\x01) must still give every unit its right tag code."""
    monkeypatch.setattr(dispatcher_module, "CENSUS_MIN_BYTES", 0 if census else 1 << 40)
    entries = []
    for i in range(40):
        props = {"seq": str(i)} | ({"TAGS": "Hot"} if i == tagged_at else {})
        body = b"TAGS\x01fake\x02" if i == 5 else b"m%d" % i
        entries.append(encode_entry(b"V", 0, body, encode_properties(props)))
    assert store.put_batch(b"".join(entries)).ok
    assert store.wait_dispatched()
    codes = [store.queues.queues[("V", 0)].unit(i).tag_hash for i in range(40)]  # type: ignore[union-attr]
    assert codes == [tag_hash_code("Hot") if i == tagged_at else 0 for i in range(40)]
    assert store.check() == []


def test_schedule_topic_units_carry_the_due_time(make_store: Callable[..., MessageStore]) -> None:
    """As RocketMQ's consume queue of SCHEDULE_TOPIC_XXXX: tag = store time + the delay of level queue id + 1,
    on the single-put path, the batch path, and when the units are rebuilt from the commit log."""
    store = make_store(delay_level_ms=(1000, 5000, 10000))
    assert store.put_message("SCHEDULE_TOPIC_XXXX", 1, b"single", {"DELAY": "2"}).ok
    batch = b"".join(encode_entry(b"SCHEDULE_TOPIC_XXXX", q, b"b%d" % q, encode_properties({"TAGS": "x"}))
                     for q in (0, 2, 7))
    assert store.put_batch(batch).ok
    assert store.put_message("Plain", 0, b"p", {"TAGS": "x"}).ok
    assert store.wait_dispatched()

    def tags() -> dict[tuple[int, int], int]:
        out = {}
        for (topic, q), cq in store.queues.queues.items():
            if topic == "SCHEDULE_TOPIC_XXXX":
                for off in range(cq.max_offset):
                    unit = cq.unit(off)
                    assert unit is not None
                    msg = store.lookup_message(unit.commitlog_offset)
                    assert msg is not None
                    out[(q, off)] = unit.tag_hash - msg.store_timestamp
        return out

    assert tags() == {(1, 0): 5000, (0, 0): 1000, (2, 0): 10000, (7, 0): 10000}  # past the table: the last delay
    assert store.queues.queues[("Plain", 0)].unit(0).tag_hash == tag_hash_code("x")  # type: ignore[union-attr]
    for cq in store.queues.queues.values():  # rebuilt from the commit log: the same tags
        cq.files.truncate(0)
    with store.dispatcher.lock:
        store.dispatcher.dispatched_offset = 0
    store.dispatcher.dispatch_available()
    assert tags() == {(1, 0): 5000, (0, 0): 1000, (2, 0): 10000, (7, 0): 10000}
    assert store.check() == []


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([b"x", b"\x01", b"\x02", b"TAGS", b"KEYS", b"UNIQ_KEY", b"_KEY", b"AGS", b"MY"])),
    st.integers(0, 8),
)
def test_names_census_finds_every_name(pieces: list[bytes], cut: int) -> None:
    """names_may_occur over any bytes (and any start): True wherever one search per name finds TAGS\\x01,
    KEYS\\x01 or UNIQ_KEY\\x01, so a run it clears really has no tag or key to parse."""
    data = b"".join(pieces)
    start = min(cut, len(data))
    searched = any(data.find(n, start) >= 0 for n in (b"TAGS\x01", b"KEYS\x01", b"UNIQ_KEY\x01"))
    indexed, tags_only = property_scan.INDEXED_NAME_ENDS, property_scan.TAG_NAME_END
    assert names_may_occur(data, start, len(data), indexed) >= searched
    assert names_may_occur(data, start, len(data), tags_only) >= (data.find(b"TAGS\x01", start) >= 0)
    if b"\x01" not in data[start:]:
        assert not names_may_occur(data, start, len(data), indexed)


def test_names_census_is_exact_on_property_names() -> None:
    """Over encoded entries the census answers for the names themselves (a name merely ending in TAGS is a
    false alarm that costs only time, stated here so that a change in it is seen)."""

    def run(props: dict[str, str]) -> bytes:
        return b"".join(encode_entry(b"T", 0, b"body %d" % i, encode_properties(props)) for i in range(50))

    indexed, tags_only = property_scan.INDEXED_NAME_ENDS, property_scan.TAG_NAME_END
    for props, want_indexed, want_tags in [
        ({"a": "1", "REAL_QID": "3"}, False, False),
        ({"TAGS": "t"}, True, True),
        ({"KEYS": "k"}, True, False),
        ({"UNIQ_KEY": "u"}, True, False),
        ({"MY_KEY": "v"}, True, False),  # ends in _KEY: a false alarm
        ({"XTAGS": "v"}, True, True),  # ends in TAGS: a false alarm
        ({"v": "TAGS"}, False, False),  # the word as a value is followed by \x02, not \x01
    ]:
        buf = run(props)
        assert names_may_occur(buf, 0, len(buf), indexed) is want_indexed, props
        assert names_may_occur(buf, 0, len(buf), tags_only) is want_tags, props


def test_an_entry_bigger_than_a_dispatch_chunk_is_dispatched(
    make_store: Callable[..., MessageStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """max_message_size may exceed DISPATCH_CHUNK_BYTES: a pass whose limit cut the first entry found none
    complete and stopped there on every pass (the queue never saw that message nor any after it)."""
    monkeypatch.setattr(dispatcher_module, "DISPATCH_CHUNK_BYTES", 48 * 1024)  # as 8 MiB, scaled down
    s = make_store(mapped_file_size_commit_log=1 << 20, max_message_size=100 * 1024, max_batch_bytes=64 * 1024)
    assert s.put_message("Big", 0, b"a" * 100).ok
    big = s.put_message("Big", 0, b"b" * (90 * 1024))
    assert big.ok and big.wrote_bytes > dispatcher_module.DISPATCH_CHUNK_BYTES
    assert s.put_message("Big", 0, b"c" * 100).ok
    assert s.wait_dispatched(timeout_s=3.0)
    assert s.max_offset("Big", 0) == 3
    assert [m.body[:1] for m in s.get_message("g", "Big", 0, 0, 3, max_bytes=1 << 20).messages()] == [b"a", b"b", b"c"]
    assert s.check() == []


def test_dispatch_errors_back_off(
    make_store: Callable[..., MessageStore], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consume-queue file that cannot be created (ENOSPC) lasts: the service retried every 1 ms interval and
    logged an error each time (about a thousand lines a second, onto the full disk)."""
    s = make_store(dispatch_interval_ms=1, disk_reserve_bytes=0)  # with one, the refusal names the reserve used
    create = s.queues.find_or_create

    def disk_full(topic: str, queue_id: int) -> ConsumeQueue:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(s.queues, "find_or_create", disk_full)
    caplog.set_level(logging.ERROR, logger="broker.store")
    assert s.put_message("Full", 0, b"x").ok
    time.sleep(0.6)
    failed = [r for r in caplog.records if "dispatch failed" in r.getMessage()]
    assert 1 <= len(failed) <= 10, len(failed)
    monkeypatch.setattr(s.queues, "find_or_create", create)
    assert s.wait_dispatched(timeout_s=3.0)  # retried within the (at most 1 s) pause
    assert s.max_offset("Full", 0) == 1
    assert s.check() == []


def test_puts_are_refused_while_dispatch_fails(
    make_store: Callable[..., MessageStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While consume queues cannot be written, the store acknowledged puts that no consumer could see (as
    RocketMQ's logic-queue error bit, it now refuses them) and takes writes again once a dispatch pass works."""
    s = make_store(dispatch_interval_ms=1, disk_reserve_bytes=0)  # with one, the refusal names the reserve used
    create = s.queues.find_or_create

    def disk_full(topic: str, queue_id: int) -> ConsumeQueue:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(s.queues, "find_or_create", disk_full)
    assert s.put_message("Full", 0, b"x").ok
    deadline = time.monotonic() + 3.0
    while s.is_writable() and time.monotonic() < deadline:
        time.sleep(0.01)
    refused = s.put_message("Other", 0, b"y")
    assert refused.status == PutStatus.SERVICE_NOT_AVAILABLE
    assert "consume queues cannot be written" in refused.error and "No space left" in refused.error
    assert s.max_offset("Other", 0) == 0
    monkeypatch.setattr(s.queues, "find_or_create", create)
    assert s.wait_dispatched(timeout_s=3.0)
    deadline = time.monotonic() + 3.0  # the service clears the refusal just after its pass returns
    while not s.is_writable() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.put_message("Other", 0, b"y").ok
    assert s.wait_dispatched(timeout_s=3.0)
    assert (s.max_offset("Full", 0), s.max_offset("Other", 0)) == (1, 1)
    assert s.check() == []


def test_a_put_wakes_the_dispatcher(make_store: Callable[..., MessageStore]) -> None:
    """Puts and batches make their entries visible at once, not at the dispatcher's next idle look: with a 5 s
    idle interval, each is dispatched in far less than that (a message's end-to-end time rests on it)."""
    s = make_store(dispatch_interval_ms=5000)
    time.sleep(0.05)  # the service has found nothing and sleeps its 5 s
    for i, put in enumerate([lambda: s.put_message("Wake", 0, b"x"),
                             lambda: s.put_batch(encode_entry(b"Wake", 0, b"y") * 2)]):
        started = time.monotonic()
        assert put().ok
        while s.max_offset("Wake", 0) < 1 + 2 * i:
            assert time.monotonic() - started < 2.0, "the put left its entry to the idle poll"
            time.sleep(0.001)
    assert s.check() == []


_TAIL_CHARS = st.sampled_from("0123456789ABCDEF") | st.sampled_from(["\x01", "\x02", "\u00e9", " ", "~", "\x7f"])


@settings(max_examples=300, deadline=None)
@given(
    prefix=st.sampled_from([{}, {"TAGS": "T"}, {"KEYS": "a b"}, {"UNIQ_KEY": "own"}, {"x": "UNIQ_KEY"}]),
    tails=st.lists(st.text(_TAIL_CHARS, min_size=30, max_size=33), min_size=1, max_size=20),
)
def test_unique_key_tails_are_found_as_parsing_finds_them(prefix: dict[str, str], tails: list[str]) -> None:
    """A producer's batch is one shared prefix of properties and each message's UNIQ_KEY last: the dispatcher
    finds the keys and tag with numpy comparisons (``uniq_tails``), or declines and parses each section. When it
    answers, the answer is what parsing each section gives."""
    head = encode_properties(prefix) if prefix else b""
    sections = [head + b"UNIQ_KEY\x01" + t.encode() + b"\x02" for t in tails]
    buf = b"".join(sections)
    lengths = np.array([len(x) for x in sections], np.int64)
    starts = np.cumsum(lengths) - lengths
    found = property_scan.uniq_tails(buf, starts, lengths)
    clean = all(len(t) == 32 and all(" " <= c < "\x7f" for c in t) for t in tails)
    if prefix in ({}, {"TAGS": "T"}, {"KEYS": "a b"}, {"x": "UNIQ_KEY"}) and clean:
        assert found is not None  # the shapes it is for are not declined
    if found is None:
        return
    shared, keys = found.prefix, found.keys()
    for section, key in zip(sections, keys, strict=True):
        assert message_keys(section) == [*message_keys(shared), key]
        assert property_value(section, b"TAGS\x01") == property_value(shared, b"TAGS\x01")


def test_a_producers_batch_is_indexed_and_tagged_as_full_decoding(
    make_store: Callable[..., MessageStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    from broker.client import Message
    from broker.client.outgoing_message import encode_message

    monkeypatch.setattr(dispatcher_module, "SCALAR_DISPATCH_BYTES", 0)  # the numpy pass, as for a large batch
    answers: list[bool] = []
    real = dispatcher_module.uniq_tails
    monkeypatch.setattr(dispatcher_module, "uniq_tails", lambda *a: answers.append(real(*a) is not None) or real(*a))
    s = make_store()
    msgs = [Message("Pb", b"m%d" % i, tags="hot", keys=["order"]) for i in range(60)]
    uniq = [f"{i:032X}" for i in range(60)]
    assert s.put_batch(b"".join(encode_message(m, 0, 1, uniq_key=u) for m, u in zip(msgs, uniq, strict=True))).ok
    assert s.wait_dispatched()
    assert answers == [True]
    cq = s.queues.find("Pb", 0)
    assert cq is not None
    assert {cq.unit(k).tag_hash for k in range(60)} == {tag_hash_code("hot")}  # type: ignore[union-attr]
    assert [m.body for m in s.query_by_key("Pb", uniq[23])] == [b"m23"]
    assert len(s.query_by_key("Pb", "order", max_num=1000)) == 60
    assert s.check() == []


def test_a_producers_unique_keys_are_indexed_from_their_bytes_as_by_parsing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer's batch whose only keys are the UNIQ_KEYs (the common batch) is indexed from the keys' bytes
    (``ProducerKeys``): the same index files, byte for byte but the store times, as parsing every section writes,
    and every message found by its key. Two topics in one run: each key is hashed under its own topic."""
    from broker.client import Message
    from broker.client.outgoing_message import encode_message

    monkeypatch.setattr(dispatcher_module, "SCALAR_DISPATCH_BYTES", 0)  # the numpy pass, as for a large batch
    uniq = [f"{i:032X}" for i in range(80)]
    batch = b"".join(encode_message(Message("Pa" if i % 3 else "Pb", b"m%d" % i, tags="hot"), i % 2, 1, uniq_key=u)
                     for i, u in enumerate(uniq))
    hashed_runs: list[int] = []
    real_hashes = dispatcher_module.prefixed_key_hashes
    monkeypatch.setattr(dispatcher_module, "prefixed_key_hashes",
                        lambda *a: hashed_runs.append(len(a[2])) or real_hashes(*a))
    indexed: list[str] = []
    for name, tails in (("from-bytes", dispatcher_module.uniq_tails), ("parsed", lambda *a: None)):
        monkeypatch.setattr(dispatcher_module, "uniq_tails", tails)
        store = MessageStore(small_config(str(tmp_path / name)))
        store.start()
        try:
            assert store.put_batch(batch).ok and store.wait_dispatched()
            for i in (0, 1, 2, 41, 79):
                assert [m.body for m in store.query_by_key("Pa" if i % 3 else "Pb", uniq[i])] == [b"m%d" % i]
            assert store.check() == []
        finally:
            store.shutdown()
        directory = tmp_path / name / "index"
        # past the header's two store times (each store stamps its own): slots, entries, offsets, counts
        indexed.append("".join((directory / f).read_bytes()[16:].hex() for f in sorted(os.listdir(directory))))
    assert indexed[0] == indexed[1]
    assert sum(hashed_runs) == len(uniq)  # the first store took the keys' bytes, the second parsed
