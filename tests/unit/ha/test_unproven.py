"""The table of replication handshakes not proven yet (broker/ha/unproven.py): its bounds per source address, in all
and in time, and how a gRPC peer maps to a source."""

from __future__ import annotations

import pytest

from broker.errors import ResponseCode, SystemBusyError
from broker.ha import unproven
from broker.ha.unproven import Unproven, source_of
from broker.proto import ha_pb2 as hpb


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_sources_are_addresses_and_ipv6_counts_by_its_64_prefix() -> None:
    assert source_of("ipv4:10.0.0.7:51234") == "10.0.0.7"
    assert source_of("ipv6:[2001:db8:1:2::5]:443") == source_of("ipv6:[2001:db8:1:2:ffff::9]:80") == "2001:db8:1:2::/64"
    assert source_of("ipv6:[2001:db8:1:3::5]:443") != source_of("ipv6:[2001:db8:1:2::5]:443")
    assert source_of("ipv6:[::ffff:10.0.0.7]:5") == "10.0.0.7"  # an IPv4 peer on a dual-stack socket
    assert source_of("unix:/tmp/sock") == "unix"


def test_one_source_holds_at_most_its_share_until_joins_or_the_timeout_free_it() -> None:
    clock = Clock()
    table = Unproven(clock)
    held = [table.add(hpb.Hello(broker_id=i), "10.0.0.7")[0] for i in range(unproven.MAX_UNPROVEN_PER_SOURCE)]
    with pytest.raises(SystemBusyError) as busy:
        table.add(hpb.Hello(), "10.0.0.7")
    assert busy.value.code == ResponseCode.SYSTEM_BUSY and "10.0.0.7" in busy.value.message
    assert len(table) == unproven.MAX_UNPROVEN_PER_SOURCE  # the refused one left nothing behind
    table.add(hpb.Hello(), "10.0.0.8")  # another address is not affected
    taken = table.take(held[0])
    assert taken is not None and taken.hello.broker_id == 0 and table.take(held[0]) is None  # one Join per handshake
    table.add(hpb.Hello(), "10.0.0.7")  # the Join freed a place
    clock.now += unproven.UNPROVEN_TIMEOUT_S + 0.1
    assert table.take(held[1]) is None  # expired
    for _ in range(unproven.MAX_UNPROVEN_PER_SOURCE):
        table.add(hpb.Hello(), "10.0.0.7")
    assert len(table) == unproven.MAX_UNPROVEN_PER_SOURCE


def test_the_table_is_bounded_in_entries_and_bytes() -> None:
    table = Unproven(Clock())
    for i in range(unproven.MAX_UNPROVEN):
        table.add(hpb.Hello(), f"10.1.{i // 250}.{i % 250}")
    with pytest.raises(SystemBusyError):
        table.add(hpb.Hello(), "10.9.9.9")
    big = hpb.Hello(epochs=[hpb.EpochEntry(epoch=e, start_offset=e << 20) for e in range(1, 10_001)])
    per = big.ByteSize()
    table = Unproven(Clock())
    fits = unproven.MAX_UNPROVEN_BYTES // per
    for i in range(fits):
        table.add(big, f"10.2.{i // 250}.{i % 250}")
    with pytest.raises(SystemBusyError):
        table.add(big, "10.9.9.9")
    assert len(table) == fits < unproven.MAX_UNPROVEN
