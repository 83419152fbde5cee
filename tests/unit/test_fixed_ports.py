"""Fixed ports (broker/address.py ``free_fixed_port``): a replica or etcd restarts on the port it was given, so no
two listeners of one process may be given the same port, whatever the tests did to ``random``."""

from __future__ import annotations

import random
import socket

import pytest
from pytest import MonkeyPatch

from broker import address
from broker.address import FIXED_PORT_HIGH, FIXED_PORT_LOW, free_fixed_port
from broker.errors import ServiceNotAvailableError


def test_no_port_is_handed_out_twice_even_when_the_module_random_is_reseeded() -> None:
    drawn = []
    for _ in range(200):
        random.seed(4712)  # what a crash loop replaying one seed does before it builds its group
        drawn.append(free_fixed_port())
    assert len(set(drawn)) == len(drawn)
    assert all(FIXED_PORT_LOW <= p < FIXED_PORT_HIGH for p in drawn)


def test_a_port_in_use_is_never_handed_out_and_an_exhausted_range_is_a_clear_error(monkeypatch: MonkeyPatch) -> None:
    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
    for port in range(FIXED_PORT_HIGH - 1, FIXED_PORT_LOW, -1):  # one port of the range nobody holds
        try:
            held.bind(("127.0.0.1", port))
            break
        except OSError:
            continue
    with held:
        held.listen()
        port = held.getsockname()[1]
        monkeypatch.setattr(address, "FIXED_PORT_LOW", port)
        monkeypatch.setattr(address, "FIXED_PORT_HIGH", port + 1)  # a range of one port, in use
        with pytest.raises(ServiceNotAvailableError, match=f"no free port in {port}..{port}"):
            free_fixed_port()
