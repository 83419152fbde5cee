"""The timer progress file (timer_progress.py): ranges that cover exactly the delivered offsets, the newer record
winning at start, and damaged files refused without taking the broker down."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.semantics import timer_progress


@given(st.sets(st.integers(min_value=0, max_value=5000)))
def test_ranges_cover_exactly_the_offsets(offsets: set[int]) -> None:
    ranges = timer_progress.to_ranges(offsets)
    assert timer_progress.from_ranges(ranges) == offsets
    assert all(a < b for a, b in ranges)
    assert all(r1[1] < r2[0] for r1, r2 in itertools.pairwise(ranges))  # sorted, apart, merged


@given(st.integers(0, 100), st.sets(st.integers(0, 300)))
def test_save_then_load_keeps_what_is_at_or_above_low(low: int, done: set[int]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = timer_progress.path_in(d)
        timer_progress.save(path, low, done)
        assert timer_progress.load(path) == (low, {o for o in done if o >= low})


def test_in_order_deliveries_make_one_range(tmp_path: Path) -> None:
    path = timer_progress.path_in(str(tmp_path))
    timer_progress.save(path, 10, set(range(12, 5000)))
    assert json.loads(Path(path).read_text()) == {"low": 10, "done": [[12, 5000]]}


def test_the_newer_record_wins() -> None:
    journal = (5, {7, 9})
    copy = (8, {9, 12})  # the last master went further
    assert timer_progress.merge(*journal, copy) == (8, {9, 12})
    assert timer_progress.merge(*copy, journal) == (8, {9, 12})
    assert timer_progress.merge(*journal, None) == journal
    assert timer_progress.merge(5, {6}, (5, {7})) == (5, {6, 7})  # both are deliveries that happened


def test_too_many_ranges_leave_out_the_highest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timer_progress, "MAX_RANGES", 3)
    path = timer_progress.path_in(str(tmp_path))
    timer_progress.save(path, 0, {2, 4, 6, 8, 10})
    assert timer_progress.load(path) == (0, {2, 4, 6})  # 8 and 10 would be delivered again: never lost


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"{not json", "cannot be read"),
        (b'{"done": []}', "cannot be read"),
        (b'{"low": "x", "done": []}', "cannot be read"),
        (b'{"low": 3, "done": [[9, 4]]}', "reversed"),
        (b'{"low": 0, "done": [[0, 1000000000000]]}', "past"),
        (b'{"low": -1, "done": []}', "negative"),
    ],
)
def test_a_damaged_file_is_ignored_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes, why: str
) -> None:
    path = timer_progress.path_in(str(tmp_path))
    Path(path).write_bytes(content)
    assert timer_progress.load(path) is None
    assert why in caplog.text and path in caplog.text


def test_no_file_is_no_record(tmp_path: Path) -> None:
    assert timer_progress.load(timer_progress.path_in(str(tmp_path))) is None
