"""Addresses, store paths and ports a new user gets wrong: each refused with one clear line, nothing left behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.address import parse_endpoint, parse_listen
from broker.client import Admin, Message, Producer, PullConsumer
from broker.config import BrokerConfig
from broker.errors import InvalidArgumentError, ServiceNotAvailableError
from broker.server.broker_controller import BrokerController
from broker.server.process import BrokerProcess

BrokerFactory = Callable[..., BrokerController]  # the broker_factory fixture (tests/unit/conftest.py)


def sluice(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def one_error_line(out: subprocess.CompletedProcess[str]) -> str:
    """The run failed with exit status 1 and printed exactly one line, an `error:` line; that line."""
    assert out.returncode == 1, (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    return lines[0]


def test_an_endpoint_without_a_port_is_refused_naming_the_port(broker: BrokerController, endpoint: str) -> None:
    """`--endpoint 127.0.0.1` went to port 443 (gRPC's default) and failed as 'unreachable' after a wait."""
    for args, env in ((("--endpoint", "127.0.0.1"), {}), ((), {"SLUICE_ENDPOINT": "127.0.0.1"})):
        line = one_error_line(sluice("topic", "list", *args, env=env))
        assert "endpoint '127.0.0.1' names no port; write 127.0.0.1:10911" in line, line
    with pytest.raises(InvalidArgumentError, match="names no port"):
        Admin("localhost")
    with pytest.raises(InvalidArgumentError, match="IPv6 address without brackets"):
        Producer("::1:10911")
    assert parse_endpoint("[::1]:10911") == ("::1", 10911)
    port = endpoint.rsplit(":", 1)[1]
    assert sluice("topic", "list", "--endpoint", f" 127.0.0.1:{port} ").returncode == 0


def test_a_broker_listens_on_an_ipv6_address_in_brackets(broker_factory: BrokerFactory, tmp_path: Path) -> None:
    """`--listen '[::1]:0'` bound a garbled address ('[::0.1.0.0]:443'). Where the machine has no IPv6 loopback,
    the broker must say so instead."""
    with socket.socket(socket.AF_INET6) as probe:
        try:
            probe.bind(("::1", 0))
            has_ipv6 = True
        except OSError:
            has_ipv6 = False
    if not has_ipv6:
        with pytest.raises(ServiceNotAvailableError, match=r"cannot listen on \[::1\]"):
            broker_factory(listen="[::1]:0")
        return
    broker = broker_factory(listen="[::1]:0")
    assert broker.address == f"[::1]:{broker.port}"
    endpoint = f"[::1]:{broker.port}"
    with Producer(endpoint) as p:
        sent = p.send(Message("Six", b"over IPv6"), queue_id=0)
    assert broker.store is not None and broker.store.wait_dispatched()
    with PullConsumer(endpoint, "six") as c:
        assert [m.body for m in c.pull("Six", 0, 0).messages] == [b"over IPv6"]
    assert sent.msg_id  # msgIds still carry an IPv4 store host (RocketMQ's 16-hex-character form)
    with BrokerProcess(tmp_path / "child", listen="[::1]:0") as child:  # the CLI's ready line, parsed back
        assert child.endpoint == f"[::1]:{child.port}"
        with Admin(child.endpoint) as admin:
            assert admin.list_topics() is not None


def test_listen_addresses_are_parsed_as_written() -> None:
    assert parse_listen("[::]:0") == ("::", 0)
    assert parse_listen("127.0.0.1") == ("127.0.0.1", 10911)  # the broker's default port, as RocketMQ's
    for bad, needle in (("::1:0", "without brackets"), ("[::1:0", "does not close"), ("[::1]x", "after the ']'"),
                        ("h:port", "non-numeric port"), ("h:70000", "outside 0..65535")):
        with pytest.raises(InvalidArgumentError, match=needle):
            BrokerConfig(listen=bad)


def test_a_store_path_naming_a_file_is_one_clear_error(tmp_path: Path) -> None:
    """It printed `error: [Errno 17] File exists: '...'`."""
    a_file = tmp_path / "plain-file"
    a_file.write_text("not a directory")
    line = one_error_line(sluice("broker", "--store", str(a_file), "--listen", "127.0.0.1:0"))
    assert f"store path {a_file} is a file, not a directory" in line, line


def test_a_port_in_use_is_one_line_and_leaves_no_store_directory(broker: BrokerController, tmp_path: Path) -> None:
    """gRPC's own log line (`E... add_port.cc:83] Failed to add port ...`) came first, and the store directory was
    made before the port was found taken."""
    store = tmp_path / "second"
    line = one_error_line(sluice("broker", "--store", str(store), "--listen", f"127.0.0.1:{broker.port}"))
    assert f"cannot listen on 127.0.0.1:{broker.port}: port {broker.port} is in use" in line, line
    assert not store.exists()
    # not an address of this machine (TEST-NET-1): refused the same way
    line = one_error_line(sluice("broker", "--store", str(store), "--listen", "192.0.2.1:10911"))
    assert "192.0.2.1 is not an address of this machine" in line, line
    assert not store.exists()
