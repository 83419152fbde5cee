"""The client's byte-level half rewrite equals the transaction service's decoding one, and the broker takes it."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.client import Message, encode_message
from broker.client.half_batch import to_half_batch
from broker.errors import MessageIllegalError
from broker.format.batch import split_entries
from broker.format.message import encode_entry
from broker.format.transaction_codec import check_half_batch, rewrite_batch_as_half

TOPICS = ["T", "Topic2", "X_y-z", "%RETRY%g"]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 200), st.integers(1, 4))
def test_same_bytes_as_the_decoding_rewrite(seed: int, n: int, topic_count: int) -> None:
    rng = random.Random(seed)
    entries = []
    for _ in range(n):
        props = {f"k{j}": "v" * rng.randrange(0, 30) for j in range(rng.randrange(0, 4))}
        msg = Message(rng.choice(TOPICS[:topic_count]), rng.randbytes(rng.randrange(0, 400)),
                      tags=rng.choice([None, "a", "TagB"]), keys=rng.choice([(), ("k1",), ("k1", "k2")]),
                      properties=props, flag=rng.randrange(3))
        entries.append(encode_message(msg, rng.randrange(16), rng.randrange(1 << 40)))
    buffer = b"".join(entries)
    half = to_half_batch(buffer, "group-1", "txn:1")
    assert half == rewrite_batch_as_half(buffer, "group-1", "txn:1")[0]
    assert check_half_batch(half, "group-1", "txn:1") == n
    chunks = split_entries(half, 4096)
    assert b"".join(c for c, _ in chunks) == half and sum(k for _, k in chunks) == n


def test_entries_already_naming_a_transaction_take_the_checked_path() -> None:
    own = encode_message(Message("T", b"x", properties={"__transactionId__": "txn:1"}), 0)
    assert to_half_batch(own, "g", "txn:1") == rewrite_batch_as_half(own, "g", "txn:1")[0]
    foreign = encode_message(Message("T", b"x", properties={"__transactionId__": "other"}), 0)
    with pytest.raises(MessageIllegalError, match="other"):
        to_half_batch(foreign, "g", "txn:1")
    with pytest.raises(MessageIllegalError, match="malformed"):
        to_half_batch(own + b"\x00\x01", "g", "txn:1")


def test_a_property_list_without_its_trailing_separator_is_refused() -> None:
    """Only the form encode_properties writes is taken (store.properties says why); the client's rewrite refuses
    another, as the broker does, instead of re-encoding it into a different message."""
    entry = encode_entry(b"T", 1, b"body", b"a\x01b", born_timestamp=1)
    for rewrite in (to_half_batch, lambda b, g, t: rewrite_batch_as_half(b, g, t)[0]):
        with pytest.raises(MessageIllegalError, match="do not end with"):
            rewrite(entry, "g", "t")


@pytest.mark.parametrize("queue_id", [-1, -(2**31), 1 << 16])
def test_a_queue_id_outside_the_queue_range_is_refused(queue_id: int) -> None:
    """Topic index and queue id were packed in one key: queue id -1 borrowed from the topic index, so the half
    named another topic (and queue 4294967295)."""
    buffer = encode_entry(b"Alpha", queue_id, b"a", b"k\x01v\x02") + encode_entry(b"Beta", 0, b"b", b"k\x01v\x02")
    with pytest.raises(MessageIllegalError, match=f"batch entry 0: queue id {queue_id} of 'Alpha' is outside"):
        to_half_batch(buffer, "g", "t")
    ok = encode_entry(b"Alpha", (1 << 16) - 1, b"a", b"k\x01v\x02") + encode_entry(b"Beta", 0, b"b", b"k\x01v\x02")
    assert to_half_batch(ok, "g", "t") == rewrite_batch_as_half(ok, "g", "t")[0]
