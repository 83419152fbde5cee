"""A batch's encoding in one loop (``encode_messages``) against ``encode_message`` of each message, the definition:
the same bytes, and the same refusals, on random messages."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.client import Message
from broker.client.outgoing_message import encode_message, encode_messages
from broker.errors import MessageIllegalError

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
BODY = st.binary(max_size=300)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    body = draw(BODY)
    kind = draw(st.sampled_from([bytes, bytearray, memoryview]))
    props = draw(st.dictionaries(st.sampled_from(["a", "b", "UNIQ_KEY", "TAGS", "x\x01y"]), TEXT, max_size=3))
    keys = draw(st.lists(st.sampled_from(["k1", "k2", "bad key", ""]), max_size=2))
    return Message(
        draw(st.sampled_from(["T", "topic-a", "bad topic!"])), kind(body), tags=draw(st.none() | TEXT),
        keys=keys, properties=props, flag=draw(st.integers(0, 2**31 - 1)),
    )


def outcome(fn: object) -> object:
    try:
        return fn()  # type: ignore[operator]
    except MessageIllegalError as e:
        return ("refused", str(e))


@settings(max_examples=300, deadline=None)
@given(msgs=st.lists(messages(), min_size=1, max_size=5), data=st.data())
def test_one_loop_encodes_as_encode_message(msgs: list[Message], data: st.DataObject) -> None:
    queue_ids = data.draw(st.lists(st.integers(0, 1000), min_size=len(msgs), max_size=len(msgs)))
    uniq = data.draw(st.lists(st.text("0123456789ABCDEF", min_size=32, max_size=32), min_size=len(msgs),
                              max_size=len(msgs)))
    limit = data.draw(st.sampled_from([4 << 20, 100]))
    rows = list(zip(msgs, queue_ids, uniq, strict=True))
    one_by_one = outcome(lambda: [encode_message(m, q, 1234, limit, u) for m, q, u in rows])
    assert outcome(lambda: encode_messages(msgs, queue_ids, 1234, uniq, limit)) == one_by_one


def test_a_body_that_is_not_bytes_is_refused_by_name() -> None:
    with pytest.raises(MessageIllegalError, match="must be bytes, got str"):
        encode_messages([Message("T", "text")], [0], 1, ["U"])  # type: ignore[arg-type]
