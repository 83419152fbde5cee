"""The snapshot + journal record (broker/semantics/journal.py): replay in order, compaction, a torn last record cut
off, damage anywhere else refused with the file and byte offset."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from broker.errors import CorruptionError
from broker.semantics.journal import SNAPSHOT_FILE, Journal, encode_record


def recovered(folder: Path) -> tuple[Any, list[dict[str, Any]], Journal]:
    state: list[Any] = [None]
    records: list[dict[str, Any]] = []
    j = Journal(str(folder))
    j.recover(lambda s: state.__setitem__(0, s), records.append)
    return state[0], records, j


def test_records_replay_in_order_across_a_checkpoint(tmp_path: Path) -> None:
    _, _, j = recovered(tmp_path)
    for i in range(5):
        j.append({"i": i})
    j.checkpoint({"upto": 5})
    j.append({"i": 5})
    j.close()
    state, records, j = recovered(tmp_path)
    j.close()
    assert state == {"upto": 5} and records == [{"i": 5}]
    assert sorted(os.listdir(tmp_path)) == ["journal.2", SNAPSHOT_FILE]


def test_a_crash_between_switching_journals_and_the_snapshot_replays_both(tmp_path: Path) -> None:
    _, _, j = recovered(tmp_path)
    j.append({"i": 0})
    j.close()
    (tmp_path / "journal.2").write_bytes(encode_record({"i": 1}))  # the next journal, no snapshot for it yet
    state, records, j = recovered(tmp_path)
    j.close()
    assert state is None and records == [{"i": 0}, {"i": 1}]


def test_a_torn_last_record_is_cut_off_and_appending_goes_on(tmp_path: Path) -> None:
    _, _, j = recovered(tmp_path)
    j.append({"i": 0})
    j.close()
    whole = encode_record({"i": 1})
    with open(tmp_path / "journal.1", "ab") as f:
        f.write(whole[: len(whole) - 3])  # the append a crash cut short
    _, records, j = recovered(tmp_path)
    assert records == [{"i": 0}]
    j.append({"i": 2})
    j.close()
    assert recovered(tmp_path)[1] == [{"i": 0}, {"i": 2}]


def test_damage_before_the_end_is_refused_with_file_and_offset(tmp_path: Path) -> None:
    _, _, j = recovered(tmp_path)
    j.append({"i": 0})
    j.append({"i": 1})
    j.close()
    path = tmp_path / "journal.1"
    raw = bytearray(path.read_bytes())
    raw[10] ^= 0xFF  # a bit flip in the first record's payload
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptionError) as e:
        recovered(tmp_path)
    assert e.value.path == str(path) and e.value.offset == 0 and "CRC" in e.value.message


def test_a_snapshot_whose_crc_fails_is_not_used(tmp_path: Path) -> None:
    _, _, j = recovered(tmp_path)
    j.append({"i": 0})
    j.checkpoint({"upto": 1})
    j.close()
    snap = tmp_path / SNAPSHOT_FILE
    snap.write_text(snap.read_text().replace('"upto": 1', '"upto": 7'))
    with pytest.raises(CorruptionError):
        recovered(tmp_path)  # no readable copy: refused rather than started from a wrong state
