"""Network addresses as people write them: ``HOST:PORT``, with IPv6 hosts in brackets (``[::1]:10911``).

One parser for both sides, so that what the broker prints on start (``ready on [::1]:10911``) is what a client
accepts:

- a client endpoint (``--endpoint``, ``Producer(endpoint)``, ``$SLUICE_ENDPOINT``) must name its port: a missing
  one is refused, naming it, instead of gRPC's silent default of 443 (the Spark connector's ``endpoints`` option
  refuses it too);
- the broker's ``listen`` address may leave the port out (RocketMQ's default, 10911) or the host (all IPv4
  interfaces).

An IPv6 address without brackets is refused: in ``::1:10911`` the port cannot be told from the address.
``check_port_free`` probes a listen address before gRPC binds it, so that a port in use is one clear error (gRPC's
own bind failure prints a C-level log line first and says only "failed to bind").
"""

from __future__ import annotations

import errno
import random
import socket
import threading

from broker.errors import InvalidArgumentError, ServiceNotAvailableError

DEFAULT_PORT = 10911  # RocketMQ's broker listen port
WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}  # listen host -> where a local client connects
EXAMPLE = "e.g. 127.0.0.1:10911 or [::1]:10911"


def split_host_port(text: str, what: str) -> tuple[str, str | None]:
    """``host:port`` / ``[v6]:port`` / ``host`` / ``[v6]`` -> (host without brackets, port text or None)."""
    text = text.strip()
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise InvalidArgumentError(f"{what} {text!r} opens a '[' it does not close; write [IPV6]:PORT, {EXAMPLE}")
        host, rest = text[1:close], text[close + 1 :]
        if rest and not rest.startswith(":"):
            raise InvalidArgumentError(f"{what} {text!r} has {rest!r} after the ']'; write [IPV6]:PORT, {EXAMPLE}")
        if not host:
            raise InvalidArgumentError(f"{what} {text!r} has an empty host in its brackets; {EXAMPLE}")
        return host, rest[1:] if rest else None
    if text.count(":") > 1:
        raise InvalidArgumentError(
            f"{what} {text!r} looks like an IPv6 address without brackets; write it as [IPV6]:PORT, e.g. [::1]:10911"
        )
    host, sep, port = text.partition(":")
    return host, port if sep else None


def _port(text: str, address: str, what: str, minimum: int) -> int:
    if not text.isdecimal() or not text.isascii():
        raise InvalidArgumentError(f"{what} {address!r} has a non-numeric port {text!r}; write HOST:PORT, {EXAMPLE}")
    port = int(text)
    if not minimum <= port <= 65535:
        raise InvalidArgumentError(f"port {port} in {what} {address!r} is outside {minimum}..65535")
    return port


def parse_listen(text: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """A listen address: (host, port); no host means 0.0.0.0, no port means ``default_port`` (the broker's
    10911), port 0 any free."""
    host, port = split_host_port(text, "listen address")
    return host or "0.0.0.0", default_port if port is None else _port(port, text, "listen address", 0)


def parse_endpoint(text: str) -> tuple[str, int]:
    """One broker a client connects to: (host, port); both must be given, the port in 1..65535."""
    host, port = split_host_port(text, "endpoint")
    if not host:
        raise InvalidArgumentError(f"endpoint {text!r} names no host; write HOST:PORT, {EXAMPLE}")
    if port is None:
        raise InvalidArgumentError(
            f"endpoint {text!r} names no port; write {format_address(host, DEFAULT_PORT)} for a broker on the "
            f"default port {DEFAULT_PORT}"
        )
    return host, _port(port, text, "endpoint", 1)


def format_address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets (what gRPC and ``parse_endpoint`` read)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def local_endpoint(host: str, port: int) -> str:
    """Where a client on this machine reaches a broker listening on ``host:port`` (a wildcard: the loopback)."""
    return format_address(WILDCARD_HOSTS.get(host, host), port)


def check_port_free(host: str, port: int) -> None:
    """ServiceNotAvailableError naming the address when ``host:port`` cannot be bound because it is in use or not
    an address of this machine; other failures are left to the real bind. Port 0 (any free port) is not probed."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ServiceNotAvailableError(f"cannot listen on {format_address(host, port)}: {e.strerror}") from None
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC's listener: TIME_WAIT is no conflict
            try:
                probe.bind(sockaddr)
            except OSError as e:
                address = format_address(host, port)
                if e.errno == errno.EADDRINUSE:
                    raise ServiceNotAvailableError(
                        f"cannot listen on {address}: port {port} is in use (another broker, or another program); "
                        "stop it or choose another port with --listen"
                    ) from None
                if e.errno == errno.EADDRNOTAVAIL:
                    raise ServiceNotAvailableError(
                        f"cannot listen on {address}: {host} is not an address of this machine; use one of its "
                        "addresses, 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
                    ) from None
                return  # e.g. EACCES for a port below 1024: gRPC's bind reports it


# Ports a process binds again after a restart (a killed replica, a restarted broker in a test) are taken below the
# kernel's ephemeral range: a port from that range can be handed meanwhile to any other socket bound to port 0 or to
# the local end of any outgoing connection, and the restart then fails with "address in use".
FIXED_PORT_LOW, FIXED_PORT_HIGH = 20_000, 32_000
FIXED_PORT_TRIES = 200
# Drawn from a generator of their own: tests seed the module-level ``random`` (crash loops replay a seed), and a
# seeded draw would hand a later test the ports an earlier one drew, perhaps still held by its processes.
_FIXED_PORT_DRAWS = random.Random()
# Every port handed out by this process: a group of replicas draws all its ports before any of them binds, so a
# port only probed free could otherwise be handed to two of its listeners.
_HANDED_OUT: set[tuple[str, int]] = set()
_HANDED_OUT_LOCK = threading.Lock()


def free_fixed_port(host: str = "127.0.0.1") -> int:
    """A port of ``host`` free now, outside the ephemeral range, for a listener that must get it again after a
    restart; never one it handed out before in this process. ServiceNotAvailableError when FIXED_PORT_TRIES random
    ports were all taken."""
    for _ in range(FIXED_PORT_TRIES):
        port = _FIXED_PORT_DRAWS.randrange(FIXED_PORT_LOW, FIXED_PORT_HIGH)
        with _HANDED_OUT_LOCK:
            if (host, port) in _HANDED_OUT:
                continue
            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            _HANDED_OUT.add((host, port))
            return port
    raise ServiceNotAvailableError(
        f"no free port in {FIXED_PORT_LOW}..{FIXED_PORT_HIGH - 1} on {host} after {FIXED_PORT_TRIES} tries"
    )
