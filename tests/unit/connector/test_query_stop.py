"""A stream reader's ``stop()``, and streaming queries stopped while they start and run: the driver prints no
traceback, neither from Spark's Python process that owns the reader nor from the driver's accumulator server."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest
from connector_helpers import new_topic
from crash_scale import crash_scale

from connector import broker_link, stream_reader
from connector.options import parse_options
from connector.stream_reader import SluiceStreamReader

DRIVER = Path(__file__).with_name("stop_queries.py")
STOPS = crash_scale(5, 30)  # each of stop_queries.STOP_AFTER_S once (`make test`), or six times (`make test-crash`)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_queries_stopped_while_they_start_and_run_print_no_traceback(broker: str, tmp_path: Path) -> None:
    """A stop that interrupts the query's thread while it talks to a Python process closes that socket: the
    reader's process printed PySpark's EOFError and BrokenPipeError traceback, and the driver's accumulator server
    an EOFError one. Either showed after a job's Ctrl-C, some of the time; here most stops would print one."""
    topic = new_topic(broker, 2)
    done = subprocess.run([sys.executable, str(DRIVER), broker, topic, str(tmp_path / "chk"), str(STOPS)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and f"stopped {STOPS} queries" in done.stdout, done.stderr[-5000:]
    assert "Traceback" not in done.stderr, done.stderr[-8000:]


def test_stop_closes_the_readers_link_only_and_the_process_goes_on(
    broker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside PySpark's runner process (a user's driver, a test), stop() with the runner's reason in flight
    (EOFError) closes the reader's link and returns: exiting there would end the user's program."""
    topic = new_topic(broker, 2)
    options = parse_options({"endpoints": broker, "topic": topic}, streaming=True)
    other = parse_options({"endpoints": broker, "topic": topic, "consumerGroup": f"g_{topic}"}, streaming=True)
    reader = SluiceStreamReader(options)
    reader.initialOffset()  # the reader's calls open its link
    link, other_link = broker_link.link_for(options), broker_link.link_for(other)
    closed: list[bool] = []
    close = link.close

    def counted_close() -> None:
        closed.append(True)
        close()

    monkeypatch.setattr(link, "close", counted_close)
    with pytest.raises(EOFError):
        try:
            raise EOFError  # what the runner's read_int raises once Spark closed its socket
        finally:
            reader.stop()
    assert closed == [True]
    assert broker_link.link_for(options) is not link  # forgotten: the next reader of these options opens a new one
    assert broker_link.link_for(other) is other_link  # another query's link stays open
    assert topic in broker_link.link_for(options).topics()  # a new link for the next call of the reader
    reader.stop()  # without anything in flight, and again: nothing to close twice
    assert closed == [True]


def test_only_a_hang_up_seen_by_the_runner_itself_ends_its_process(
    broker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the runner process, stop() exits for Spark's closed socket only: a reader method's error (even one of the
    same types) must reach the runner's error path, which tells Spark what failed."""

    def seen_while_unwinding(error: BaseException) -> bool:
        try:
            try:
                raise error
            finally:
                hung_up = stream_reader._spark_hung_up()
        except type(error):
            pass
        return hung_up

    assert not seen_while_unwinding(EOFError())  # pytest's process is not the runner

    runner = types.SimpleNamespace(__spec__=types.SimpleNamespace(name=stream_reader.SOURCE_RUNNER_MODULE))
    monkeypatch.setitem(sys.modules, "__main__", runner)
    assert not stream_reader._spark_hung_up()  # nothing in flight
    assert seen_while_unwinding(EOFError())
    assert seen_while_unwinding(BrokenPipeError(32, "Broken pipe"))
    assert not seen_while_unwinding(ValueError("a reader method failed"))

    reader = SluiceStreamReader(parse_options({"endpoints": broker, "topic": new_topic(broker, 2)}, streaming=True))

    def refused(options: object) -> None:
        raise ConnectionResetError(104, "reset while asking the broker")

    monkeypatch.setattr(stream_reader, "link_for", refused)
    hung_up = True
    try:
        reader.initialOffset()
    except ConnectionResetError:
        hung_up = stream_reader._spark_hung_up()
    assert not hung_up  # raised inside the reader: Spark is told
