"""bench.remoting_threads runs each candidate server and measures it: a short round, every candidate answered."""

from __future__ import annotations

from bench.remoting_threads import CANDIDATES, concurrent_sends, start_server, sync_sends


def test_every_candidate_server_answers_one_and_several_senders() -> None:
    for kind in CANDIDATES:
        proc, port = start_server(kind, work_us=10)
        try:
            assert sync_sends(port, seconds=0.2) > 0, kind
            assert concurrent_sends(port, senders=2, seconds=0.2) > 0, kind
        finally:
            proc.kill()
            proc.wait()
