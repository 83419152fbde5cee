"""ClientRegistry's bounds on their own: the table's cap and the per-user share, which does not apply with auth
off (every client is then nobody's), and idle clients forgotten to make room."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from broker.auth.accounts import Accounts, User
from broker.auth.caller import Caller
from broker.errors import NoPermissionError, SystemBusyError
from broker.rmqv2.clients import ClientRegistry


def caller(tmp_path: Path, key: str) -> Caller:
    return Caller(key, None, Accounts(str(tmp_path), User("root", "root-secret")))


def test_with_auth_off_the_whole_table_is_anyones() -> None:
    clients = ClientRegistry(expire_ms=60_000, max_streams=4, max_clients=8)
    for i in range(8):
        clients.seen(f"c{i}")
    with pytest.raises(SystemBusyError):
        clients.seen("c8")
    assert clients.count() == 8
    clients.seen("c0")  # known clients are still heard


def test_a_user_holds_a_quarter_and_an_id_belongs_to_its_first_user(tmp_path: Path) -> None:
    clients = ClientRegistry(expire_ms=60_000, max_streams=4, max_clients=8)
    alice, bob = caller(tmp_path, "alice"), caller(tmp_path, "bob")
    clients.seen("a0", alice)
    clients.seen("a1", alice)
    with pytest.raises(SystemBusyError):
        clients.seen("a2", alice)
    with pytest.raises(NoPermissionError):
        clients.seen("a0", bob)
    with pytest.raises(NoPermissionError):
        clients.open_stream("a0", bob)
    assert clients.owner("a0") == "alice" and clients.open_count() == 0
    clients.seen("b0", bob)
    clients.terminate("a0")
    clients.seen("a2", alice)  # its share is free again
    assert clients.count() == 3


def test_idle_clients_are_forgotten_to_make_room(tmp_path: Path) -> None:
    clients = ClientRegistry(expire_ms=50, max_streams=4, max_clients=4)
    alice = caller(tmp_path, "alice")
    clients.seen("a0", alice)
    time.sleep(0.1)
    clients.seen("a1", alice)  # a0 expired: forgotten, its place taken
    assert clients.owner("a0") is None and clients.count() == 1
