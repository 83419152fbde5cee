"""`sluice` refuses bad input with one `error:` line (or a usage error), never a traceback or a silent guess."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from broker.cli import build_parser, send_bodies


def parse_send(*args: str) -> argparse.Namespace:
    return build_parser().parse_args(["send", "T", "--body", "x", *args])


@pytest.mark.parametrize(("args", "needle"), [(("--count", "0"), "--count: 0 is below 1"),
                                              (("--count", "-5"), "--count: -5 is below 1"),
                                              (("--count", "many"), "--count: 'many' is not an integer"),
                                              (("--size", "-1"), "--size: -1 is below 0")])  # fmt: skip
def test_send_count_and_size_must_make_sense(
    args: tuple[str, ...], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--count 0` sent one message (`args.count or 1`), `--count -5` none, both exiting 0."""
    with pytest.raises(SystemExit) as e:
        parse_send(*args)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


def test_send_count_defaults_to_one_and_size_may_be_zero() -> None:
    assert send_bodies(parse_send())[0] == 1
    assert send_bodies(parse_send("--count", "3"))[0] == 3
    count, body_of = send_bodies(build_parser().parse_args(["send", "T", "--size", "0"]))
    assert count == 1 and body_of(0) == b""


def run_broker(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "broker", "broker", "--store", str(tmp_path / "st"), "--listen", "127.0.0.1:0", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_broker_start_problems_are_one_error_line(tmp_path: Path) -> None:
    """Each of these printed a traceback (OverflowError from bind, UnicodeDecodeError, struct.error at start) or,
    for the store table, started with a flush mode other than the one the start line reported."""
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes(b'{"store_path": "\xff\xfe"}')
    store_host = tmp_path / "storehost.json"
    store_host.write_text('{"store": {"store_host": ["a", "b"]}}')
    flush = tmp_path / "flush.json"
    flush.write_text('{"store": {"flush_disk_type": "ASYNC_FLUSH"}}')
    cases = [
        (("--metrics-port", "99999"), "metrics_port is 99999; it must be a port in 0..65535"),
        (("--config", str(latin1)), "latin1.json is not UTF-8 text"),
        (("--config", str(store_host)), "the store table sets 'store_host'"),
        (("--flush", "sync", "--config", str(flush)), "the store table sets 'flush_disk_type'"),
    ]
    for args, needle in cases:
        out = run_broker(tmp_path, *args)
        assert "Traceback" not in out.stderr, out.stderr
        assert out.returncode == 1 and "ready" not in out.stdout, (args, out.stdout, out.stderr)
        errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and needle in errors[0], (args, out.stderr)
    assert not (tmp_path / "st").exists()  # refused before anything was started or created
