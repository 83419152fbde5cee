"""Transaction visibility (txn_visibility.py): in-place entries are unseen until their marker commits them, skipped
for good once it rolls them back, and the queue's readable limit stops at the first entry of an open slice; the
state follows the log through restarts and crashes."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.errors import CorruptionError, MessageIllegalError
from broker.format.message import SysFlag, decode_entry, encode_entry, encode_properties, make_msg_id
from broker.store import GetStatus, MessageStore
from broker.store.txn_visibility import (
    MARKER_QUEUE_ID,
    MARKER_TOPIC,
    STATE_FILE,
    Marker,
    decode_marker,
    encode_marker,
)
from tests.unit.store.conftest import small_config

PREPARED = SysFlag.TRANSACTION_PREPARED_TYPE


def _in_place(topic: str, qid: int, handle: int, bodies: list[bytes], keys: str = "") -> bytes:
    props = encode_properties({"KEYS": keys}) if keys else b""
    return b"".join(
        encode_entry(topic.encode(), qid, b, props, sys_flag=PREPARED, prepared_transaction_offset=handle)
        for b in bodies
    )


def _plain(topic: str, qid: int, bodies: list[bytes]) -> bytes:
    return b"".join(encode_entry(topic.encode(), qid, b) for b in bodies)


def _mark(store: MessageStore, committed: list[int], aborted: list[int]) -> None:
    assert store.put_message(MARKER_TOPIC, MARKER_QUEUE_ID, encode_marker(committed, aborted)).ok
    assert store.wait_dispatched()


def _read_all(store: MessageStore, topic: str, qid: int, max_msgs: int = 32) -> list[tuple[int, bytes]]:
    """Every (queue offset, body) a reader pulling from the queue's first offset gets, in order."""
    out: list[tuple[int, bytes]] = []
    offset = store.min_offset(topic, qid)
    for _ in range(10_000):
        got = store.get_message("g", topic, qid, offset, max_msgs=max_msgs)
        if got.status is GetStatus.FOUND:
            ends = [*got.entry_positions[1:], len(got.buffer)]
            for qoff, a, b in zip(got.queue_offsets, got.entry_positions, ends, strict=True):
                out.append((qoff, decode_entry(got.buffer[a:b]).body))
        elif got.status is not GetStatus.NO_MATCHED_MESSAGE:
            return out
        assert got.next_begin_offset > offset
        offset = got.next_begin_offset
    raise AssertionError("the reader never reached the end")


# ------------------------------------------------------------------------------------------------ marker format
def test_a_marker_round_trips() -> None:
    assert decode_marker(encode_marker([7, 9], [11])) == Marker((7, 9), (11,))
    assert decode_marker(encode_marker([], [3])) == Marker((), (3,))


@pytest.mark.parametrize(
    ("committed", "aborted"), [([], []), ([0], []), ([5], [-1]), ([4, 4], []), ([4], [4]), (list(range(1, 70_000)), [])]
)
def test_a_marker_refuses_what_it_cannot_mean(committed: list[int], aborted: list[int]) -> None:
    with pytest.raises(MessageIllegalError):
        encode_marker(committed, aborted)


@pytest.mark.parametrize("cut", [b"", b"STXM", b"XXXX\x01\x00\x00\x00\x01\x00\x00\x00\x00" + bytes(8)])
def test_a_damaged_marker_names_where_it_lies(cut: bytes) -> None:
    with pytest.raises(CorruptionError) as e:
        decode_marker(cut, "/store/commitlog/0", 4096)
    assert "/store/commitlog/0 at byte 4096" in e.value.message
    with pytest.raises(CorruptionError):
        decode_marker(encode_marker([5], [])[:-1], "f", 0)


# ------------------------------------------------------------------------------------------------ one store
def test_open_entries_hold_the_queue_and_a_commit_shows_them_at_once(store: MessageStore) -> None:
    assert store.put_batch(_plain("T", 0, [b"p0", b"p1"])).ok
    assert store.put_batch(_in_place("T", 0, 100, [b"t0", b"t1", b"t2"])).ok
    assert store.put_batch(_plain("T", 0, [b"p5"])).ok  # after the open slice: held back with it (Kafka's LSO)
    assert store.put_batch(_in_place("T", 1, 100, [b"u0"])).ok
    assert store.wait_dispatched()
    assert store.max_offset("T", 0) == 2 and store.max_offset("T", 1) == 0
    assert [b for _, b in _read_all(store, "T", 0)] == [b"p0", b"p1"]
    woken: list[tuple[str, int, int]] = []
    store.add_arrival_listener(lambda t, q, m: woken.append((t, q, m)))
    _mark(store, [100], [])
    assert store.max_offset("T", 0) == 6 and store.max_offset("T", 1) == 1
    assert [b for _, b in _read_all(store, "T", 0)] == [b"p0", b"p1", b"t0", b"t1", b"t2", b"p5"]
    assert ("T", 0, 6) in woken and ("T", 1, 1) in woken
    assert store.check() == []


@pytest.mark.parametrize("max_msgs", [1, 3, 32, 200])  # the scalar and the numpy read paths
def test_rolled_back_entries_are_skipped_by_every_read(store: MessageStore, max_msgs: int) -> None:
    for i in range(40):  # two slices interleaved with plain messages
        assert store.put_batch(_in_place("T", 0, 200 + i % 2, [b"s%d-%d" % (i % 2, i)] * (1 + i % 3))).ok
        assert store.put_batch(_plain("T", 0, [b"p%d" % i])).ok
    assert store.wait_dispatched()
    _mark(store, [200], [201])
    bodies = [b for _, b in _read_all(store, "T", 0, max_msgs)]
    assert not any(b.startswith(b"s1") for b in bodies)
    assert sum(b.startswith(b"s0") for b in bodies) == sum(1 + i % 3 for i in range(0, 40, 2))
    assert [b for b in bodies if b.startswith(b"p")] == [b"p%d" % i for i in range(40)]
    assert store.check() == []


def test_a_filtered_read_skips_rolled_back_entries_too(store: MessageStore) -> None:
    assert store.put_batch(_in_place("T", 0, 300, [b"gone"] * 3) + _plain("T", 0, [b"kept"])).ok
    assert store.wait_dispatched()
    _mark(store, [], [300])
    got = store.get_message("g", "T", 0, 0, message_filter=lambda m: True)
    assert got.status is GetStatus.FOUND and got.queue_offsets == [3]


def test_an_entry_of_a_decided_slice_takes_its_decision(store: MessageStore) -> None:
    """A straggler written after the marker: rolled back at once, or shown at once; it holds nothing back."""
    _mark(store, [400], [401])
    assert store.put_batch(_in_place("T", 0, 401, [b"late-abort"]) + _in_place("T", 0, 400, [b"late-commit"])).ok
    assert store.wait_dispatched()
    assert [b for _, b in _read_all(store, "T", 0)] == [b"late-commit"]


def test_lookups_by_key_and_id_show_only_committed_entries(store: MessageStore) -> None:
    put = store.put_batch(
        _in_place("T", 0, 500, [b"a"], keys="K") + _in_place("T", 0, 501, [b"b"], keys="K") + _plain("T", 1, [b"c"])
    )
    assert put.ok
    assert store.wait_dispatched()
    ids = [make_msg_id(b"\x7f\x00\x00\x01", store.config.store_host[1], o) for o in put.commitlog_offsets]
    assert store.query_by_key("T", "K") == []
    assert [store.view_by_msg_id(i) is not None for i in ids] == [False, False, True]
    _mark(store, [500], [501])
    assert [m.body for m in store.query_by_key("T", "K")] == [b"a"]
    assert [store.view_by_msg_id(i) is not None for i in ids] == [True, False, True]


def test_the_readable_limit_also_bounds_offsets_by_time(store: MessageStore) -> None:
    assert store.put_batch(_plain("T", 0, [b"p"]) + _in_place("T", 0, 600, [b"t"])).ok
    assert store.wait_dispatched()
    assert store.offset_by_time("T", 0, 2**62) == 1
    assert store.queue_ranges("T", [0]) == [(0, 0, 1)]


# ------------------------------------------------------------------------------------------------ restarts
@pytest.mark.parametrize("crash", [False, True])
def test_open_and_rolled_back_slices_survive_a_restart(make_store: Callable[..., MessageStore], crash: bool) -> None:
    s = make_store()
    assert s.put_batch(_in_place("T", 0, 700, [b"x"] * 2) + _plain("T", 0, [b"p"])).ok
    assert s.put_batch(_in_place("T", 0, 701, [b"open"]) + _plain("T", 0, [b"q"])).ok
    assert s.wait_dispatched()
    _mark(s, [], [700])
    if crash:
        s.abandon()
    else:
        s.shutdown()
    s2 = make_store()
    assert s2.recovery_report is not None and s2.recovery_report.abnormal == crash
    assert [b for _, b in _read_all(s2, "T", 0)] == [b"p"]
    assert s2.max_offset("T", 0) == 3
    _mark(s2, [701], [])
    assert [b for _, b in _read_all(s2, "T", 0)] == [b"p", b"open", b"q"]
    assert s2.check() == []


def test_a_state_file_past_the_log_end_is_rebuilt_from_the_log(make_store: Callable[..., MessageStore]) -> None:
    s = make_store()
    assert s.put_batch(_in_place("T", 0, 800, [b"x"]) + _plain("T", 0, [b"p"])).ok
    _mark(s, [], [800])
    s.shutdown()
    path = os.path.join(s.config.config_dir, STATE_FILE)
    with open(path) as f:
        state = json.load(f)
    state.update(appliedTo=10**12, aborted=[], decided=[])  # says nothing was rolled back, as of a far offset
    with open(path, "w") as f:
        json.dump(state, f)
    s2 = make_store()
    assert [b for _, b in _read_all(s2, "T", 0)] == [b"p"]
    assert s2.check() == []


def test_the_state_file_is_written_at_start_and_a_clean_restart_redispatches_nothing(
    make_store: Callable[..., MessageStore],
) -> None:
    s = make_store()
    assert os.path.exists(os.path.join(s.config.config_dir, STATE_FILE))
    assert s.put_batch(_in_place("T", 0, 900, [b"x"]) + _plain("T", 0, [b"p"])).ok
    assert s.wait_dispatched()
    s.shutdown()
    s2 = make_store()
    assert s2.recovery_report is not None and s2.recovery_report.redispatched_entries == 0
    assert s2.max_offset("T", 0) == 0


def test_a_replica_built_from_the_same_log_shows_the_same(tmp_path: object, store: MessageStore) -> None:
    """A slave's dispatcher reads the master's bytes: copying the commit log into a fresh store (no state file)
    and recovering it gives the same readable limits and skips."""
    assert store.put_batch(_in_place("T", 0, 1000, [b"a"] * 3) + _plain("T", 0, [b"p"])).ok
    assert store.put_batch(_in_place("T", 0, 1001, [b"b"]) + _plain("T", 1, [b"q"])).ok
    _mark(store, [], [1000])
    store.flush()
    copy = MessageStore(small_config(os.path.join(str(tmp_path), "copy")))
    os.makedirs(copy.config.commit_log_dir, exist_ok=True)
    for f in store.commit_log.files.files:
        with open(os.path.join(copy.config.commit_log_dir, os.path.basename(f.path)), "wb") as out:
            out.write(f.mm[:])
    copy.start()
    try:
        for qid in (0, 1):
            assert _read_all(copy, "T", qid) == _read_all(store, "T", qid)
            assert copy.max_offset("T", qid) == store.max_offset("T", qid)
        assert copy.check() == []
    finally:
        copy.shutdown()


# ------------------------------------------------------------------------------------------------ property
@dataclass
class _Model:
    entries: dict[int, list[tuple[str, int, bytes]]] = field(default_factory=dict)  # qid -> (kind, handle, body)
    decided: dict[int, bool] = field(default_factory=dict)

    def expected(self, qid: int) -> list[tuple[int, bytes]]:
        rows = self.entries.get(qid, [])
        limit = next((i for i, (k, h, _) in enumerate(rows) if k == "t" and h not in self.decided), len(rows))
        return [(i, b) for i, (k, h, b) in enumerate(rows[:limit]) if k == "p" or self.decided[h]]


class TransactionsInPlace(RuleBasedStateMachine):
    """Any interleaving of plain and in-place writes, commits, rollbacks, clean restarts and crashes: a pull from
    the start gives exactly the plain and committed messages, in offset order, up to the first open slice."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="sluice-txnvis-")
        self.store = self._open()
        self.model = _Model()
        self.n = 0

    def _open(self) -> MessageStore:
        s = MessageStore(small_config(os.path.join(self.dir, "store")))
        s.start()
        return s

    @rule(qid=st.integers(0, 1), count=st.integers(1, 3))
    def plain(self, qid: int, count: int) -> None:
        bodies = [b"p%d" % (self.n + i) for i in range(count)]
        self.n += count
        assert self.store.put_batch(_plain("T", qid, bodies)).ok
        self.model.entries.setdefault(qid, []).extend(("p", 0, b) for b in bodies)

    @rule(handle=st.integers(1, 6), qid=st.integers(0, 1), count=st.integers(1, 4))
    def in_place(self, handle: int, qid: int, count: int) -> None:
        bodies = [b"t%d" % (self.n + i) for i in range(count)]
        self.n += count
        assert self.store.put_batch(_in_place("T", qid, handle, bodies)).ok
        self.model.entries.setdefault(qid, []).extend(("t", handle, b) for b in bodies)

    @rule(handles=st.sets(st.integers(1, 6), min_size=1, max_size=3), commit=st.booleans())
    def decide(self, handles: set[int], commit: bool) -> None:
        fresh = sorted(h for h in handles if h not in self.model.decided)
        if not fresh:
            return
        _mark(self.store, fresh if commit else [], [] if commit else fresh)
        for h in fresh:
            self.model.decided[h] = commit

    @precondition(lambda self: self.n > 0)
    @rule(crash=st.booleans())
    def restart(self, crash: bool) -> None:
        if crash:
            self.store.abandon()
        else:
            self.store.shutdown()
        self.store = self._open()

    @invariant()
    def reads_match(self) -> None:
        assert self.store.wait_dispatched()
        for qid in (0, 1):
            assert _read_all(self.store, "T", qid, max_msgs=5) == self.model.expected(qid)

    def teardown(self) -> None:
        problems = self.store.check()
        self.store.shutdown()
        shutil.rmtree(self.dir, ignore_errors=True)
        assert problems == []


TransactionsInPlace.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_transactions_in_place = TransactionsInPlace.TestCase


@pytest.mark.parametrize("crash", [False, True])
def test_large_batches_take_the_vectorised_dispatch_the_same_way(
    make_store: Callable[..., MessageStore], crash: bool
) -> None:
    """Batches of hundreds of entries are dispatched from put_batch's hints, and recovery re-dispatches them in
    8 MiB passes: both vectorised paths hold, show and skip as the per-entry one does."""
    big = dict(mapped_file_size_commit_log=4 * 1024 * 1024, max_batch_bytes=1024 * 1024, max_message_size=65536)
    s = make_store(**big)
    rows = [b"r%04d" % i for i in range(600)]
    assert s.put_batch(_in_place("T", 0, 50, rows[:300]) + _plain("T", 1, rows[:300])).ok
    assert s.put_batch(_in_place("T", 0, 51, rows[300:]) + _plain("T", 0, [b"after"])).ok
    assert s.wait_dispatched()
    assert (s.max_offset("T", 0), s.max_offset("T", 1)) == (0, 300)
    _mark(s, [50], [51])
    assert [b for _, b in _read_all(s, "T", 0, 100)] == [*rows[:300], b"after"]
    if crash:
        s.abandon()
    else:
        s.shutdown()
    os.unlink(os.path.join(s.config.config_dir, STATE_FILE))  # recovery rebuilds from the log's first file...
    with open(s.config.checkpoint_path, "r+b") as f:  # ...when the checkpoint says nothing was dispatched
        f.write(bytes(4096))
    s2 = make_store(**big)
    assert s2.recovery_report is not None and s2.recovery_report.redispatched_entries >= 902
    assert [b for _, b in _read_all(s2, "T", 0, 100)] == [*rows[:300], b"after"]
    assert s2.check() == []


def test_rolled_back_entries_are_reclaimed_with_their_files(make_store: Callable[..., MessageStore]) -> None:
    """Expiry deletes a rolled-back transaction's entries with their commit-log files like any message; its
    aborted ranges and its decision go from the state with them."""
    s = make_store(file_reserved_time_hours=1, delete_when="")
    assert s.put_batch(_in_place("T", 0, 20, [b"x" * 300] * 30)).ok
    _mark(s, [], [20])
    for i in range(80):  # several more 16 KiB files
        assert s.put_batch(_plain("T", 0, [b"p%03d" % i + b"." * 300])).ok
    s.flush()
    assert s.queues.queues[("T", 0)].aborted == [(0, 30)]
    old = time.time() - 2 * 3600
    for f in s.commit_log.files.files[:2]:  # the files holding the transaction's entries and its marker
        os.utime(f.path, (old, old))
    assert s.cleanup is not None and s.cleanup.clean_once(manual=True).deleted_commit_log_files == 2
    assert s.min_offset("T", 0) >= 30
    s.txn_visibility.save(s.commit_log.min_offset, force=True)
    assert s.queues.queues[("T", 0)].aborted == [] and s.txn_visibility.decision(20) is None
    left = _read_all(s, "T", 0)
    assert left and all(b.startswith(b"p") for _, b in left) and left[-1][1].startswith(b"p079")
    assert s.check() == []


def test_entries_registered_twice_count_once(store: MessageStore) -> None:
    """The state may be saved in the middle of a dispatch pass; recovery then dispatches that pass again from the
    saved offset, and each entry must still count once (a commit's count check relies on it)."""
    assert store.put_batch(_in_place("T", 0, 30, [b"a", b"b", b"c"])).ok
    assert store.wait_dispatched()
    vis = store.txn_visibility
    cq = store.queues.queues[("T", 0)]
    vis.register(("T", 0), cq, np.array([30, 30], np.int64), np.array([1, 2], np.int64))  # the pass again
    assert [(s.entries, s.first_offsets) for s in vis.open_slices()] == [(3, {("T", 0): 0})]
    _mark(store, [30], [])
    assert [b for _, b in _read_all(store, "T", 0)] == [b"a", b"b", b"c"]
    assert store.check() == []


def test_saves_from_several_threads_never_collide(store: MessageStore) -> None:
    """The flush thread and every store.flush() caller (a transaction's commit) save the state: two writes of
    the file at once replaced each other's temp file and the store stopped taking writes."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def flusher() -> None:
        try:
            while not stop.is_set():
                store.flush()
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=flusher) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for i in range(200):
            assert store.put_batch(_in_place("T", i % 2, 100 + i, [b"r"])).ok
            if i % 10 == 9:
                _mark(store, list(range(100 + i - 9, 101 + i)), [])
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == [] and store.is_writable()
    assert len(_read_all(store, "T", 0)) + len(_read_all(store, "T", 1)) == 200


def test_a_read_inside_a_rolled_back_range_answers_past_its_end(store: MessageStore) -> None:
    """A pop or pull landing in a long rolled-back range (a failed Spark task's rows) moves past all of it in one
    answer, not max_msgs units at a time."""
    for _ in range(5):  # within the small test store's batch limit
        assert store.put_batch(_in_place("T", 0, 40, [b"gone"] * 100)).ok
    assert store.put_batch(_plain("T", 0, [b"kept"])).ok
    _mark(store, [], [40])
    cq = store.queues.queues[("T", 0)]
    assert (cq.aborted_end(0), cq.aborted_end(499), cq.aborted_end(500)) == (500, 500, 500)
    got = store.get_message("g", "T", 0, 10, max_msgs=8)
    assert got.status is GetStatus.NO_MATCHED_MESSAGE and got.next_begin_offset == 500
    assert [b for _, b in _read_all(store, "T", 0, max_msgs=8)] == [b"kept"]
