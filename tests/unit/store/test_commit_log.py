"""Commit log through the store: entry fields filled at append, END_OF_FILE rolling, monotonic store time."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest

from broker.format.message import (
    BLANK_MAGIC,
    BODY_START,
    ENTRY_HEADER,
    MESSAGE_MAGIC,
    SysFlag,
    decode_entry,
    encode_entry,
    encode_properties,
)
from broker.store import MessageStore, PutStatus


def test_put_fills_store_fields(store: MessageStore) -> None:
    r = store.put_message("TopicA", 2, b"body", {"TAGS": "a"}, born_timestamp=5, born_host=("10.1.2.3", 777))
    assert r.status is PutStatus.PUT_OK
    raw = store.commit_log.read(r.commitlog_offsets[0], r.wrote_bytes)
    assert raw is not None
    m = decode_entry(raw, verify_crc=True)
    assert (m.topic, m.queue_id, m.queue_offset, m.commitlog_offset) == ("TopicA", 2, 0, r.commitlog_offsets[0])
    assert m.born_host == "10.1.2.3:777" and m.born_timestamp == 5
    assert m.store_host == "127.0.0.1:10911" and m.store_timestamp == r.store_timestamp
    assert m.msg_id == r.msg_ids[0]
    assert store.check() == []


def test_end_of_file_rolls_with_a_blank_entry(store: MessageStore) -> None:
    size = store.config.mapped_file_size_commit_log
    offsets = []
    for i in range(40):  # ~ 500 B entries in 16 KiB files: several rolls
        r = store.put_message("Roll", 0, bytes([i]) * 400)
        assert r.ok
        offsets.append(r.commitlog_offsets[0])
    files = store.commit_log.files.files
    assert len(files) >= 2
    first = files[0]
    # walk file 0 entry by entry: it must end with a blank whose TOTALSIZE covers the rest of the file
    pos = 0
    while True:
        total, magic = struct.unpack_from(">ii", first.mm, pos)
        if magic == BLANK_MAGIC:
            assert pos + total == size
            assert size - pos < 400 + 8 + 100  # the next entry did not fit
            break
        assert magic == MESSAGE_MAGIC
        pos += total
    assert offsets[-1] // size == len(files) - 1
    assert any(o % size == 0 and o > 0 for o in offsets)  # some entry starts a new file
    store.wait_dispatched()
    got = store.get_message("g", "Roll", 0, 0, 64)
    assert [m.body[0] for m in got.messages()] == list(range(40))[: got.message_count]
    assert store.check() == []


def test_store_timestamps_never_go_back(store: MessageStore) -> None:
    store.commit_log.last_store_timestamp = 2**50  # as if the clock had stepped back
    r1 = store.put_message("T", 0, b"a")
    r2 = store.put_message("T", 0, b"b")
    assert r1.store_timestamp == r2.store_timestamp == 2**50


def test_prepared_transactions_do_not_take_queue_offsets(store: MessageStore) -> None:
    a = store.put_message("Tx", 0, b"a")
    half = store.put_message("Tx", 0, b"half", sys_flag=SysFlag.TRANSACTION_PREPARED_TYPE)
    b = store.put_message("Tx", 0, b"b")
    assert (a.queue_offsets, half.queue_offsets, b.queue_offsets) == ([0], [0], [1])
    store.wait_dispatched()
    assert [m.body for m in store.get_message("g", "Tx", 0, 0).messages()] == [b"a", b"b"]
    assert store.lookup_message(half.commitlog_offsets[0]) is not None
    assert store.check() == []


def test_put_validation_statuses(store: MessageStore) -> None:
    assert store.put_message("bad topic!", 0, b"x").status is PutStatus.MESSAGE_ILLEGAL
    assert store.put_message("T\n", 0, b"x").status is PutStatus.MESSAGE_ILLEGAL  # "$" alone admitted this
    assert store.put_message("T" * 128, 0, b"x").status is PutStatus.MESSAGE_ILLEGAL
    big = store.put_message("T", 0, b"x" * 5000)
    assert big.status is PutStatus.MESSAGE_ILLEGAL and "MESSAGE_SIZE_EXCEEDED" in big.error
    props = store.put_message("T", 0, b"x", {"k": "v" * 40000})
    assert props.status is PutStatus.PROPERTIES_SIZE_EXCEEDED
    assert store.put_message("T", -1, b"x").status is PutStatus.MESSAGE_ILLEGAL
    too_big = store.put_message("T", 0, b"x" * 4000, {"k": "v" * 13000})  # fits the limits, not a 16 KiB file
    assert too_big.status is PutStatus.MESSAGE_ILLEGAL and "cannot fit" in too_big.error
    assert store.commit_log.max_offset == 0
    store.shutdown()
    assert store.put_message("T", 0, b"x").status is PutStatus.SERVICE_NOT_AVAILABLE


def test_lookup_refuses_an_entry_forged_inside_a_body(store: MessageStore) -> None:
    """A body may hold bytes shaped like an entry (any topic, any properties): lookup returned it as a stored
    message, since its PHYSICALOFFSET was never compared with the offset asked for."""
    fake = encode_entry(b"RMQ_SYS_TRANS_HALF_TOPIC", 0, b"forged", encode_properties({"TRAN_MSG": "true"}))
    r = store.put_message("Public", 0, b"prefix--" + fake)
    base = r.commitlog_offsets[0]
    inner = base + store.commit_log.read(base, r.wrote_bytes).find(fake)
    assert inner > base
    assert store.lookup_message(inner) is None
    real = store.lookup_message(base)
    assert real is not None and real.topic == "Public" and real.commitlog_offset == base
    assert store.check() == []


def test_lookup_reads_no_more_than_the_largest_entry(
    make_store: Callable[..., MessageStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An offset into a body with the message magic and a huge TOTALSIZE made every lookup copy that many bytes
    (up to a whole file) before finding out."""
    store = make_store(mapped_file_size_commit_log=1 << 20)
    huge = 200 * 1024  # fits the file, not the largest entry (4 KiB body + topic + 32 KiB properties)
    assert store.commit_log.max_entry_size < huge
    r = store.put_message("T", 0, b"ab" + struct.pack(">ii", huge, MESSAGE_MAGIC) + b"." * 100)
    while store.commit_log.max_offset < huge + 1024:
        store.put_message("T", 1, b"z" * 4000)
    bait = r.commitlog_offsets[0] + BODY_START + 2
    sizes: list[int] = []
    read = store.commit_log.read
    monkeypatch.setattr(store.commit_log, "read", lambda off, size: sizes.append(size) or read(off, size))
    assert store.lookup_message(bait) is None
    assert max(sizes) <= ENTRY_HEADER.size, sizes
    assert store.check() == []


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("flag", 2**31, "flag 2147483648 is outside -2147483648..2147483647"),
        ("reconsume_times", -(2**31) - 1, "reconsume_times -2147483649 is outside -2147483648..2147483647"),
        ("born_timestamp", 2**63, "born_timestamp 9223372036854775808 is outside -9223372036854775808.."),
        ("sys_flag", 2**31, "sys_flag 2147483648 is outside"),
        ("prepared_transaction_offset", -(2**63) - 1, "prepared_transaction_offset -9223372036854775809 is outside"),
        ("born_host", ("1.2.3.4", 2**32), "born_port 4294967296 is outside -2147483648..2147483647"),
    ],
)
def test_out_of_range_put_arguments_are_illegal(store: MessageStore, field: str, value: object, shown: str) -> None:
    """They raised struct.error out of put_message instead of returning a status."""
    r = store.put_message("T", 0, b"x", **{field: value})  # type: ignore[arg-type]
    assert r.status is PutStatus.MESSAGE_ILLEGAL and shown in r.error, r.error
    assert store.commit_log.max_offset == 0 and store.commit_log.queue_table == {}
    assert store.put_message("T", 0, b"x", flag=-(2**31), reconsume_times=2**31 - 1, born_timestamp=2**63 - 1).ok
    assert store.check() == []
