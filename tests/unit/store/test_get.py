"""get_message: every status of the digest's table, limits, filters, raw buffers; offset by time; lookups."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from broker.errors import ServiceNotAvailableError
from broker.format.message import BODY_START, ENTRY_HEADER, MESSAGE_MAGIC, PREFIX, tag_hash_code
from broker.store import GetStatus, MessageStore
from broker.store.consume_queue import CQ_UNIT


def _fill(store: MessageStore, topic: str, n: int, qid: int = 0) -> None:
    for i in range(n):
        assert store.put_message(topic, qid, b"m%d" % i, {"TAGS": "TagA" if i % 3 == 0 else "TagB"}).ok
    assert store.wait_dispatched()


def test_found_returns_raw_entries_in_one_slice(store: MessageStore) -> None:
    _fill(store, "G", 8)
    got = store.get_message("grp", "G", 0, 2, max_msgs=4)
    assert got.status is GetStatus.FOUND
    assert (got.next_begin_offset, got.min_offset, got.max_offset) == (6, 0, 8)
    msgs = got.messages()
    assert [m.body for m in msgs] == [b"m2", b"m3", b"m4", b"m5"]
    assert [m.queue_offset for m in msgs] == got.queue_offsets == [2, 3, 4, 5]
    first = msgs[0].commitlog_offset
    assert got.buffer == store.commit_log.read(first, len(got.buffer))  # exactly as on disk
    assert got.entry_positions[0] == 0 and got.entry_positions[1] == msgs[0].store_size
    assert store.check() == []


def test_empty_and_unknown_queues(store: MessageStore) -> None:
    r = store.get_message("grp", "Nope", 0, 5)
    assert (r.status, r.next_begin_offset) == (GetStatus.NO_MESSAGE_IN_QUEUE, 0)
    assert store.get_message("grp", "bad topic", 0, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    assert store.get_message("grp", "G", -1, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE


def test_overflow_statuses(store: MessageStore) -> None:
    _fill(store, "O", 3)
    one = store.get_message("grp", "O", 0, 3)
    assert (one.status, one.next_begin_offset) == (GetStatus.OFFSET_OVERFLOW_ONE, 3)
    badly = store.get_message("grp", "O", 0, 100)
    # corrected to the max offset, never rewound to 0 (apache/rocketmq 4215)
    assert (badly.status, badly.next_begin_offset, badly.max_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 3, 3)


def test_offset_too_small_after_expiry(make_store: Callable[..., MessageStore]) -> None:
    s = make_store(file_reserved_time_hours=0)
    for i in range(60):
        assert s.put_message("Exp", 0, b"%d" % i + b"." * 400).ok
    s.flush()
    assert s.cleanup is not None
    report = s.cleanup.clean_once(manual=True)
    assert report.deleted_commit_log_files >= 1
    lo = s.min_offset("Exp", 0)
    assert lo > 0
    r = s.get_message("grp", "Exp", 0, 0)
    assert (r.status, r.next_begin_offset) == (GetStatus.OFFSET_TOO_SMALL, lo)
    ok = s.get_message("grp", "Exp", 0, r.next_begin_offset)
    assert ok.status is GetStatus.FOUND and ok.messages()[0].body.startswith(b"%d." % lo)
    assert s.check() == []


def test_tag_filter_and_no_matched_message(store: MessageStore) -> None:
    _fill(store, "F", 9)
    a = store.get_message("grp", "F", 0, 0, 32, tag_codes={tag_hash_code("TagA")})
    assert [m.body for m in a.messages()] == [b"m0", b"m3", b"m6"] and a.next_begin_offset == 9
    none = store.get_message("grp", "F", 0, 0, 32, tag_codes={tag_hash_code("TagZ")})
    assert (none.status, none.next_begin_offset) == (GetStatus.NO_MATCHED_MESSAGE, 9)
    f = store.get_message("grp", "F", 0, 0, 32, message_filter=lambda m: m.body.endswith(b"4"))
    assert [m.body for m in f.messages()] == [b"m4"]
    f0 = store.get_message("grp", "F", 0, 0, 32, message_filter=lambda m: False)
    assert f0.status is GetStatus.NO_MATCHED_MESSAGE


def test_limits_by_count_and_bytes(store: MessageStore) -> None:
    _fill(store, "L", 9)
    assert store.get_message("grp", "L", 0, 0, max_msgs=2).message_count == 2
    one_size = store.get_message("grp", "L", 0, 0, max_msgs=1).messages()[0].store_size
    by_bytes = store.get_message("grp", "L", 0, 0, max_msgs=32, max_bytes=one_size * 2 + 1)
    assert by_bytes.message_count == 2 and by_bytes.next_begin_offset == 2
    tiny = store.get_message("grp", "L", 0, 0, max_msgs=32, max_bytes=1)
    assert tiny.message_count == 1  # the first message is always returned


@pytest.mark.unchecked_store("files deleted under the reader, before cleanup corrects the queue")
def test_files_gone_under_the_reader(store: MessageStore) -> None:
    _fill(store, "Gone", 15)  # 2 consume-queue files
    cq = store.queues.find("Gone", 0)
    assert cq is not None
    cq.files.delete_first(1)  # the first consume-queue file disappears, min offset not yet corrected
    r = store.get_message("grp", "Gone", 0, 3)
    assert (r.status, r.next_begin_offset) == (GetStatus.OFFSET_FOUND_NULL, 10)


def test_commit_log_file_gone_under_the_reader(store: MessageStore) -> None:
    """Units whose entries expired before cleanup moved the queue's minimum: OFFSET_TOO_SMALL up to the first
    unit still readable, as after the move. They were skipped silently (MESSAGE_WAS_REMOVING, or inside a FOUND
    answer), so a Spark source with failOnDataLoss=true lost them without failing."""
    for i in range(60):
        assert store.put_message("Rm", 0, b"%d" % i + b"." * 400).ok
    store.flush()
    store.commit_log.files.delete_first(1)  # consume queue still points into it
    assert store.min_offset("Rm", 0) == 0  # not corrected yet: the window this test is about
    cq = store.queues.find("Rm", 0)
    assert cq is not None
    kept_from = store.min_phys_offset()
    first_kept = next(q for q in range(60) if cq.unit(q).commitlog_offset >= kept_from)  # type: ignore[union-attr]
    r = store.get_message("grp", "Rm", 0, 0, 4)  # every unit read expired: the answer names the first kept one
    assert (r.status, r.next_begin_offset, r.min_offset) == (GetStatus.OFFSET_TOO_SMALL, first_kept, first_kept)
    at, answers = 2, 0
    while True:  # from expired units into kept ones: every step says "too small", none skips a kept unit
        r = store.get_message("grp", "Rm", 0, at, 32)
        if r.status is not GetStatus.OFFSET_TOO_SMALL:
            break
        assert at < r.next_begin_offset == r.min_offset <= first_kept
        at, answers = r.next_begin_offset, answers + 1
    assert at == first_kept and answers >= 1
    r = store.get_message("grp", "Rm", 0, first_kept, 32)
    assert r.status is GetStatus.FOUND and r.queue_offsets[0] == first_kept
    assert r.messages()[0].body.startswith(b"%d." % first_kept)


@pytest.mark.unchecked_store("units torn on purpose")
def test_units_without_entries_are_message_was_removing(store: MessageStore) -> None:
    """An empty unit inside a queue (a torn write recovery did not see) names no entry: skipped, said so."""
    _fill(store, "Hole", 5)
    cq = store.queues.find("Hole", 0)
    assert cq is not None
    cq.files.files[0].write_at(1 * CQ_UNIT.size, bytes(2 * CQ_UNIT.size))
    r = store.get_message("grp", "Hole", 0, 1, 2)
    assert (r.status, r.next_begin_offset) == (GetStatus.MESSAGE_WAS_REMOVING, 3)
    r = store.get_message("grp", "Hole", 0, 0, 5)  # a FOUND answer skips them
    assert r.status is GetStatus.FOUND and r.queue_offsets == [0, 3, 4]


@pytest.mark.unchecked_store("a unit torn and files deleted on purpose")
def test_empty_units_are_not_taken_for_expired_ones(store: MessageStore) -> None:
    """Once the commit log's first offset is above 0, an empty unit (offset 0) lies below it too; it must not
    start an expired prefix that would answer OFFSET_TOO_SMALL past the live units after it."""
    for i in range(150):
        assert store.put_message("Ex", 0, b"%04d" % i + b"." * 400).ok
    store.flush()
    store.commit_log.files.delete_first(1)
    cq = store.queues.find("Ex", 0)
    assert cq is not None
    cq.correct_min_offset(store.min_phys_offset())  # as cleanup does after expiry
    assert 0 < store.min_offset("Ex", 0) < 100
    f = cq.files.find(100 * CQ_UNIT.size)
    assert f is not None
    for unit in (100, 103):  # torn units around two live ones
        f.write_at(unit * CQ_UNIT.size - f.file_from_offset, bytes(CQ_UNIT.size))
    r = store.get_message("grp", "Ex", 0, 100, max_msgs=4)
    assert (r.status, r.queue_offsets, r.next_begin_offset) == (GetStatus.FOUND, [101, 102], 104)


def test_get_after_shutdown_raises(store: MessageStore) -> None:
    store.shutdown()
    with pytest.raises(ServiceNotAvailableError):
        store.get_message("grp", "G", 0, 0)


def test_offset_by_time_and_earliest_time(store: MessageStore) -> None:
    t0 = time.time_ns() // 1_000_000 + 10**6  # in the future, so the clock never overtakes it
    for i in range(10):
        store.commit_log.last_store_timestamp = t0 + 1000 * i  # store time t0 + i s (never goes back)
        assert store.put_message("Time", 0, b"%d" % i).store_timestamp == t0 + 1000 * i
    store.wait_dispatched()
    assert store.offset_by_time("Time", 0, 0) == 0
    assert store.offset_by_time("Time", 0, t0 + 3000) == 3
    assert store.offset_by_time("Time", 0, t0 + 3001) == 4
    assert store.offset_by_time("Time", 0, t0 + 10**7) == 10
    assert store.offset_by_time("None", 0, t0) == 0
    assert store.earliest_message_time("Time", 0) == t0
    assert store.earliest_message_time("None", 0) == -1


def test_lookups_by_offset_and_msg_id(store: MessageStore) -> None:
    r = store.put_message("Look", 0, b"payload", {"KEYS": "k1"})
    m = store.view_by_msg_id(r.msg_ids[0])
    assert m is not None and m.body == b"payload" and m.msg_id == r.msg_ids[0]
    assert store.lookup_message(r.commitlog_offsets[0] + 1) is None
    assert store.lookup_message(10**9) is None


def test_a_stray_offset_reads_no_further_than_an_entry_head(store: MessageStore) -> None:
    """A msgId of another broker, or an end-by-offset, may name any offset. Where no message head lies (wrong
    magic, or a size no file holds), nothing past the 88-byte header (which holds PHYSICALOFFSET) is read."""
    heads = [PREFIX.pack(4000, 12345), PREFIX.pack(1 << 30, MESSAGE_MAGIC)]  # wrong magic; right magic, too big
    body = b"x" * 8 + b"".join(heads) + b"y" * 8
    r = store.put_message("Stray", 0, body)
    store.put_message("Stray", 0, b"z" * 8000)  # written bytes past the fake heads' sizes, within the file
    at = r.commitlog_offsets[0] + BODY_START + 4 + 8  # where the first fake head lies inside the body
    reads: list[int] = []
    real_read = store.commit_log.read

    def spy(offset: int, size: int) -> bytes | None:
        reads.append(size)
        return real_read(offset, size)

    store.commit_log.read = spy  # type: ignore[method-assign]
    assert store.lookup_message(at) is None
    assert store.lookup_message(at + PREFIX.size) is None
    assert reads == [ENTRY_HEADER.size, ENTRY_HEADER.size]
    assert store.lookup_message(r.commitlog_offsets[0]) is not None  # a real head is read whole


def test_arrival_listener_and_topic_listing(store: MessageStore) -> None:
    seen: list[tuple[str, int, int]] = []
    event = threading.Event()

    def on_arrival(topic: str, qid: int, max_offset: int) -> None:
        seen.append((topic, qid, max_offset))
        event.set()

    store.add_arrival_listener(on_arrival)
    store.put_message("Arr", 3, b"x")
    assert event.wait(5)
    assert ("Arr", 3, 1) in seen
    assert store.queue_ids("Arr") == [3] and "Arr" in store.topics()
    assert store.dispatched_offset() == store.commit_log.max_offset
    stats = store.stats()
    assert stats["put_msgs"] == 1 and 0 <= stats["disk_usage_ratio"] <= 1


def test_delete_topic(store: MessageStore) -> None:
    _fill(store, "Del", 3)
    _fill(store, "Keep", 2)
    store.delete_topic("Del")
    assert "Del" not in store.topics() and store.max_offset("Del", 0) == 0
    assert store.get_message("grp", "Del", 0, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE
    assert store.put_message("Del", 0, b"again").queue_offsets == [0]
    store.wait_dispatched()
    assert [m.body for m in store.get_message("grp", "Del", 0, 0).messages()] == [b"again"]
    assert store.get_message("grp", "Keep", 0, 0).message_count == 2
    assert store.check() == []


def test_scalar_and_vectorised_get_paths_agree(make_store: Callable[..., MessageStore]) -> None:
    """Gets of <= 64 units use struct, bigger ones numpy: the same question must get the same answer."""
    s = make_store(mapped_file_size_consume_queue=400 * 20)
    for i in range(150):
        s.put_message("P", 0, b"%d" % i * (1 + i % 7), {"TAGS": "TagA" if i % 4 == 0 else "TagB"})
        s.put_message("Other", 0, b"interleaved")  # entries of P are not contiguous in the commit log
    assert s.wait_dispatched()
    for kwargs in ({}, {"tag_codes": {tag_hash_code("TagA")}}, {"max_bytes": 2000}, {"max_bytes": 1}):
        small = s.get_message("g", "P", 0, 10, 64, **kwargs)  # type: ignore[arg-type]
        big = s.get_message("g", "P", 0, 10, 150, **kwargs)  # type: ignore[arg-type]
        n = small.message_count
        assert small.status is big.status is GetStatus.FOUND
        assert big.queue_offsets[:n] == small.queue_offsets
        assert [m.body for m in big.messages()][:n] == [m.body for m in small.messages()]
        if small.next_begin_offset < 74:  # stopped by bytes, not by the unit count
            assert big.next_begin_offset == small.next_begin_offset
    assert s.check() == []


@pytest.mark.unchecked_store("a unit torn and files deleted on purpose")
def test_a_hole_does_not_hide_expired_units_behind_it(store: MessageStore) -> None:
    """An empty unit at the read offset, then units whose entries expired: the read answered
    MESSAGE_WAS_REMOVING (a pull's NO_MATCHED_MSG), a silent skip of the expired ones."""
    for i in range(60):
        assert store.put_message("HoleEx", 0, b"%d" % i + b"." * 400).ok
    store.flush()
    cq = store.queues.find("HoleEx", 0)
    assert cq is not None
    cq.files.files[0].write_at(1 * CQ_UNIT.size, bytes(CQ_UNIT.size))  # unit 1 torn
    store.commit_log.files.delete_first(1)  # units 0..~30 expired, the minimum not moved yet
    first_kept = next(q for q in range(2, 60) if cq.unit(q).commitlog_offset >= store.min_phys_offset())  # type: ignore[union-attr]
    r = store.get_message("grp", "HoleEx", 0, 1, 8)
    assert (r.status, r.next_begin_offset) == (GetStatus.OFFSET_TOO_SMALL, first_kept)
