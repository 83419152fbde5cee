"""The metrics port against a peer that opens connections and sends nothing (or a byte now and then): its
connections past the per-address bound are closed at once, the ones it keeps are cut after the read timeout and
the connection deadline, and scrapes from elsewhere are answered meanwhile. Against a broker process with auth,
and against the metrics server itself with bounds short enough to wait for."""

from __future__ import annotations

import base64
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from broker.server.metrics import MAX_CONNECTIONS_PER_ADDRESS, BrokerMetrics, MetricsServer
from broker.server.process import BrokerProcess

ROOT = ("root", "root-secret-value")
ATTACKER_ADDRESS = "127.0.0.2"  # another loopback address: the scraper's (127.0.0.1) bound is its own


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("metrics-bounds")
    config = root / "broker.json"
    config.write_text(json.dumps({"auth_enabled": True, "allow_plaintext_auth": True, "auth_root_access_key": ROOT[0],
                                  "auth_root_secret_key": ROOT[1], "metrics_host": "127.0.0.1",
                                  "store": {"mapped_file_size_commit_log": 16 << 20,
                                            "mapped_file_size_consume_queue": 4000 * 20}}))
    config.chmod(0o600)  # it holds the root secret: the broker refuses a config others can read
    proc = BrokerProcess(root / "store", config=config, metrics_port=0).start()
    yield proc
    assert proc.stop() == 0, "\n".join(proc.output)


def scrape(port: int, credentials: tuple[str, str] | None = ROOT) -> tuple[int, float]:
    """The HTTP status of a scrape and how long it took."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if credentials is not None:
        token = base64.b64encode(":".join(credentials).encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert b"sluice_" in answer.read()
            return int(answer.status), time.monotonic() - started
    except urllib.error.HTTPError as e:
        return int(e.code), time.monotonic() - started


def idle_connections(port: int, count: int, source: str = ATTACKER_ADDRESS) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
        s.settimeout(3)
        socks.append(s)
    return socks


def closed_by_server(s: socket.socket, within_s: float) -> bool:
    """True when the server closed ``s`` (end of file or reset) within ``within_s``."""
    s.settimeout(within_s)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_idle_connections_past_the_bound_are_closed_and_scrapes_still_answered(broker: BrokerProcess) -> None:
    assert broker.metrics_port is not None
    port = broker.metrics_port
    held = idle_connections(port, MAX_CONNECTIONS_PER_ADDRESS + 6)
    try:
        time.sleep(0.5)
        closed = [s for s in held if closed_by_server(s, 0.5)]
        assert len(closed) == 6  # the ones past its bound, at once: no thread is started for them
        for _ in range(3):
            status, took = scrape(port)
            assert status == 200 and took < 5  # not after the held ones' read timeout (10 s)
        assert scrape(port, None)[0] == 401  # and authentication still applies
    finally:
        for s in held:
            s.close()


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    metrics = BrokerMetrics()
    s = MetricsServer(metrics, "127.0.0.1", 0, max_connections=8, max_per_address=3, read_timeout_s=1.0,
                      deadline_s=3.0)
    s.start()
    yield s
    s.stop()


def test_an_idle_connection_is_closed_after_the_read_timeout(server: MetricsServer) -> None:
    (idle,) = idle_connections(server.port, 1)
    try:
        started = time.monotonic()
        assert closed_by_server(idle, 8)
        assert 0.8 < time.monotonic() - started < 8  # read timeout 1 s; the bound leaves room for a busy machine
    finally:
        idle.close()


def test_a_trickling_connection_is_cut_at_its_deadline(server: MetricsServer) -> None:
    (slow,) = idle_connections(server.port, 1)
    try:
        started = time.monotonic()
        slow.sendall(b"GET /metrics HTTP/1.1\r\n")
        cut = False
        while time.monotonic() - started < 15 and not cut:
            time.sleep(0.5)  # within the read timeout each time
            try:
                slow.sendall(b"X-Slow: 1\r\n")
            except (BrokenPipeError, ConnectionResetError):
                cut = True
                break
            cut = closed_by_server(slow, 0.01)
        assert cut and 2.5 < time.monotonic() - started < 12  # deadline 3 s, checked every 0.5 s
    finally:
        slow.close()


def test_the_total_bound_holds_across_addresses(server: MetricsServer) -> None:
    held = [s for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4") for s in idle_connections(server.port, 3, source)]
    try:
        time.sleep(0.3)
        closed = [s for s in held if closed_by_server(s, 0.02)]  # all looked at within the read timeout
        assert len(closed) == 1  # 9 connections, 8 served at once
        for s in held:
            s.close()
        time.sleep(0.3)  # their threads see the end of file and finish
        assert scrape(server.port, None)[0] == 200  # this server has no access check: it serves anyone
    finally:
        for s in held:
            s.close()
