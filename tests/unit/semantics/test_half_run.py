"""commit_halves (numpy, whole runs) gives byte for byte what commit_raw (the definition, per half) gives."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.client import Message, encode_message
from broker.client.half_batch import to_half_batch
from broker.errors import MessageIllegalError
from broker.format.batch import scan
from broker.format.message import POS_PHYSICAL_OFFSET, decode_entry, encode_entry
from broker.format.transaction_codec import (
    ATTEMPT,
    RawHalf,
    check_half_batch,
    commit_raw,
    encode_half_entry,
    raw_property,
)
from broker.semantics.half_run import MAX_DISTINCT_PER_RUN, HalfRun, check_halves, commit_halves

TOPICS = ["T", "Topic2", "X_y-z", "%RETRY%g"]


def with_offsets(half: bytes, rng: random.Random) -> tuple[bytes, list[int], list[int]]:
    """The halves as the store would hand them back: PHYSICALOFFSET filled in; plus queue offsets."""
    buf = bytearray(half)
    run = scan(buf, 0, len(buf), verify_crc=False)
    phys = sorted(rng.sample(range(1 << 40), len(run)))
    for p, off in zip(run.positions.tolist(), phys, strict=True):
        struct.pack_into(">q", buf, p + POS_PHYSICAL_OFFSET, off)
    first = rng.randrange(10 ** rng.randrange(1, 12))
    return bytes(buf), phys, list(range(first, first + len(run)))


def reference(buf: bytes, phys: list[int], qoffs: list[int], attempts: set[str] | None, skip: set[int]) -> bytes:
    run = scan(buf, 0, len(buf), verify_crc=False)
    out = []
    for i, (p, s) in enumerate(zip(run.positions.tolist(), run.sizes.tolist(), strict=True)):
        entry = buf[p : p + s]
        if phys[i] in skip or (attempts is not None and raw_property(entry, ATTEMPT) not in attempts):
            continue
        out.append(commit_raw(RawHalf(qoffs[i], phys[i], entry)).entry)
    return b"".join(out)


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 300), st.integers(1, 4), st.integers(1, 20))
def test_same_bytes_as_commit_raw(seed: int, n: int, topic_count: int, queue_count: int) -> None:
    rng = random.Random(seed)
    attempts = [f"{p}.0.{rng.randrange(1 << 48):012x}" for p in range(rng.randrange(1, 5))]
    entries = []
    for _ in range(n):
        props = {f"k{j}": "v" * rng.randrange(0, 30) for j in range(rng.randrange(0, 3))}
        if rng.random() < 0.9:
            props = {ATTEMPT: rng.choice(attempts), **props}  # the sink puts it first
        if rng.random() < 0.1:  # half properties the client set itself: kept where they are, R may come last
            preset = {"TRAN_MSG": "true", "PGROUP": "group-1", "__transactionId__": "spark:q:1:r"}
            props |= dict(rng.sample(sorted(preset.items()), rng.randrange(1, 4)))
        msg = Message(rng.choice(TOPICS[:topic_count]), rng.randbytes(rng.randrange(0, 300)),
                      tags=rng.choice([None, "a", "TagB"]), keys=rng.choice([(), ("k1",), ("k1", "k2")]),
                      properties=props, flag=rng.randrange(3))
        entries.append(encode_message(msg, rng.randrange(queue_count), rng.randrange(1 << 40)))
    buf, phys, qoffs = with_offsets(to_half_batch(b"".join(entries), "group-1", "spark:q:1:r"), rng)
    allowed = set(rng.sample(attempts, rng.randrange(len(attempts) + 1))) if rng.random() < 0.7 else None
    skip = set(rng.sample(phys, rng.randrange(n // 2 + 1)))
    got = commit_halves(HalfRun(buf, qoffs), attempts=allowed, skip=np.array(sorted(skip), np.int64) if skip else None)
    want = reference(buf, phys, qoffs, allowed, skip)
    assert got.buffer == want
    committed = [decode_entry(e) for e in _entries(want)]
    assert got.messages == len(committed)
    assert got.queues == {(m.topic, m.queue_id) for m in committed}


def _entries(buf: bytes) -> list[bytes]:
    run = scan(buf, 0, len(buf), verify_crc=False)
    return [buf[p : p + s] for p, s in zip(run.positions.tolist(), run.sizes.tolist(), strict=True)]


def test_halves_of_other_shapes_take_the_per_half_path() -> None:
    """Halves written one by one (prepare_half), a body holding the marker bytes, properties out of order: the
    bulk path declines and commit_raw decides, so the bytes are still the definition's."""
    rng = random.Random(7)
    odd = [
        encode_half_entry("T", 1, b"REAL_TOPIC\x01X\x02REAL_QID\x011\x02", {"a": "b"}, "g", "t1"),
        encode_half_entry("T", 2, b"body", {ATTEMPT: "x", "REAL_TOPICS": "no"}, "g", "t1"),
        encode_half_entry("Topic2", 3, b"", {}, "other-group", "t1"),
    ]
    for entries in (odd, odd[1:], odd[2:] + odd[1:2]):
        buf, phys, qoffs = with_offsets(b"".join(entries), rng)
        for allowed in (None, {"x"}):
            got = commit_halves(HalfRun(buf, qoffs), attempts=allowed)
            assert got.buffer == reference(buf, phys, qoffs, allowed, set())


def test_many_real_queues_in_one_run() -> None:
    rng = random.Random(3)
    n = 3 * MAX_DISTINCT_PER_RUN
    entries = [encode_message(Message("T", b"b%d" % i), i, 1) for i in range(n)]
    buf, phys, qoffs = with_offsets(to_half_batch(b"".join(entries), "g", "t"), rng)
    got = commit_halves(HalfRun(buf, qoffs))
    assert got.buffer == reference(buf, phys, qoffs, None, set()) and got.messages == n


def test_a_half_without_its_real_topic_is_refused_naming_it() -> None:
    entry = encode_half_entry("T", 0, b"x", {}, "g", "t").replace(b"REAL_TOPIC\x01T\x02", b"REAL_TOPIX\x01T\x02")
    buf, phys, qoffs = with_offsets(entry, random.Random(1))
    with pytest.raises(MessageIllegalError, match=f"commit-log offset {phys[0]}"):
        commit_halves(HalfRun(buf, qoffs))


def test_nothing_kept_is_an_empty_run() -> None:
    buf, _, qoffs = with_offsets(encode_half_entry("T", 0, b"x", {ATTEMPT: "a"}, "g", "t"), random.Random(2))
    got = commit_halves(HalfRun(buf, qoffs), attempts={"b"})
    assert got.buffer == b"" and got.messages == 0 and got.queues == frozenset()


def test_sink_shaped_halves_never_go_per_half(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the Spark sink sends (TRAN_ATTEMPT first, halves from to_half_batch) is committed in bulk."""
    import broker.semantics.half_run as cb

    def refuse(_half: RawHalf) -> None:
        raise AssertionError("per-half path taken")

    rng = random.Random(5)
    entries = [encode_message(Message("out", b"%012d" % i, properties={ATTEMPT: f"{i % 3}.0.ab"}), i % 8, 1)
               for i in range(2000)]
    buf, phys, qoffs = with_offsets(to_half_batch(b"".join(entries), "g", "spark:q:4:r"), rng)
    want = reference(buf, phys, qoffs, {"0.0.ab", "2.0.ab"}, set())
    monkeypatch.setattr(cb, "commit_raw", refuse)
    got = commit_halves(HalfRun(buf, qoffs), attempts={"0.0.ab", "2.0.ab"})
    assert got.buffer == want and got.messages == 1333


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 200))
def test_check_halves_agrees_with_the_definition(seed: int, n: int) -> None:
    """check_halves accepts what check_half_batch accepts and refuses what it refuses."""
    rng = random.Random(seed)
    addressed = [(rng.choice(TOPICS), rng.randrange(12)) for _ in range(n)]
    entries = [
        encode_message(Message(topic, rng.randbytes(rng.randrange(0, 200)),
                               properties={f"p{j}": "v" for j in range(rng.randrange(3))}), qid, 1)
        for topic, qid in addressed
    ]
    half = to_half_batch(b"".join(entries), "grp", "txn:9")
    checked = check_halves(half, "grp", "txn:9")
    assert checked.messages == check_half_batch(half, "grp", "txn:9") == n
    want = {t: (min(q for tt, q in addressed if tt == t), max(q for tt, q in addressed if tt == t))
            for t, _ in addressed}
    assert checked.real_queues == want
    for group, txn in (("other", "txn:9"), ("grp", "txn:8"), ("grp", "txn:99")):
        with pytest.raises(MessageIllegalError):
            check_half_batch(half, group, txn)
        with pytest.raises(MessageIllegalError):
            check_halves(half, group, txn)


def test_check_halves_refuses_what_is_not_a_half_batch() -> None:
    plain = encode_message(Message("T", b"x"), 0, 1)
    half = encode_half_entry("T", 0, b"x", {}, "g", "t")
    for bad in (plain, half + plain, half[:-1], half.replace(b"REAL_QID\x010", b"REAL_QIX\x010")):
        with pytest.raises(MessageIllegalError):
            check_half_batch(bad, "g", "t")
        with pytest.raises(MessageIllegalError):
            check_halves(bad, "g", "t")
    assert check_halves(half, "g", "t") == (1, {"T": (0, 0)})


def test_halves_whose_properties_end_with_the_real_queue() -> None:
    """A client that sets TRAN_MSG, PGROUP and __transactionId__ itself (RocketMQ's does) gets them kept in
    place: R comes last and T is empty. Both bulk paths must handle that shape."""
    preset = {"TRAN_MSG": "true", "PGROUP": "g", "__transactionId__": "t"}
    entries = [encode_half_entry("T", q % 3, b"x%d" % q, {"k": "v", **preset}, "g", "t") for q in range(10)]
    assert entries[0].endswith(b"REAL_QID\x010\x02")
    buf, phys, qoffs = with_offsets(b"".join(entries), random.Random(6))
    assert commit_halves(HalfRun(buf, qoffs)).buffer == reference(buf, phys, qoffs, None, set())
    assert (
        check_halves(b"".join(entries), "g", "t") == (10, {"T": (0, 2)})
        and check_half_batch(b"".join(entries), "g", "t") == 10
    )


HALF_TAIL = "TRAN_MSG\x01true\x02PGROUP\x01g\x02__transactionId__\x01t\x02"  # T of group g, transaction t


@pytest.mark.parametrize(
    "props",
    [
        "REAL_TOPIC\x01Evil\x02REAL_QID\x0177\x02REAL_TOPIC\x01T\x02REAL_QID\x010\x02",
        "REAL_QID\x0177\x02REAL_TOPIC\x01T\x02REAL_QID\x010\x02",
        "REAL_TOPIC\x01Evil\x02REAL_TOPIC\x01T\x02REAL_QID\x010\x02",
        "__transactionId__\x01other\x02REAL_TOPIC\x01T\x02REAL_QID\x010\x02",
    ],
    ids=["pair twice", "qid twice", "topic twice", "id twice"],
)
def test_a_half_naming_a_half_property_twice_is_refused(props: str) -> None:
    """The check read the last REAL_TOPIC / REAL_QID, the commit the first: a half naming two queues was admitted
    for one and stored in the other (a system topic, a queue the topic does not have). Both now refuse it."""
    bad = encode_entry(b"RMQ_SYS_TRANS_HALF_TOPIC", 0, b"x", (props + HALF_TAIL).encode())
    good = encode_half_entry("T", 0, b"y", {}, "g", "t")
    for buf in (bad, good + bad, bad + good):
        with pytest.raises(MessageIllegalError, match="times; each half property must appear once"):
            check_halves(buf, "g", "t")
        with pytest.raises(MessageIllegalError, match="times; each half property must appear once"):
            check_half_batch(buf, "g", "t")
    assert check_halves(good + good, "g", "t") == (2, {"T": (0, 0)})  # one of each: the bulk path still takes it


def test_a_stored_half_naming_two_real_queues_is_not_committed() -> None:
    """Halves stored before the check refused them: the commit refuses too rather than pick one of the pairs."""
    pairs = "REAL_TOPIC\x01Evil\x02REAL_QID\x0177\x02REAL_TOPIC\x01T\x02REAL_QID\x010\x02"
    half = encode_entry(b"RMQ_SYS_TRANS_HALF_TOPIC", 0, b"x", (pairs + HALF_TAIL).encode())
    buf, _phys, qoffs = with_offsets(half, random.Random(8))
    with pytest.raises(MessageIllegalError, match="names REAL_TOPIC/REAL_QID twice"):
        commit_halves(HalfRun(buf, qoffs))
