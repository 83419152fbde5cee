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
        timer_progress.save(path, low, done, 4096)
        assert timer_progress.load(path) == (low, {o for o in done if o >= low}, 4096)


def test_in_order_deliveries_make_one_range(tmp_path: Path) -> None:
    path = timer_progress.path_in(str(tmp_path))
    timer_progress.save(path, 10, set(range(12, 5000)), 777)
    assert json.loads(Path(path).read_text()) == {"low": 10, "done": [[12, 5000]], "log_end": 777}


def test_the_newer_record_wins() -> None:
    copy = timer_progress.Progress(8, {9, 12}, log_end=1000)  # the last master went further than the journal
    assert timer_progress.merge(5, {7, 9}, copy, log_end=1000) == (8, {9, 12})
    assert timer_progress.merge(10, {11}, copy, log_end=1000) == (10, {11, 12})
    assert timer_progress.merge(5, {7, 9}, None, log_end=1000) == (5, {7, 9})
    both = timer_progress.merge(5, {6}, timer_progress.Progress(5, {7}, 0), log_end=0)
    assert both == (5, {6, 7})  # both are deliveries that happened


def test_a_copy_ahead_of_the_log_is_not_used(caplog: pytest.LogCaptureFixture) -> None:
    """The copy reached this replica before the log bytes of the deliveries it names: trusting it could skip a
    timer message whose delivered copy this log lacks (lost); the journal alone repeats deliveries instead."""
    copy = timer_progress.Progress(8, {9}, log_end=2000)
    assert timer_progress.merge(5, {6}, copy, log_end=1999) == (5, {6})
    assert "past this store's end 1999" in caplog.text


def test_too_many_ranges_leave_out_the_highest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timer_progress, "MAX_RANGES", 3)
    path = timer_progress.path_in(str(tmp_path))
    timer_progress.save(path, 0, {2, 4, 6, 8, 10}, 100)
    assert timer_progress.load(path) == (0, {2, 4, 6}, 100)  # 8 and 10 would be delivered again: never lost


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"{not json", "cannot be read"),
        (b'{"done": [], "log_end": 0}', "cannot be read"),
        (b'{"low": 0, "done": []}', "cannot be read"),
        (b'{"low": "x", "done": [], "log_end": 0}', "cannot be read"),
        (b'{"low": 3, "done": [[9, 4]], "log_end": 0}', "reversed"),
        (b'{"low": 0, "done": [[0, 1000000000000]], "log_end": 0}', "past"),
        (b'{"low": -1, "done": [], "log_end": 0}', "negative"),
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
