"""What `make demo` says about itself is true: the broker it starts, each step, and its count of input rows."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from broker.client import Admin
from streaming_jobs import demo


def test_the_broker_step_names_the_child_process_it_started(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It printed "embedded broker ready" while it had started `sluice broker` as a subprocess."""
    broker = demo.start_broker(tmp_path / "store")
    try:
        line = capsys.readouterr().out.strip()
        match = re.fullmatch(r"\[1/4\] broker: started `python -m broker broker` as a child process \(pid (\d+)\) on "
                             r"(\S+), store in (\S+) \(removed at the end\)", line)
        assert match, line
        assert broker.proc is not None and int(match.group(1)) == broker.proc.pid
        cmdline = Path(f"/proc/{broker.proc.pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[1:3] == [b"-m", b"broker"] and b"broker" in cmdline[3:]  # that child is the broker
        assert match.group(2) == broker.endpoint and match.group(3) == str(tmp_path / "store")
        with Admin(broker.endpoint) as admin:
            assert admin.list_topics() == []
    finally:
        broker.stop()


def test_each_step_says_what_it_does_and_the_heartbeat_is_counted_in_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ "200001 input rows" stood beside "events sent: 200000" without a word on the extra row (the heartbeat)."""
    broker = demo.start_broker(tmp_path / "store")
    try:
        demo.produce(broker.endpoint, 50)
        with Admin(broker.endpoint) as admin:
            deadline = time.monotonic() + 30
            while (stored := sum(hi for _, hi in admin.queue_offsets(demo.SOURCE_TOPIC).values())) < 51:
                assert time.monotonic() < deadline, stored  # dispatched into the queues a moment after the send
                time.sleep(0.02)
    finally:
        broker.stop()
    out = capsys.readouterr().out
    assert "[2/4] produce: 50 click events" in out and "then 1 heartbeat event 3 minutes of event time later" in out
    assert stored == 50 + demo.HEARTBEATS  # what the streaming query will read
    assert demo.input_rows_text(stored, 50) == "51 messages (50 click events + 1 heartbeat)"
    assert "expected 50 click events + 1 heartbeat" in demo.input_rows_text(49, 50)
