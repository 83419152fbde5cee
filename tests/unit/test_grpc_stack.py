"""The gRPC TCP stack choice made on ``import broker`` (broker/grpc_stack.py): made when nobody chose, left alone
otherwise, and understood by the grpcio this project runs on."""

from __future__ import annotations

import os
import subprocess
import sys

from broker.grpc_stack import EXPERIMENTS_VAR, IOMGR_LISTENER, choose_tcp_stack


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != EXPERIMENTS_VAR}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                          timeout=60, check=True)


def test_importing_broker_chooses_the_iomgr_stack_when_nobody_chose() -> None:
    out = run_python(f"import os, broker; print(os.environ[{EXPERIMENTS_VAR!r}])")
    assert out.stdout.strip() == IOMGR_LISTENER


def test_a_choice_made_by_the_process_is_kept_even_an_empty_one() -> None:
    code = f"import os, broker; print(repr(os.environ[{EXPERIMENTS_VAR!r}]))"
    assert run_python(code, **{EXPERIMENTS_VAR: ""}).stdout.strip() == "''"
    assert run_python(code, **{EXPERIMENTS_VAR: "-event_engine_client"}).stdout.strip() == "'-event_engine_client'"


def test_client_channels_stay_on_the_event_engine() -> None:
    """An iomgr channel notices a broker's death only at its next send, which then cannot be moved to another
    broker (grpc_stack.py); the choice must leave client channels alone."""
    assert "event_engine_client" not in IOMGR_LISTENER and "-event_engine_listener" in IOMGR_LISTENER.split(",")


def test_a_process_that_imported_grpc_first_keeps_its_stack() -> None:
    out = run_python(f"import os, grpc, broker; print(os.environ.get({EXPERIMENTS_VAR!r}))")
    assert out.stdout.strip() == "None"


def test_grpc_knows_the_experiments_it_is_asked_to_turn_off() -> None:
    """A grpcio that no longer has these experiments logs "Unknown experiment" and runs its default stack: the
    choice would be silently lost, so a grpcio upgrade that drops them fails here."""
    code = (
        "import broker, grpc\n"
        "channel = grpc.insecure_channel('127.0.0.1:1')\n"
        "try:\n"
        "    grpc.channel_ready_future(channel).result(timeout=0.2)\n"
        "except grpc.FutureTimeoutError:\n"
        "    pass\n"
        "channel.close()\n"
    )
    out = run_python(code)
    assert "experiment" not in out.stderr.lower(), out.stderr


def test_choose_reports_whether_it_chose() -> None:
    assert choose_tcp_stack({}, {"grpc": object()}) is False  # too late: grpc read its variables at import
    environ: dict[str, str] = {}
    assert choose_tcp_stack(environ, {}) is True
    assert environ == {EXPERIMENTS_VAR: IOMGR_LISTENER}
    environ = {EXPERIMENTS_VAR: "x"}
    assert choose_tcp_stack(environ, {}) is False
    assert environ == {EXPERIMENTS_VAR: "x"}
