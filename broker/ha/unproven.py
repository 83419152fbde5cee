"""Replication handshakes whose peer has not proved the group's secret yet (between Open and Join, master_endpoint.py).

They live apart from the replica sessions and hold nothing but the Hello and the master's nonce: an Open costs the
master one small entry, changes no state and takes no replica slot. The table is bounded three ways, so strangers
who reach the port cannot grow it or crowd out the group's own replicas:

* MAX_UNPROVEN_PER_SOURCE open handshakes per source address (an IPv6 address counts by its /64, what one host is
  usually given); an Open over it is refused with SYSTEM_BUSY, and a flood from one address leaves replicas on other
  addresses alone;
* MAX_UNPROVEN in all, holding MAX_UNPROVEN_BYTES of Hellos at most;
* UNPROVEN_TIMEOUT_S: a handshake not joined by then is forgotten.

Each handshake is taken out by the first Join that names it, whatever its proof: one guess per nonce.
"""

from __future__ import annotations

import ipaddress
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from broker.errors import SystemBusyError
from broker.ha import auth
from broker.proto import ha_pb2 as hpb

# A replica opens one handshake and joins it a few milliseconds later (Open and Join are back to back in
# slave_fetcher.SlaveFetcher). Four leave room for replicas of one group sharing a host, and for a retry after a lost
# answer, while a stranger on one address holds no more than four entries.
MAX_UNPROVEN_PER_SOURCE = 4
# In all: 64 distinct source addresses at their limit.
MAX_UNPROVEN = 256
# An entry holds its Hello: well under 1 KiB for a replica with a short epoch history, up to some 200 KiB with the
# longest one accepted (master.MAX_EPOCH_ENTRIES_IN_HELLO). The Hellos waiting together hold at most this much.
MAX_UNPROVEN_BYTES = 16 << 20
# A real replica joins within its own call timeout (slave.CALL_TIMEOUT_S, 3 s) or gives up and opens a new one.
UNPROVEN_TIMEOUT_S = 3.0
IPV6_SOURCE_PREFIX = 64


@dataclass(frozen=True)
class Pending:
    hello: hpb.Hello
    server_nonce: bytes
    source: str
    opened_at: float
    size: int  # the Hello's serialized size


def source_of(peer: str) -> str:
    """The source a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``, ``unix:...``) counts against."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or rest
    if kind == "ipv6":
        host = rest.rpartition(":")[0].strip("[]") if rest.startswith("[") else rest
        try:
            address = ipaddress.IPv6Address(host.split("%")[0])
        except ValueError:
            return peer
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, IPV6_SOURCE_PREFIX), strict=False))
    return kind  # a unix socket: every peer is a local process


class Unproven:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: dict[str, Pending] = {}
        self._per_source: Counter[str] = Counter()
        self._bytes = 0

    def add(self, hello: hpb.Hello, source: str) -> tuple[str, bytes]:
        """A new handshake's id and the master's nonce; SystemBusyError when the source or the table is full."""
        with self._lock:
            self._expire(self._clock())
            if self._per_source[source] >= MAX_UNPROVEN_PER_SOURCE:
                raise SystemBusyError(
                    f"{MAX_UNPROVEN_PER_SOURCE} replication handshakes from {source} are waiting for their proof; "
                    f"join one of them or try again in {UNPROVEN_TIMEOUT_S:g} s"
                )
            size = hello.ByteSize()
            if len(self._pending) >= MAX_UNPROVEN or self._bytes + size > MAX_UNPROVEN_BYTES:
                raise SystemBusyError(f"{MAX_UNPROVEN} replication handshakes are waiting for their proof; try again "
                                      f"in {UNPROVEN_TIMEOUT_S:g} s")
            hid = secrets.token_hex(16)
            nonce = auth.nonce()
            self._pending[hid] = Pending(hello, nonce, source, self._clock(), size)
            self._per_source[source] += 1
            self._bytes += size
            return hid, nonce

    def take(self, hid: str) -> Pending | None:
        """The handshake, removed (None: unknown, already taken or expired)."""
        with self._lock:
            self._expire(self._clock())
            found = self._pending.pop(hid, None)
            if found is not None:
                self._forget(found)
            return found

    def sweep(self) -> None:
        with self._lock:
            self._expire(self._clock())

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    def _expire(self, now: float) -> None:
        for hid, p in list(self._pending.items()):  # insertion order is age order: stop at the first young one
            if now - p.opened_at <= UNPROVEN_TIMEOUT_S:
                break
            del self._pending[hid]
            self._forget(p)

    def _forget(self, p: Pending) -> None:
        self._bytes -= p.size
        source = p.source
        self._per_source[source] -= 1
        if self._per_source[source] <= 0:
            del self._per_source[source]
