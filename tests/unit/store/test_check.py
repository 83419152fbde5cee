"""check(): the consistency oracle reports planted damage of each kind, naming where it is."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker.format.message import Prop
from broker.store import MessageStore
from broker.store.consume_queue import CQ_UNIT
from broker.store.index_file import INDEX_ENTRY


def _filled(make_store: Callable[..., MessageStore]) -> MessageStore:
    s = make_store()
    for i in range(12):
        assert s.put_message("R", 0, b"msg-%03d" % i, {Prop.KEYS: f"key{i}", "TAGS": "a"}).ok
    assert s.wait_dispatched()
    assert s.check() == []
    return s


@pytest.mark.unchecked_store("the test corrupts a unit to see check() report it")
def test_wrong_consume_queue_unit(make_store: Callable[..., MessageStore]) -> None:
    s = _filled(make_store)
    cq = s.queues.find("R", 0)
    assert cq is not None
    unit = cq.unit(3)
    assert unit is not None
    cq.put_units(3, CQ_UNIT.pack(unit.commitlog_offset, unit.size, unit.tag_hash + 1))  # wrong tag hash
    problems = s.check()
    assert any("consume queue R/0 unit 3" in p and "does not match" in p for p in problems), problems


@pytest.mark.unchecked_store("the test corrupts a unit to see check() report it")
def test_unit_pointing_nowhere(make_store: Callable[..., MessageStore]) -> None:
    s = _filled(make_store)
    cq = s.queues.find("R", 0)
    assert cq is not None
    unit = cq.unit(5)
    assert unit is not None
    cq.put_units(5, CQ_UNIT.pack(unit.commitlog_offset + 1, unit.size, unit.tag_hash))
    assert any("unit 5" in p and "no entry starts" in p for p in s.check())


@pytest.mark.unchecked_store("the test corrupts the offset table to see check() report it")
def test_next_offset_table_out_of_step(make_store: Callable[..., MessageStore]) -> None:
    s = _filled(make_store)
    s.commit_log.queue_table[("R", 0)] = 99
    assert any("next-offset table says 99" in p for p in s.check())


@pytest.mark.unchecked_store("the test corrupts the index to see check() report it")
def test_index_entry_with_a_foreign_key(make_store: Callable[..., MessageStore]) -> None:
    s = _filled(make_store)
    assert s.index is not None
    f = s.index.files[-1]
    e = f.entry(2)
    at = f._entries_at + 2 * INDEX_ENTRY.size
    INDEX_ENTRY.pack_into(f.mm, at, e.key_hash ^ 1, e.commitlog_offset, e.time_diff_s, e.prev_index)
    problems = s.check()
    assert any("entry 2" in p and "is not a key" in p for p in problems)
    # and the other way round: the message is no longer indexed under its own key
    missing = f"message at commit-log offset {e.commitlog_offset} (R): key hash {e.key_hash} has no index entry"
    assert missing in problems, problems
