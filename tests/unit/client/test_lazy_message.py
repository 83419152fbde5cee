"""Pulled messages decoded lazily (broker/client/lazy_message.py) equal decode_entry's, field for field.

decode_entry is the definition: on random answers (both the per-entry and the numpy framing check), on edge
cases (empty body, no properties, the largest topic, properties and body, unicode and undecodable properties,
every sys_flag) and on damaged answers, where both must raise the same CorruptionError or give equal messages.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import operator
import pickle
import struct
import sys
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.client import Admin, Message, Producer, PullConsumer
from broker.client.lazy_message import (
    VECTOR_MIN_ENTRIES,
    DecodedMessage,
    LazyMessage,
    PulledMessages,
    decode_pulled,
)
from broker.errors import CorruptionError
from broker.format.message import (
    DEFAULT_MAX_MESSAGE_SIZE,
    MAX_PROPERTIES_BYTES,
    MAX_TOPIC_BYTES,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    StoredMessage,
    SysFlag,
    decode_entry,
    encode_entry,
    encode_properties,
)
from broker.server.broker_controller import BrokerController

FIELDS = [f.name for f in dataclasses.fields(StoredMessage)]
TOPIC_CHARS = "abcXYZ019%|_-"
I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
SEPARATORS = NAME_VALUE_SEPARATOR + PROPERTY_SEPARATOR
BASE_FLAGS = [SysFlag.COMPRESSED, SysFlag.MULTI_TAGS, SysFlag.TRANSACTION_PREPARED_TYPE,
              SysFlag.TRANSACTION_COMMIT_TYPE, SysFlag.TRANSACTION_ROLLBACK_TYPE]
V6_FLAGS = [SysFlag.BORNHOST_V6, SysFlag.STOREHOST_V6]
# Every combination of RocketMQ's sys_flag bits, the IPv6 ones included (which both decoders must refuse alike).
EVERY_SYS_FLAG = sorted({sum(c) for r in range(8) for c in itertools.combinations(BASE_FLAGS + V6_FLAGS, r)})

unicode_text = st.text(st.characters(blacklist_characters=SEPARATORS, blacklist_categories=("Cs",)), max_size=20)
properties_bytes = st.one_of(
    st.just(b""),
    st.dictionaries(unicode_text, unicode_text, max_size=6).map(encode_properties),
    st.binary(max_size=64),  # not name\x01value\x02 at all, or not UTF-8: decoded with replacement by both
)


@st.composite
def entries(draw: st.DrawFn) -> bytes:
    return encode_entry(
        draw(st.text(TOPIC_CHARS, min_size=1, max_size=MAX_TOPIC_BYTES)).encode("ascii"),
        draw(I32),
        draw(st.one_of(st.just(b""), st.binary(max_size=300))),
        draw(properties_bytes),
        flag=draw(I32),
        sys_flag=draw(st.one_of(st.sampled_from(EVERY_SYS_FLAG), I32)),
        born_timestamp=draw(I64),
        born_ip=draw(st.binary(min_size=4, max_size=4)),
        born_port=draw(I32),
        reconsume_times=draw(I32),
        prepared_transaction_offset=draw(I64),
        queue_offset=draw(I64),
        physical_offset=draw(I64),
        store_timestamp=draw(I64),
        store_ip=draw(st.binary(min_size=4, max_size=4)),
        store_port=draw(I32),
    )


def answer(raw_entries: list[bytes]) -> tuple[bytes, list[int]]:
    positions, at = [], 0
    for e in raw_entries:
        positions.append(at)
        at += len(e)
    return b"".join(raw_entries), positions


def eager(buf: bytes, positions: list[int]) -> list[StoredMessage] | str:
    """decode_entry over the answer, or the CorruptionError's text."""
    ends = [*positions[1:], len(buf)]
    try:
        return [decode_entry(buf, p, e) for p, e in zip(positions, ends, strict=True)]
    except CorruptionError as e:
        return str(e)


def lazy(buf: bytes, positions: list[int]) -> list[StoredMessage] | str:
    try:
        return decode_pulled(buf, positions)
    except CorruptionError as e:
        return str(e)


def assert_same(got: list[StoredMessage], want: list[StoredMessage], first_read: list[str]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for name in first_read + FIELDS:  # the order fields are first read in must not matter
            assert type(getattr(g, name)) is type(getattr(w, name)), name
            assert getattr(g, name) == getattr(w, name), name
        assert g.tags == w.tags and g.keys == w.keys
        assert g == w and w == g and operator.ne(g, w) is False
        assert repr(g) == repr(w)
        assert dataclasses.asdict(g) == dataclasses.asdict(w)
        assert pickle.loads(pickle.dumps(g)) == w
        assert copy.copy(g) == w


entry_lists = st.lists(entries(), min_size=1, max_size=2 * VECTOR_MIN_ENTRIES)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(raw=entry_lists, first_read=st.permutations(FIELDS))
def test_lazy_equals_eager_on_random_answers(raw: list[bytes], first_read: list[str]) -> None:
    buf, positions = answer(raw)
    want, got = eager(buf, positions), lazy(buf, positions)
    if isinstance(want, str):  # an IPv6 sys_flag drawn among the random ints: both refuse, with the same words
        assert got == want
        return
    assert not isinstance(got, str)
    assert all(isinstance(m, LazyMessage) for m in got)
    assert_same(got, want, first_read[:3])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(raw=entry_lists, data=st.data())
def test_damaged_answers_fail_or_decode_alike(raw: list[bytes], data: st.DataObject) -> None:
    buf, positions = answer(raw)
    damaged = bytearray(buf)
    for _ in range(data.draw(st.integers(1, 3))):
        damaged[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(positions[-1], len(buf)))  # and maybe the last entry cut short
    got, want = lazy(bytes(damaged[:cut]), positions), eager(bytes(damaged[:cut]), positions)
    if isinstance(want, str):
        assert got == want
    else:
        assert not isinstance(got, str)
        assert_same(got, want, [])


@pytest.mark.parametrize("count", [1, VECTOR_MIN_ENTRIES])
@pytest.mark.parametrize("sys_flag", EVERY_SYS_FLAG)
def test_every_sys_flag(sys_flag: int, count: int) -> None:
    buf, positions = answer([encode_entry(b"T", 1, b"x", sys_flag=sys_flag, queue_offset=i) for i in range(count)])
    want, got = eager(buf, positions), lazy(buf, positions)
    if sys_flag & (SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6):
        assert isinstance(want, str) and "IPv6" in want and got == want
    else:
        assert not isinstance(got, str) and not isinstance(want, str)
        assert [m.sys_flag for m in got] == [sys_flag] * count
        assert_same(got, want, [])


@pytest.mark.parametrize("count", [1, VECTOR_MIN_ENTRIES])
def test_edge_entries(count: int) -> None:
    biggest_props = encode_properties({"K": "v" * (MAX_PROPERTIES_BYTES - 3)})
    assert len(biggest_props) == MAX_PROPERTIES_BYTES
    unicode_props = encode_properties({"名前": "値 ✓", "emoji 🚀": "", "": "empty name"})
    cases = [
        encode_entry(b"T", 0, b""),  # empty body, no properties
        encode_entry(b"t" * MAX_TOPIC_BYTES, 2**31 - 1, b"\x00" * 1000, biggest_props, queue_offset=2**63 - 1),
        encode_entry(b"%RETRY%g", 0, b"b", unicode_props, born_ip=b"\xff\xff\xff\xff", born_port=-1),
        encode_entry(b"T", 0, b"z" * DEFAULT_MAX_MESSAGE_SIZE, encode_properties({"TAGS": "a", "KEYS": "k1 k2"})),
    ]
    for case in cases:
        buf, positions = answer([case] + [cases[0]] * (count - 1))  # one 4 MiB body at most: memory
        want, got = eager(buf, positions), lazy(buf, positions)
        assert not isinstance(got, str) and not isinstance(want, str)
        assert_same(got, want, [])
    assert got[0].tags == "a" and got[0].keys == ["k1", "k2"]


def test_a_body_is_one_slice_of_the_answer_and_fields_can_be_set() -> None:
    buf, positions = answer([encode_entry(b"T", 3, b"payload", encode_properties({"TAGS": "a"}))] * 2)
    m = decode_pulled(buf, positions)[0]
    assert type(m.body) is bytes and m.body == b"payload"
    m.topic = "Other"
    m.properties["x"] = "y"
    assert m.topic == "Other" and m.properties == {"TAGS": "a", "x": "y"} and m.tags == "a"
    assert isinstance(m, LazyMessage)
    m.materialize()
    assert not hasattr(m, "_core") and m.topic == "Other" and m.store_host == "0.0.0.0:0"
    with pytest.raises(AttributeError):
        m.no_such_field  # type: ignore[attr-defined]  # noqa: B018 -- an unknown name still raises


def test_bad_framing_is_refused_by_both_paths() -> None:
    entry = bytearray(encode_entry(b"T", 0, b"body"))
    struct.pack_into(">i", entry, 84, 9999)  # BODY LEN past the entry
    for count in (1, VECTOR_MIN_ENTRIES):
        buf, positions = answer([bytes(entry)] * count)
        with pytest.raises(CorruptionError, match="body length 9999"):
            decode_pulled(buf, positions)


def test_a_real_pull_equals_decode_entry(broker: BrokerController, endpoint: str) -> None:
    count = 3 * VECTOR_MIN_ENTRIES
    with Admin(endpoint) as admin:
        admin.create_topic("Lazy", 1)
    with Producer(endpoint) as p:
        p.send_batch(
            [Message("Lazy", f"m{i}".encode(), tags=f"t{i % 3}", keys=[f"k{i}"], properties={"ü": str(i)})
             for i in range(count)], queue_id=0,
        )
    with PullConsumer(endpoint, "g") as consumer:
        raw = consumer.pull_raw("Lazy", 0, 0, count, timeout_ms=0)
        pulled = consumer.pull("Lazy", 0, 0, count, timeout_ms=0).messages
        one = consumer.pull("Lazy", 0, 5, 1).messages
        tagged = consumer.pull("Lazy", 0, 0, count, tags="t1").messages
    want = eager(raw.buffer, raw.entry_positions)
    assert not isinstance(want, str) and len(pulled) == count
    assert_same(pulled, want, ["msg_id", "properties"])
    assert one == [want[5]]
    assert [m.queue_offset for m in tagged] == [i for i in range(count) if i % 3 == 1]
    assert [m.properties["ü"] for m in pulled] == [str(i) for i in range(count)]


def test_a_group_is_decoded_for_the_whole_answer_and_a_message_kept_alone_still_decodes() -> None:
    raw = [encode_entry(b"T", 0, f"m{i}".encode(), encode_properties({"TAGS": f"t{i % 2}", "i": str(i)}),
                        queue_offset=i, physical_offset=1000 + i) for i in range(2 * VECTOR_MIN_ENTRIES)]
    buf, positions = answer(raw)
    want = eager(buf, positions)
    assert not isinstance(want, str)
    pulled = decode_pulled(buf, positions)
    assert isinstance(pulled, PulledMessages) and type(pickle.loads(pickle.dumps(pulled))) is list
    assert pulled[5].tags == "t1"  # the properties of every message of the answer, at once
    assert all(StoredMessage.__dict__["properties"].__get__(m) for m in pulled)  # each slot set: no decode left
    pulled[:] = [m for m in pulled if m.tags == "t0"]  # filtered in place, as PullConsumer.pull does
    assert [m.msg_id for m in pulled] == [w.msg_id for w in want[::2]]
    kept = decode_pulled(buf, positions)[7]  # its list is gone at once: it decodes on its own
    assert kept.topic == "T" and kept == want[7]
    one = decode_pulled(buf, positions)
    first = one[0].materialize()  # every group decoded for the answer, then the message lets go of it
    first.topic = "Other"
    assert one[1].topic == "T" and first.topic == "Other" and one[1:] == want[1:]


@pytest.mark.parametrize("count", [1, 2 * VECTOR_MIN_ENTRIES])
def test_an_answer_read_in_full_becomes_plain_decoded_messages(count: int) -> None:
    raw = [encode_entry(b"T", 0, f"m{i}".encode(), encode_properties({"TAGS": "a", "i": str(i)}), queue_offset=i)
           for i in range(count)]
    buf, positions = answer(raw)
    want = eager(buf, positions)
    pulled = decode_pulled(buf, positions)
    assert pulled[0].tags == "a" and pulled[-1].msg_id  # two of the three groups: still lazy
    assert all(type(m) is LazyMessage for m in pulled)
    assert pulled[0].topic == "T"  # the last group: every message of the answer is decoded now
    assert all(type(m) is DecodedMessage and not hasattr(m, "_core") for m in pulled)
    assert pulled == want and [repr(m) for m in pulled] == [repr(w) for w in want]
    assert pickle.loads(pickle.dumps(pulled[0])) == want[0] and type(copy.copy(pulled[0])) is StoredMessage
    assert pulled[0].materialize() is pulled[0]
    with pytest.raises(AttributeError):
        pulled[0].no_such_field  # type: ignore[attr-defined]  # noqa: B018 -- an unknown name still raises


def test_threads_reading_one_answer_at_once_all_see_every_field() -> None:
    """The last group's decode swaps every message's class and drops its answer: a thread inside a read of
    another message of the same answer at that moment still gets its field."""
    raw = [encode_entry(b"T", 0, f"m{i}".encode(), encode_properties({"TAGS": "a", "i": str(i)}), queue_offset=i)
           for i in range(2 * VECTOR_MIN_ENTRIES)]
    buf, positions = answer(raw)
    want = eager(buf, positions)
    assert not isinstance(want, str)
    errors: list[BaseException] = []
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as CPython allows: reads interleave
    try:
        for _ in range(30):
            pulled = decode_pulled(buf, positions)
            orders = [FIELDS[k:] + FIELDS[:k] for k in range(0, len(FIELDS), 3)]

            def read(order: list[str], pulled: list[StoredMessage] = pulled) -> None:
                try:
                    for m, w in zip(pulled, want, strict=True):
                        for name in order:
                            assert getattr(m, name) == getattr(w, name), name
                except BaseException as e:  # noqa: BLE001 -- handed to the main thread, which fails the test
                    errors.append(e)

            threads = [threading.Thread(target=read, args=(order,)) for order in orders]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert all(type(m) is DecodedMessage for m in pulled)
    finally:
        sys.setswitchinterval(switch)
    assert errors == []
