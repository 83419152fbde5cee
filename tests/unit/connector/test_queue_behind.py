"""The driver's side of a queue that shows less than the query read (connector/stream_reader.py ``_settling``): in a
cluster it is held, nothing planned for it, for up to the failover wait, then it is data loss as before; with one
broker it is data loss at once. (The executors' side, on a real replicated group:
tests/unit/ha/test_short_tail_wait.py.)"""

from __future__ import annotations

import pytest
from pytest import MonkeyPatch

from connector import stream_reader
from connector.connector_errors import DataLossError
from connector.offset_resolver import Snapshot
from connector.options import parse_options
from connector.stream_reader import SluiceStreamReader

KEY = ("orders", "broker-a", 0)
READ_TO, SHOWN = 50, 47  # the query read up to 50; the broker now shows 47


def reader(**source: str) -> SluiceStreamReader:
    return SluiceStreamReader(parse_options({"topic": "orders", **source}, streaming=True))


def test_a_cluster_holds_a_queue_behind_for_the_failover_wait_then_calls_it_lost(monkeypatch: MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(stream_reader.time, "monotonic", lambda: now[0])
    r = reader(namesrv="127.0.0.1:9876")
    snap = Snapshot({KEY: (0, SHOWN)})
    assert r._skip_lost({KEY: READ_TO}, snap, link=None) == {KEY: READ_TO}  # type: ignore[arg-type]  # held
    now[0] += stream_reader.FAILOVER_WAIT_S - 1
    assert r._skip_lost({KEY: READ_TO}, snap, link=None) == {KEY: READ_TO}  # type: ignore[arg-type]  # still
    now[0] += 1
    with pytest.raises(DataLossError, match="went back"):
        r._skip_lost({KEY: READ_TO}, snap, link=None)  # type: ignore[arg-type]


def test_a_queue_that_catches_up_starts_a_new_wait_next_time(monkeypatch: MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(stream_reader.time, "monotonic", lambda: now[0])
    r = reader(namesrv="127.0.0.1:9876")
    assert r._skip_lost({KEY: READ_TO}, Snapshot({KEY: (0, SHOWN)}), link=None) == {KEY: READ_TO}  # type: ignore[arg-type]
    now[0] += 30
    assert r._skip_lost({KEY: READ_TO}, Snapshot({KEY: (0, READ_TO + 5)}), link=None) == {KEY: READ_TO}  # type: ignore[arg-type]
    now[0] += stream_reader.FAILOVER_WAIT_S - 1  # behind again: its own wait, not what is left of the first
    assert r._skip_lost({KEY: READ_TO}, Snapshot({KEY: (0, SHOWN)}), link=None) == {KEY: READ_TO}  # type: ignore[arg-type]


def test_one_broker_calls_it_lost_at_once() -> None:
    r = reader(endpoints="127.0.0.1:10911")
    one = ("orders", "", 0)
    with pytest.raises(DataLossError, match="went back"):
        r._skip_lost({one: READ_TO}, Snapshot({one: (0, SHOWN)}), link=None)  # type: ignore[arg-type]
