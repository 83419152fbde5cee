"""Which coordinator a new transaction may name (coordinator_names.py), and the transaction service refusing one it
could never ask before storing anything, on every way into a transaction."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from broker.errors import InvalidArgumentError, ServiceNotAvailableError
from broker.format.message import encode_entry, encode_properties
from broker.format.transaction_codec import ATTEMPT, COORDINATOR
from broker.semantics.coordinator_names import KNOWN_TTL_S, MAX_KNOWN, CoordinatorNames
from broker.semantics.transaction import TransactionService

if TYPE_CHECKING:
    from store_box import StoreBox


class NameServers:
    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.asked = 0
        self.down = False

    def __call__(self) -> list[str]:
        self.asked += 1
        if self.down:
            raise ServiceNotAvailableError("no name server answered")
        return list(self.names)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_its_own_name_and_no_name_are_always_taken() -> None:
    names = CoordinatorNames("broker-a", None)
    names.require("broker-a")
    names.require("")


def test_without_name_servers_no_other_broker_is_taken() -> None:
    with pytest.raises(InvalidArgumentError, match="no name servers"):
        CoordinatorNames("broker-a", None).require("broker-b")


def test_a_listed_name_is_taken_and_trusted_for_a_while() -> None:
    servers, clock = NameServers(["broker-a", "broker-b"]), Clock()
    names = CoordinatorNames("broker-a", servers, clock=clock)
    names.require("broker-b")
    names.require("broker-b")
    assert servers.asked == 1
    clock.now += KNOWN_TTL_S + 1
    servers.names = ["broker-a"]  # gone from the name servers since
    with pytest.raises(InvalidArgumentError, match=r"'broker-b'.*they list: broker-a"):
        names.require("broker-b")
    assert servers.asked == 2


def test_an_unlisted_name_is_refused_each_time_it_is_asked() -> None:
    servers = NameServers(["broker-a", "broker-c"])
    names = CoordinatorNames("broker-a", servers)
    for _ in range(2):
        with pytest.raises(InvalidArgumentError, match=r"'broker-typo'.*broker-a, broker-c"):
            names.require("broker-typo")
    assert servers.asked == 2
    servers.names.append("broker-typo")  # a broker registering later is taken at once
    names.require("broker-typo")


def test_name_servers_that_do_not_answer_cannot_say_no() -> None:
    servers = NameServers([])
    servers.down = True
    CoordinatorNames("broker-a", servers).require("broker-b")


def test_the_names_remembered_are_bounded() -> None:
    servers = NameServers([f"b{i}" for i in range(MAX_KNOWN + 100)])
    names = CoordinatorNames("broker-a", servers)
    names.require("b0")
    assert len(names._known) == MAX_KNOWN


# ------------------------------------------------------------------------------------------ the service's hook


def rows(props: dict[str, str]) -> bytes:
    return b"".join(encode_entry(b"Coord", 0, b"m%d" % i, encode_properties(props)) for i in range(3))


@pytest.fixture
def tx(box: StoreBox) -> Iterator[TransactionService]:
    service = TransactionService(box.s, os.path.join(box.path, "config"))
    service.require_coordinator = CoordinatorNames("broker-a", NameServers(["broker-a", "broker-c"])).require
    service.start()
    yield service
    service.shutdown()


def test_every_way_into_a_transaction_refuses_an_unknown_coordinator_storing_nothing(
    box: StoreBox, tx: TransactionService
) -> None:
    end = box.s.max_phys_offset()
    with pytest.raises(InvalidArgumentError):
        tx.put_in_place(rows({}), "PG", "t1", attempt="a", coordinator="broker-typo")
    with pytest.raises(InvalidArgumentError):
        tx.put_half_batch(rows({ATTEMPT: "a", COORDINATOR: "broker-typo"}), "PG", "t2")
    with pytest.raises(InvalidArgumentError):
        tx.prepare_half("Coord", 0, b"one", {COORDINATOR: "broker-typo"}, "PG", "t3")
    assert box.s.max_phys_offset() == end
    assert tx.list_transactions() == []


def test_a_known_coordinator_is_taken_and_asked_about_once_per_transaction(
    box: StoreBox, tx: TransactionService
) -> None:
    asked: list[str] = []
    check = tx.require_coordinator
    assert check is not None

    def counting(name: str) -> None:
        asked.append(name)
        check(name)

    tx.require_coordinator = counting
    assert tx.put_in_place(rows({}), "PG", "t1", attempt="a", coordinator="broker-c").ok
    assert tx.put_in_place(rows({}), "PG", "t1", attempt="b", coordinator="broker-c").ok
    assert tx.put_half_batch(rows({ATTEMPT: "a", COORDINATOR: "broker-a"}), "PG", "t2").ok
    res, _ = tx.prepare_half("Coord", 0, b"one", {}, "PG", "t3")  # names none: nothing asked
    assert res.ok
    assert asked == ["broker-c", "broker-a"]
