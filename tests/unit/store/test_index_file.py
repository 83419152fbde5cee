"""Index: key lookups with forced hash collisions (8 slots), index-file rolling, header layout."""

from __future__ import annotations

import errno
import os
import struct
import threading
import time
from collections.abc import Callable

import pytest

from broker.errors import CorruptionError
from broker.format.message import BODY_START, Prop
from broker.store import MessageStore, commit_log, index_file
from broker.store.index_file import INDEX_ENTRY, INDEX_HEADER, IndexService, key_hash

# A driven store clock: later than any real store time here (the log keeps its times monotonic), 100 ms into its
# second, so that a millisecond later is still the same second.
STORED_AT_MS = 1_900_000_000_100


def test_layout_sizes() -> None:
    assert (INDEX_HEADER.size, INDEX_ENTRY.size) == (40, 20)


def test_lookups_with_forced_collisions(store: MessageStore) -> None:
    # 8 slots and 30 keys: every slot chain holds several keys
    for i in range(30):
        assert store.put_message("Idx", i % 3, b"v%d" % i, {Prop.KEYS: f"order-{i} common"}).ok
    store.wait_dispatched()
    slots = {key_hash(f"Idx#order-{i}") % 8 for i in range(30)}
    assert len(slots) < 30  # collisions are certain
    for i in range(30):
        found = store.query_by_key("Idx", f"order-{i}")
        assert [m.body for m in found] == [b"v%d" % i]
    common = store.query_by_key("Idx", "common", max_num=64)
    assert sorted(m.body for m in common) == sorted(b"v%d" % i for i in range(30))
    assert store.query_by_key("Idx", "common", max_num=5)[-1].body == b"v29"
    assert store.query_by_key("Other", "order-1") == []
    assert store.query_by_key("Idx", "missing") == []
    assert store.check() == []


def test_unique_key_and_time_range(store: MessageStore) -> None:
    r = store.put_message("Uq", 0, b"x", {Prop.UNIQ_KEY: "ABCDEF"})
    store.wait_dispatched()
    found = store.query_by_key("Uq", "ABCDEF")
    assert [m.msg_id for m in found] == r.msg_ids
    ts = r.store_timestamp
    assert store.query_by_key("Uq", "ABCDEF", begin_ms=ts + 5000) == []
    assert store.query_by_key("Uq", "ABCDEF", end_ms=ts - 5000) == []


def test_index_files_roll_when_full(make_store: Callable[..., MessageStore]) -> None:
    s = make_store(max_index_num=10)
    for i in range(40):
        assert s.put_message("Roll", 0, b"%d" % i, {Prop.KEYS: f"k{i}"}).ok
    s.wait_dispatched()
    assert s.index is not None and len(s.index.files) >= 4
    # header of the first file, decoded independently
    with open(s.index.files[0].path, "rb") as f:
        raw = f.read(40)
    begin_ts, end_ts, begin_phy, end_phy, slots, count = struct.unpack(">qqqqii", raw)
    assert slots == 8 and count == 10 and begin_phy == 0 and end_phy > begin_phy and end_ts >= begin_ts
    assert [m.body for m in s.query_by_key("Roll", "k0")] == [b"0"]
    assert [m.body for m in s.query_by_key("Roll", "k39")] == [b"39"]
    assert s.check() == []
    s.shutdown()
    s2 = make_store(max_index_num=10)
    assert [m.body for m in s2.query_by_key("Roll", "k21")] == [b"21"]
    assert len(os.listdir(s2.config.index_dir)) >= 4
    assert s2.check() == []


def test_query_by_key_reads_only_the_newest_max_num(make_store: Callable[..., MessageStore]) -> None:
    """A common key over many index files: the newest ``max_num`` come back, oldest first, and no more of the
    commit log is read than the candidates for them (not every match of every file)."""
    s = make_store(max_index_num=10)
    for i in range(60):
        assert s.put_message("Common", 0, b"%d" % i, {Prop.KEYS: "hot"}).ok
    s.wait_dispatched()
    assert s.index is not None and len(s.index.files) >= 6
    reads: list[int] = []
    real_lookup = s.lookup_message

    def spy(offset: int) -> object:
        reads.append(offset)
        return real_lookup(offset)

    s.lookup_message = spy  # type: ignore[method-assign,assignment]
    assert [m.body for m in s.query_by_key("Common", "hot", max_num=5)] == [b"%d" % i for i in range(55, 60)]
    assert len(reads) == 5  # each candidate a hit, newest first: the search stops at the fifth
    assert len(s.query_by_key("Common", "hot", max_num=1000)) == 60
    assert s.check() == []


def test_candidates_that_are_not_matches_do_not_use_up_the_answer(
    store: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys of one hash, and messages stored later in the range's last second, are index candidates that the
    exact checks reject: many of them in front must not fill the candidate limit (4 x max_num), or the matches
    behind them would never be read. The store's clock is driven: 10 matches, then 290 messages a millisecond
    later, in the same second."""
    clock_ms = [STORED_AT_MS]
    monkeypatch.setattr(commit_log, "now_ms", lambda: clock_ms[0])
    assert key_hash("T#Aa") == key_hash("T#BB")  # Java's hashCode: "Aa" and "BB" collide
    assert store.put_message("T", 0, b"the Aa message", {Prop.KEYS: "Aa"}).ok
    for i in range(300):
        assert store.put_message("T", 0, b"bb%d" % i, {Prop.KEYS: "BB"}).ok
    for i in range(300):
        clock_ms[0] = STORED_AT_MS + (i >= 10)
        assert store.put_message("E", 0, b"e%d" % i, {Prop.KEYS: "K"}).ok
    store.wait_dispatched()
    for max_num in (1, 64):
        assert [m.body for m in store.query_by_key("T", "Aa", max_num=max_num)] == [b"the Aa message"]
    want = [b"e%d" % i for i in range(10)]
    assert [m.body for m in store.query_by_key("E", "K", max_num=64, end_ms=STORED_AT_MS)] == want


@pytest.mark.parametrize("changed", [{"max_hash_slot_num": 16}, {"max_index_num": 128}])
def test_an_index_file_of_other_sizes_is_refused_not_extended(
    make_store: Callable[..., MessageStore], changed: dict[str, int]
) -> None:
    """The only index file, written with smaller sizes: it was taken for a crash leftover and extended, then
    read with the new layout (every key lookup empty, new entries written into the misread file)."""
    s = make_store()
    assert s.put_message("T", 0, b"x", {Prop.KEYS: "k"}).ok
    s.shutdown()
    with pytest.raises(CorruptionError, match="start with the max_hash_slot_num / max_index_num it was written"):
        make_store(**changed)
    s = make_store()  # with the sizes it was written with, all is as it was
    assert [m.body for m in s.query_by_key("T", "k")] == [b"x"]


def test_recovery_looks_past_an_empty_last_index_file(make_store: Callable[..., MessageStore]) -> None:
    """A crash right after a new index file was created (0 bytes): recovery's drop stopped at that empty file, so
    the file before it kept entries past the truncated log's end and messages written there later were never
    indexed (indexed_until stayed past them)."""
    s = make_store()
    offs = [s.put_message("Ix", 0, b"m%d" % i, {Prop.KEYS: f"old{i}"}).commitlog_offsets[0] for i in range(10)]
    assert s.wait_dispatched()
    s.abandon()
    with open(os.path.join(s.config.commit_log_dir, "0" * 20), "r+b") as fh:  # body CRC: the log is cut there
        fh.seek(offs[5] + BODY_START)
        fh.write(b"Z")
    open(os.path.join(s.config.index_dir, "29991231235959999"), "wb").close()  # the file the crash left
    s2 = make_store()
    assert s2.recovery_report is not None and s2.recovery_report.truncated_at == offs[5]
    assert s2.index is not None and s2.index.indexed_until < offs[5]
    for i in range(3):
        assert s2.put_message("Ix", 0, b"n%d" % i, {Prop.KEYS: f"new{i}"}).ok
    assert s2.wait_dispatched()
    assert [len(s2.query_by_key("Ix", f"new{i}")) for i in range(3)] == [1, 1, 1]
    assert [len(s2.query_by_key("Ix", f"old{i}")) for i in range(6)] == [1, 1, 1, 1, 1, 0]
    assert s2.check() == []


def test_time_range_matches_by_the_truncated_second(tmp_path: object) -> None:
    """TIME DIF holds whole seconds since the file's first entry, so an entry's store time is only known to lie
    in [ts, ts + 999]. A range starting inside that second finds it (slack added to the end would miss it)."""
    idx = IndexService(str(tmp_path), slots=8, entries=64, sync=os.fdatasync)
    begin = 1_790_000_000_000
    idx.put("T", ["first"], 100, begin)
    idx.put("T", ["K"], 200, begin + 1500)  # TIME DIF 1: stored somewhere in [begin + 1000, begin + 1999]
    assert idx.lookup("T", "K", 10, begin + 1500, begin + 2500) == [200]
    assert idx.lookup("T", "K", 10, begin + 1400, begin + 1500) == [200]
    assert idx.lookup("T", "K", 10, begin + 2000, begin + 9000) == []  # a second later: not a candidate
    assert idx.lookup("T", "K", 10, 0, begin + 999) == []


def test_a_lookup_stops_at_the_first_entry_older_than_the_range(tmp_path: object) -> None:
    """Chains run newest first: the walk stops, as RocketMQ's does, instead of going through every older entry of
    a hot key (under the lock the dispatcher's index writes need, stalling dispatch)."""
    idx = IndexService(str(tmp_path), slots=4, entries=5000, sync=os.fdatasync)
    begin = 1_790_000_000_000
    for i in range(4000):
        idx.put("T", ["hot"], 100 * (i + 1), begin + i * 1000)  # one entry per second
    reads = []
    f = idx.files[-1]
    entry = f.entry
    f.entry = lambda n: reads.append(n) or entry(n)  # type: ignore[method-assign]
    found = idx.lookup("T", "hot", 1000, begin + 3990 * 1000, begin + 10**9)
    assert found == [100 * (i + 1) for i in range(3999, 3989, -1)]
    assert len(reads) <= 12  # ten matches and the first older entry, not 4000


def test_query_by_key_leaves_out_a_deleted_generation(store: MessageStore) -> None:
    """A topic deleted and created again starts at queue offset 0: the old generation's messages, still in the
    commit log and the index, must not be answered as the topic's."""
    assert store.put_message("Gen", 0, b"old-generation", {Prop.KEYS: "k"}).ok
    assert store.wait_dispatched()
    store.delete_topic("Gen")
    assert store.query_by_key("Gen", "k") == []
    assert store.put_message("Gen", 0, b"new-generation", {Prop.KEYS: "k"}).ok
    assert store.wait_dispatched()
    assert [m.body for m in store.query_by_key("Gen", "k")] == [b"new-generation"]


def test_a_repeated_key_does_not_push_a_distinct_one_out(store: MessageStore) -> None:
    """The key list was cut to what one file holds before repeats were removed: KEYS "a" x 70 then "b" left b
    unindexed (not found by query_by_key, reported by check())."""
    assert store.put_message("T", 0, b"m", {Prop.KEYS: " ".join(["a"] * 70 + ["b"])}).ok
    assert store.wait_dispatched()
    assert [m.body for m in store.query_by_key("T", "b")] == [b"m"]
    assert [m.body for m in store.query_by_key("T", "a")] == [b"m"]


def test_a_full_disk_while_creating_an_index_file_leaves_no_empty_file(
    make_store: Callable[..., MessageStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """posix_fallocate failing (ENOSPC) left the new index file behind at 0 bytes, with its fd open, one more each
    time dispatch retried; once space was back the store went on, but the next start refused the 0-byte file."""
    s = make_store()
    assert s.index is not None
    real = os.posix_fallocate
    full = threading.Event()

    def fallocate(fd: int, offset: int, length: int) -> None:
        if full.is_set() and "/index/" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        real(fd, offset, length)

    monkeypatch.setattr(index_file.os, "posix_fallocate", fallocate)
    i = 0
    while len(s.index.files) < 1 or s.index.files[-1].header.index_count < s.index.entries - 4:
        assert s.put_message("K", 0, b"m", {Prop.KEYS: f"k{i}"}).ok
        assert s.wait_dispatched()
        i += 1
    files_before = sorted(os.listdir(s.config.index_dir))
    full.set()
    for _ in range(10):  # the next index file is needed and cannot be made: dispatch fails and retries
        s.put_message("K", 0, b"m", {Prop.KEYS: f"k{i}"})
        i += 1
    deadline = time.monotonic() + 5
    while s.is_writable() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not s.is_writable()
    assert sorted(os.listdir(s.config.index_dir)) == files_before  # no empty file left behind
    full.clear()
    deadline = time.monotonic() + 10
    while not s.is_writable() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert s.put_message("K", 0, b"after", {Prop.KEYS: "after"}).ok
    s.shutdown()
    s2 = make_store()  # started: an empty index file made this raise CorruptionError
    assert [m.body for m in s2.query_by_key("K", "after")] == [b"after"]
