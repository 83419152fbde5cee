"""Ctrl-C (SIGINT) during the long-running commands: a summary of what was done, exit status 130, no traceback."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from broker.client import Admin, Message, Producer
from broker.server.broker_controller import BrokerController
from tests.support.waiting import wait_until

INTERRUPTED = 130


def popen(endpoint: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "SLUICE_ENDPOINT": endpoint, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "broker", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def interrupt(proc: subprocess.Popen[str]) -> tuple[str, str]:
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert proc.returncode == INTERRUPTED, (proc.returncode, out, err)
    return out, err


def stored(endpoint: str, topic: str) -> int:
    with Admin(endpoint) as admin:
        return sum(hi - lo for lo, hi in admin.queue_offsets(topic).values())


def test_ctrl_c_during_send_reports_what_was_acknowledged(broker: BrokerController, endpoint: str) -> None:
    """Ctrl-C printed a KeyboardInterrupt traceback and no count of what had been sent."""
    with Admin(endpoint) as admin:
        admin.create_topic("IntSend", 4)
    proc = popen(endpoint, "send", "IntSend", "--count", "100000000", "--size", "16")
    wait_until(lambda: stored(endpoint, "IntSend") >= 5000, timeout_s=60)
    _, err = interrupt(proc)
    match = re.search(r"interrupted: (\d+) of 100000000 messages sent to IntSend, (\d+) acknowledged", err)
    assert match, err
    sent, acked = int(match.group(1)), int(match.group(2))
    assert sent == acked >= 5000  # the first Ctrl-C lets the batch being sent finish: nothing is in doubt
    assert broker.store is not None and broker.store.wait_dispatched()
    assert stored(endpoint, "IntSend") == acked  # what it says was acknowledged is exactly what is stored


def test_ctrl_c_during_consume_follow_commits_what_was_printed(broker: BrokerController, endpoint: str) -> None:
    """`consume --follow` exited 0 on Ctrl-C, as if it had finished."""
    with Producer(endpoint) as p:
        p.send_batch([Message("IntFollow", b"m%d" % i) for i in range(30)], queue_id=0)
    proc = popen(endpoint, "consume", "IntFollow", "--group", "int-follow", "--from", "earliest", "--follow")
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(30)]  # every message printed; then it waits for more
    assert sorted(line.rstrip("\n").rsplit("  ", 1)[1] for line in lines) == sorted(repr(f"m{i}") for i in range(30))
    _, err = interrupt(proc)
    assert "interrupted: consumed 30 messages; group int-follow committed after the last printed message" in err
    with Admin(endpoint) as admin:
        assert admin.committed_offsets("int-follow", "IntFollow")[0] == 30


def test_ctrl_c_stops_the_broker_cleanly(tmp_path: Path) -> None:
    """The broker exited 0 on Ctrl-C, the same as on SIGTERM."""
    proc = popen("unused:1", "broker", "--store", str(tmp_path / "st"), "--listen", "127.0.0.1:0")
    assert proc.stdout is not None
    assert "ready on" in proc.stdout.readline()
    out, _ = interrupt(proc)
    assert "sluice broker stopped (interrupted)" in out
    assert not (tmp_path / "st" / "abort").exists()  # a clean shutdown removes the abort marker


def test_ctrl_c_while_a_broker_does_not_answer(tmp_path: Path) -> None:
    """A command waiting on a broker that accepts the connection but never answers: Ctrl-C printed a traceback."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        connected = threading.Event()
        threading.Thread(target=lambda: (silent.accept(), connected.set()), daemon=True).start()
        proc = popen(f"127.0.0.1:{silent.getsockname()[1]}", "topic", "list")
        assert connected.wait(60), "the command never connected"
        _, err = interrupt(proc)
    assert err.strip().splitlines()[-1] == "interrupted"


def test_a_second_ctrl_c_stops_a_stuck_send_and_says_what_is_in_doubt() -> None:
    """The first Ctrl-C waits for the call in flight (so nothing is in doubt); against a broker that never answers
    the second one stops at once, and the summary says that message may or may not be stored."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        connected = threading.Event()
        threading.Thread(target=lambda: (silent.accept(), connected.set()), daemon=True).start()
        proc = popen(f"127.0.0.1:{silent.getsockname()[1]}", "send", "Stuck", "--body", "x", "--queue", "0")
        assert connected.wait(60), "the command never connected"
        assert proc.stderr is not None
        proc.send_signal(signal.SIGINT)
        notice = proc.stderr.readline()
        while notice == "\n":  # the notice starts on a line of its own
            notice = proc.stderr.readline()
        assert "stopping after the batch being sent is answered (Ctrl-C again to stop at once)" in notice, notice
        _, err = interrupt(proc)
    assert ("interrupted: 1 of 1 messages sent to Stuck, 0 acknowledged (stored); 1 more were being sent and may or "
            "may not be stored") in err, err
