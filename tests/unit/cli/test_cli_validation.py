"""`sluice` refuses bad input with one `error:` line (or a usage error), never a traceback or a silent guess."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from broker.cli import build_parser
from broker.cli.send import send_bodies


def parse_send(*args: str) -> argparse.Namespace:
    return build_parser().parse_args(["send", "T", "--body", "x", *args])


@pytest.mark.parametrize(("args", "needle"), [(("--count", "0"), "--count: 0 is below 1"),
                                              (("--count", "-5"), "--count: -5 is below 1"),
                                              (("--count", "many"), "--count: 'many' is not an integer"),
                                              (("--size", "-1"), "--size: -1 is below 0")])
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


@pytest.mark.parametrize(("argv", "needle"), [
    (["topic", "create", "T", "--queues", "0"], "--queues: 0 is below 1"),
    (["send", "T", "--body", "x", "--queue", "-1"], "--queue: -1 is below 0"),
    (["consume", "T", "--group", "g", "--max", "0"], "--max: 0 is below 1"),
    (["consume", "T", "--group", "g", "--tags", "A", "--sql", "a = 1"], "not allowed with argument"),
    (["query", "key", "T", "k", "--max", "5000"], "--max: 5000 is above 4096"),
    (["query", "key", "T", "k", "--begin", "yesterday"], "is not an ISO 8601 time"),
    (["group", "reset-offsets", "g", "--topic", "T"], "one of the arguments --to-earliest"),
    (["group", "reset-offsets", "g", "--topic", "T", "--to-earliest", "--to-offset", "3"], "not allowed with"),
    (["group", "reset-offsets", "g", "--topic", "T", "--to-offset", "-3"], "--to-offset: -3 is below 0"),
])
def test_numbers_and_choices_that_cannot_work_are_usage_errors(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`topic create --queues 0` made a topic with the default 8 queues; `consume --max 0` printed everything."""
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def test_every_command_and_option_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    """`sluice topic create --help` and the like listed their arguments without a word of explanation."""
    pending = [("sluice", build_parser())]
    seen = 0
    while pending:
        name, parser = pending.pop()
        seen += 1
        assert parser.description, f"{name} has no description"
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                unhelped = set(action.choices) - {a.dest for a in action._choices_actions if a.help}
                assert not unhelped, f"{name}: sub-commands without help: {unhelped}"
                pending += [(f"{name} {sub}", p) for sub, p in action.choices.items()]
            else:
                assert action.help, f"{name}: {action.option_strings or action.dest} has no help"
    assert seen >= 20  # every command and sub-command was looked at
    for argv in (["group", "reset-offsets", "--help"], ["tx", "commit", "--help"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(argv)
        assert "exit status 1" in capsys.readouterr().out  # the rules a user must know are in the help


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"sluice {metadata.version('sluice')}"
