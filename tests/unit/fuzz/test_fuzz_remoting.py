"""Fuzzing the broker process's RocketMQ remoting port with the fuzz suite's oracle (fuzz_oracle.Fuzzer) and the
remoting rules of fuzz_remoting.py: frames that are no frame (each malformation the issue names), valid frames
damaged at random, and well-framed requests of every served code (and unknown ones) with sends whose fields are
mostly right and requests whose fields and bodies are anything. After each family the broker is stopped, its store
checked and restarted, and every acknowledged message read back; no message of a refused frame may be stored.

The default run is short and deterministic; ``make fuzz`` (SLUICE_FUZZ_LONG=1) runs fifteen times the examples,
random ones, with a SIGKILL instead of a clean stop after every other family.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.remoting.command import RemotingCommand
from broker.remoting.frame import encode_frame
from tests.unit.fuzz.fuzz_oracle import FUZZ_SETTINGS, SCALE, STORE_SETTINGS, started_fuzzer
from tests.unit.fuzz.fuzz_remoting import (
    Remoting,
    garbage_requests,
    malformed_frames,
    mutate,
    mutations,
    plausible_sends,
    with_unique_bodies,
)

pytestmark = pytest.mark.slow
BROKER_SETTINGS = {"store": STORE_SETTINGS, "remoting_listen": "127.0.0.1:0"}


@pytest.fixture(scope="module")
def remoting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remoting]:
    with started_fuzzer(tmp_path_factory.mktemp("fuzz-remoting"), BROKER_SETTINGS) as f:
        r = Remoting(f)
        try:
            yield r
        finally:
            r.close()


def test_remoting_frames_family(remoting: Remoting) -> None:
    @settings(FUZZ_SETTINGS, max_examples=100 * SCALE)
    @given(st.one_of(malformed_frames(), st.tuples(plausible_sends(), mutations())))
    def one(case: bytes | tuple[RemotingCommand, tuple[int, str, bytes]]) -> None:
        if isinstance(case, bytes):
            remoting.frame(case)
            return
        command, (where, how, piece) = case
        command = with_unique_bodies(remoting, command)
        remoting.frame(mutate(encode_frame(command), where, how, piece), command)

    one()
    print(remoting.fuzzer.end_family("remoting frames, malformed and damaged"))


def test_remoting_requests_family(remoting: Remoting) -> None:
    @settings(FUZZ_SETTINGS, max_examples=200 * SCALE)
    @given(st.one_of(plausible_sends(), plausible_sends(), garbage_requests()))
    def one(command: RemotingCommand) -> None:
        remoting.request(with_unique_bodies(remoting, command))

    one()
    print(remoting.fuzzer.end_family("remoting requests of every served code"))


def test_the_remoting_families_saw_both_outcomes(remoting: Remoting) -> None:
    """Messages stored and refused, frames answered and malformed ones closed."""
    f = remoting.fuzzer
    assert f.families == 2 and f.calls > f.refused > 0, (f.families, f.calls, f.refused)
    stored, refused = sum(s.must for s in remoting.sent), sum(not s.may for s in remoting.sent)
    assert stored > 10 and refused > 10, (stored, refused)
    assert remoting.answered > 50 and remoting.closed > 10, (remoting.answered, remoting.closed)
