"""Torn writes that frame and CRC correctly: the tail of an entry (TOPIC, PROPERTIES) still zeros after a crash.

Recovery cuts the log at such an entry (logged with file and byte), the dispatcher never turns one into a path,
and put_batch refuses a client entry of that shape, naming it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.format.batch import first_bad_topic, first_incomplete_properties, scan
from broker.format.message import StoredMessage, encode_entry, encode_properties, is_topic_name, properties_complete
from broker.store import MessageStore, PutStatus


def _zero_tail(s: MessageStore, offset: int, size: int, nbytes: int) -> str:
    """Zero the last ``nbytes`` of the entry at ``offset`` (``size`` bytes) in its file, as a torn copy leaves it."""
    f = s.commit_log.files.find(offset)
    assert f is not None
    with open(f.path, "r+b") as fh:
        fh.seek(offset - f.file_from_offset + size - nbytes)
        fh.write(bytes(nbytes))
    return f.path


@pytest.mark.parametrize(
    ("props", "tail", "why"),
    [
        (None, 2 + 3, "is not a valid topic name"),  # "Orders" -> "Ord\0\0\0", PROPLEN 0 either way
        ({"KEYS": "order-1", "MY_PROP": "important-value"}, 20, "end with a zero byte"),
    ],
)
def test_a_torn_tail_is_cut_by_recovery(
    make_store: Callable[..., MessageStore],
    caplog: pytest.LogCaptureFixture,
    props: dict[str, str] | None,
    tail: int,
    why: str,
) -> None:
    s = make_store(flush_interval_consume_queue_ms=10**6)  # no checkpoint: recovery re-dispatches from 0
    assert s.put_message("Orders", 0, b"ok", {"KEYS": "k0"}).ok
    torn = s.put_message("Orders", 0, b"torn", props)
    off, size = torn.commitlog_offsets[0], torn.wrote_bytes
    s.wait_dispatched()
    s.abandon()
    path = _zero_tail(s, off, size, tail)
    caplog.set_level(logging.WARNING)
    s2 = make_store()  # raised ValueError (a NUL in a queue path) for the torn topic, kept the torn properties
    lines = [r.getMessage() for r in caplog.records]
    assert any(path in ln and f"byte {off}" in ln and why in ln for ln in lines), lines
    assert s2.recovery_report is not None and s2.recovery_report.truncated_at == off
    assert s2.topics() == ["Orders"] and s2.max_offset("Orders", 0) == 1
    assert s2.lookup_message(off) is None
    assert s2.put_message("Orders", 0, b"again").queue_offsets == [1]
    assert s2.check() == []


def test_the_dispatcher_stops_at_a_topic_that_is_not_a_name(
    make_store: Callable[..., MessageStore], caplog: pytest.LogCaptureFixture
) -> None:
    """An entry that reached the log without the put checks (damage while running): the dispatcher logs it with
    file and offset and stops there instead of raising; a restart's recovery then cuts the log there."""
    s = make_store()
    assert s.put_message("T", 0, b"before").ok
    s.wait_dispatched()
    bad = bytearray(encode_entry(b"T\0", 0, b"x"))
    phys, _, _ = s.commit_log.append_entry(bad, "T", 0, True)  # below the put checks, as damage would be
    caplog.set_level(logging.ERROR)
    assert not s.wait_dispatched(timeout_s=0.3)
    assert s.dispatcher.dispatched_offset == phys and s.topics() == ["T"]
    stuck = [r.getMessage() for r in caplog.records if "dispatcher stuck" in r.getMessage()]
    assert len(stuck) == 1 and f"offset {phys}" in stuck[0] and "00000000000000000000" in stuck[0], stuck
    refused = s.put_message("T", 0, b"after")  # would be acknowledged, then cut by the restart's recovery
    assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE, refused
    assert f"stuck at {stuck_file(s)} byte {phys}" in refused.error and "restart the broker" in refused.error
    assert s.put_batch(encode_entry(b"T", 0, b"batch")).error == refused.error and not s.is_writable()
    s.abandon()
    s2 = make_store()
    assert s2.recovery_report is not None and s2.recovery_report.truncated_at == phys
    assert s2.put_message("T", 0, b"after the restart").queue_offsets == [1]
    assert s2.check() == []


def stuck_file(s: MessageStore) -> str:
    f = s.commit_log.files.first()
    assert f is not None
    return f.path


@pytest.mark.parametrize("good_topic", [b"B", b"Z"])  # sorted before and after the bad one (keys are sorted)
def test_a_long_dispatch_pass_stops_at_the_bad_topic_whatever_the_key_order(
    make_store: Callable[..., MessageStore], good_topic: bytes
) -> None:
    """A numpy pass (over SCALAR_DISPATCH_BYTES) with good entries, then one whose topic is not a name: the good
    ones are dispatched under their own names, and the pass stops at the bad one."""
    s = make_store()
    s.wait_dispatched()
    with s.dispatcher.lock:  # every entry reaches the dispatcher in one pass
        for i in range(60):
            s.commit_log.append_entry(bytearray(encode_entry(good_topic, 0, b"%04d" % i + b"x" * 996)),
                                      good_topic.decode(), 0, True)
        phys, _, _ = s.commit_log.append_entry(bytearray(encode_entry(b"M\0", 0, b"bad")), "M", 0, True)
    assert not s.wait_dispatched(timeout_s=0.3)
    assert s.dispatcher.dispatched_offset == phys
    assert s.topics() == [good_topic.decode()] and s.max_offset(good_topic.decode(), 0) == 60
    s.abandon()
    s2 = make_store()
    assert s2.recovery_report is not None and s2.recovery_report.truncated_at == phys
    assert s2.check() == []


@pytest.mark.parametrize("count", [4, 40])  # the per-entry and the vectorised batch checks
def test_batch_properties_ending_in_a_zero_byte_are_refused(store: MessageStore, count: int) -> None:
    good = encode_properties({"TAGS": "a"})
    assert good.endswith(b"\x02")
    entries = [encode_entry(b"B", 0, b"%d" % i, good) for i in range(count)]
    entries[-2] = encode_entry(b"B", 0, b"torn", b"TAGS\x01a\x00\x00")  # what a cut copy leaves
    before = store.commit_log.max_offset
    r = store.put_batch(b"".join(entries))
    assert r.status is PutStatus.MESSAGE_ILLEGAL
    at = sum(len(e) for e in entries[:-2])
    assert f"batch entry {count - 2} (at byte {at})" in r.error and "end with a zero byte" in r.error, r.error
    assert "encode_properties" in r.error
    assert store.commit_log.max_offset == before
    assert store.check() == []


@pytest.mark.parametrize("count", [4, 40])
def test_properties_without_the_last_separator_are_kept(make_store: Callable[..., MessageStore], count: int) -> None:
    """RocketMQ's batch encoder allows for clients that leave the last \\x02 off: such entries are accepted, read
    as RocketMQ reads them, and never cut by recovery (the rule is "no zero at the end", not "ends with \\x02")."""
    s = make_store()
    buf = b"".join(encode_entry(b"B", 0, b"%d" % i, b"TAGS\x01a\x02MY\x01v") for i in range(count))
    assert s.put_batch(buf).ok
    s.wait_dispatched()
    s.abandon()
    s2 = make_store()
    assert s2.recovery_report is not None and s2.recovery_report.truncated_at == -1
    got: list[StoredMessage] = []
    while len(got) < count:  # one read stops at the end of a (small) consume-queue file
        got += s2.get_message("g", "B", 0, len(got), count).messages()
    assert len(got) == count and got[-1].tags == "a" and got[-1].properties["MY"] == "v"
    assert s2.check() == []


@pytest.mark.parametrize("count", [4, 40])
def test_batch_topics_with_zeros_are_refused_whatever_the_other_lengths(store: MessageStore, count: int) -> None:
    """A TOPIC with a zero byte next to topics of other lengths: grouping padded names with zeros once made b"A\\0"
    the topic "A", stored as b"A\\0" (which recovery would then cut)."""
    buf = b"".join(encode_entry(t, 0, b"x" * 40) for t in [b"A\0", b"BB"] * (count // 2))
    r = store.put_batch(buf)
    assert r.status is PutStatus.MESSAGE_ILLEGAL and "'A\\x00'" in r.error, r.error
    assert store.commit_log.max_offset == 0 and store.topics() == []
    assert store.check() == []


_topics = st.one_of(st.binary(min_size=1, max_size=12), st.from_regex(rb"[%|a-zA-Z0-9_-]{1,12}", fullmatch=True))
_props = st.one_of(
    st.just(b""),
    st.dictionaries(st.sampled_from(["TAGS", "KEYS", "x"]), st.text("ab \x00", max_size=4)).map(encode_properties),
    st.binary(min_size=1, max_size=12),
)


@settings(max_examples=150, deadline=None)
@given(entries=st.lists(st.tuples(_topics, _props), min_size=1, max_size=30))
def test_run_checks_equal_the_per_entry_definitions(entries: list[tuple[bytes, bytes]]) -> None:
    """Property: the vectorised topic and properties checks find exactly the first entry the per-entry
    definitions (is_topic_name, properties_complete) refuse."""
    buf = b"".join(encode_entry(t, 0, b"body", p) for t, p in entries)
    run = scan(buf, 0, len(buf), verify_crc=True)
    assert len(run) == len(entries)
    bad_topics = [i for i, (t, _) in enumerate(entries) if not is_topic_name(t)]
    starts, lengths = run.props_starts.tolist(), run.props_lengths.tolist()
    incomplete = [i for i in range(len(entries)) if not properties_complete(buf, starts[i], lengths[i])]
    assert first_bad_topic(buf, run) == (bad_topics[0] if bad_topics else -1)
    assert first_incomplete_properties(buf, run) == (incomplete[0] if incomplete else -1)


@settings(max_examples=100, deadline=None)
@given(props=st.dictionaries(st.text("ab=\x00é", min_size=1, max_size=5), st.text("ab \x00é", max_size=5), max_size=4))
def test_encoded_properties_always_end_with_the_separator(props: dict[str, str]) -> None:
    raw = encode_properties(props)
    assert raw == b"" if not props else raw.endswith(b"\x02")
    assert properties_complete(np.frombuffer(raw, np.uint8).tobytes(), 0, len(raw))


def test_recovery_scan_is_unchanged_on_a_clean_log(make_store: Callable[..., MessageStore]) -> None:
    """Many topics of many lengths and varied properties: nothing is cut."""
    s = make_store()
    for i in range(200):
        assert s.put_message(
            "t" * (1 + i % 9) + "%|_-"[i % 4], i % 3, b"m%d" % i, {"k": "v" * (i % 5)} if i % 2 else None
        ).ok
    s.abandon()
    s2 = make_store()
    assert s2.recovery_report is not None and s2.recovery_report.truncated_at == -1
    assert os.path.exists(s2.config.abort_path)
    assert s2.check() == []
