"""A client keeps trying a broker that is away about once a second, so it uses the broker again soon after it is
back, however long it was away."""

from __future__ import annotations

import itertools
import socket
import threading
import time

import pytest

from broker.client.connection import Connection
from broker.errors import BrokerError
from broker.proto import sluice_pb2 as pb


def test_a_broker_that_is_away_is_tried_again_about_every_second() -> None:
    """gRPC's default waits 1, 1.6, 2.6, 4.1 ... s (up to 120 s) between attempts, calls failing at once in between:
    a consumer's queues of a broker back after minutes away resumed up to two minutes later, and a producer sharing
    the address (gRPC shares the connection attempts of one address) could not send to it meanwhile."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    attempts: list[float] = []

    def refuse() -> None:  # accepts and closes at once: a broker that is not there yet, as gRPC sees it
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            attempts.append(time.monotonic())
            conn.close()

    threading.Thread(target=refuse, daemon=True).start()
    client = Connection(f"127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.5)
    try:
        started = time.monotonic()
        while time.monotonic() - started < 10.0:  # a consumer retrying its pulls
            with pytest.raises(BrokerError):
                client.call(client.stub.GetBrokerStats, pb.GetBrokerStatsRequest())
            time.sleep(0.1)
        ended = time.monotonic()
    finally:
        client.close()
        listener.close()
    gaps = [b - a for a, b in itertools.pairwise([*attempts, ended])]  # the last: not tried again since
    assert len(attempts) >= 4, attempts
    # every wait is about 1 s (gRPC adds 20 % jitter; the rest is room for a busy machine); the default's fourth,
    # due within these 10 s, is 4.1 s
    assert max(gaps) < 2.5, [round(g, 2) for g in gaps]
