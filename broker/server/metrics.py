"""Prometheus text exposition (format 0.0.4) on ``--metrics-port``, served by an ``http.server`` thread.

Counters and histograms are updated by the request handlers; gauges (per-queue max offset, group lag, disk use)
are computed at scrape time by collector callbacks, so nothing is stale and nothing is kept twice.

Every series of a broker carries its ``cluster`` and ``broker`` (broker name) labels first, so one Prometheus
scraping every broker of a cluster can sum a figure over a cluster or tell the brokers apart without relabelling
(RocketMQ's exporter labels its series with cluster and brokerName the same way).

With the broker's TLS settings the port serves HTTPS with the broker's certificate (broker/server/server_tls.py): the
metrics name every topic and group, which is worth keeping from whoever listens on the network. With auth on, a
scrape needs a user's credentials by HTTP Basic and Get on the Cluster (broker/auth/http_basic.py).

Each connection is served on a thread of its own, so connections are bounded: at most ``MAX_CONNECTIONS`` at once
and ``MAX_CONNECTIONS_PER_ADDRESS`` from one address (one peer that opens connections and sends nothing cannot
keep the scrapers out); one past a bound is closed when accepted. A connection waits at most ``READ_TIMEOUT_S`` for
each read and lives at most ``CONNECTION_DEADLINE_S`` in all (a peer sending a byte now and then is cut off too).
"""

from __future__ import annotations

import bisect
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.server.server_tls import ServerTls

log = logging.getLogger(__name__)

Labels = tuple[tuple[str, str], ...]
Sample = tuple[str, Labels, float]  # metric name (with suffix), labels, value
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Prometheus scrapes a target once at a time; a few scrapers (an HA pair, a person with curl) fit many times over.
MAX_CONNECTIONS = 32
MAX_CONNECTIONS_PER_ADDRESS = 4
# A scrape's request arrives at once; Prometheus gives a whole scrape 10 s by default.
READ_TIMEOUT_S = 10.0
CONNECTION_DEADLINE_S = 30.0


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt_labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


def _fmt_value(v: float) -> str:
    if v == float("inf"):
        return "+Inf"
    return repr(float(v)) if isinstance(v, float) and not v.is_integer() else str(int(v))


class Counter:
    def __init__(self, name: str, help_text: str, const: Labels = ()) -> None:
        self.name, self.help, self.const = name, help_text, const
        self._lock = threading.Lock()
        self._values: dict[Labels, float] = {}

    def inc(self, amount: float = 1, labels: Labels = ()) -> None:
        with self._lock:
            self._values[labels] = self._values.get(labels, 0) + amount

    def value(self, labels: Labels = ()) -> float:
        return self._values.get(labels, 0)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        lines += [f"{self.name}{_fmt_labels(self.const + lab)} {_fmt_value(v)}" for lab, v in items]
        return lines


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: Sequence[float], const: Labels = ()) -> None:
        self.name, self.help, self.const = name, help_text, const
        self.buckets = sorted(buckets)
        self._lock = threading.Lock()
        self._counts = [0] * (len(self.buckets) + 1)  # last slot: above every bucket
        self._sum = 0.0
        self._count = 0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        with self._lock:
            self._counts[i] += 1
            self._sum += value
            self._count += 1

    @property
    def count(self) -> int:
        return self._count

    def render(self) -> list[str]:
        with self._lock:
            counts, total, n = list(self._counts), self._sum, self._count
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, c in zip([*self.buckets, float("inf")], counts, strict=True):
            running += c
            lines.append(f"{self.name}_bucket{_fmt_labels((*self.const, ('le', _fmt_value(bound))))} {running}")
        const = _fmt_labels(self.const)
        lines += [f"{self.name}_sum{const} {_fmt_value(total)}", f"{self.name}_count{const} {n}"]
        return lines


class GaugeCollector:
    """A gauge family whose samples come from a callback at scrape time."""

    def __init__(self, name: str, help_text: str, collect: Callable[[], Iterable[tuple[Labels, float]]],
                 const: Labels = ()) -> None:
        self.name, self.help, self.collect, self.const = name, help_text, collect, const

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} gauge"]
        lines += [f"{self.name}{_fmt_labels(self.const + lab)} {_fmt_value(v)}" for lab, v in self.collect()]
        return lines


LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
WAIT_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 15, 30, 60)


class BrokerMetrics:
    """Every metric the broker exposes. Handlers call the counters; gauges are registered by the controller.
    ``const_labels`` (the controller's: cluster and broker name) come first on every series."""

    def __init__(self, const_labels: Labels = ()) -> None:
        c = self.const_labels = const_labels
        self.put_messages = Counter("sluice_put_messages_total", "Messages stored by sends", c)
        self.put_bytes = Counter("sluice_put_bytes_total", "Bytes of commit-log entries stored by sends", c)
        self.get_messages = Counter("sluice_get_messages_total", "Messages returned by pulls", c)
        self.get_bytes = Counter("sluice_get_bytes_total", "Bytes of commit-log entries returned by pulls", c)
        self.errors = Counter("sluice_request_errors_total", "Requests answered with an error, by response code", c)
        self.auth_refusals = Counter(
            "sluice_auth_refusals_total", "Calls refused by authentication or authorization, by reason", c
        )
        self.put_latency = Histogram(
            "sluice_put_latency_seconds", "Time to store a send (includes the disk flush under SYNC_FLUSH)",
            LATENCY_BUCKETS_S, c,
        )
        self.flush_latency = Histogram(
            "sluice_flush_latency_seconds", "Time a SYNC_FLUSH send waited for its group commit", LATENCY_BUCKETS_S, c
        )
        self.long_poll_wait = Histogram(
            "sluice_long_poll_wait_seconds", "Time held pulls waited before answering", WAIT_BUCKETS_S, c
        )
        self._gauges: list[GaugeCollector] = []

    def add_gauge(self, name: str, help_text: str, collect: Callable[[], Iterable[tuple[Labels, float]]]) -> None:
        self._gauges.append(GaugeCollector(name, help_text, collect, self.const_labels))

    def render(self) -> str:
        lines: list[str] = []
        families: list[Counter | Histogram | GaugeCollector] = [
            self.put_messages, self.put_bytes, self.get_messages, self.get_bytes, self.errors, self.auth_refusals,
            self.put_latency, self.flush_latency, self.long_poll_wait, *self._gauges,
        ]
        for family in families:
            try:
                lines += family.render()
            except Exception:  # a failing collector must not take the whole scrape down
                log.exception("metric %s failed to collect", family.name)
        return "\n".join(lines) + "\n"


class MetricsServer:
    """``GET /metrics`` (any path, in fact) on a daemon thread."""

    def __init__(self, metrics: BrokerMetrics, host: str, port: int, tls: ServerTls | None = None,
                 access: Callable[[str | None, str], int] | None = None, *, max_connections: int = MAX_CONNECTIONS,
                 max_per_address: int = MAX_CONNECTIONS_PER_ADDRESS, read_timeout_s: float = READ_TIMEOUT_S,
                 deadline_s: float = CONNECTION_DEADLINE_S) -> None:
        """``access``: (Authorization header, peer address) -> HTTP status, when scrapes need credentials. The
        bounds (module docstring) are keywords so that a test can shorten them."""
        render = metrics.render

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status = access(self.headers.get("Authorization"), self.client_address[0]) if access else 200
                if status != 200:
                    metrics.auth_refusals.inc(labels=(("reason", "unauthenticated" if status == 401 else "denied"),))
                    self.send_response(status)
                    if status == 401:
                        self.send_header("WWW-Authenticate", 'Basic realm="sluice metrics"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = render().encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("metrics: " + format, *args)

        Handler.timeout = read_timeout_s  # each read of the request (StreamRequestHandler.setup)
        bounds = _Bounds(max_connections, max_per_address, deadline_s)
        self._server = _bounded(ThreadingHTTPServer, bounds)((host, port), Handler) if tls is None else \
            _https_server(host, port, Handler, tls, bounds)
        self.scheme = "http" if tls is None else "https"
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Bounds:
    """The connections being served: their count per address and their deadlines (module docstring)."""

    def __init__(self, max_connections: int, max_per_address: int, deadline_s: float) -> None:
        self.max_connections, self.max_per_address, self.deadline_s = max_connections, max_per_address, deadline_s
        self._lock = threading.Lock()
        self._open: dict[socket.socket, tuple[str, float]] = {}  # connection -> (address, deadline)
        self._per_address: dict[str, int] = {}

    def admit(self, sock: socket.socket, address: str) -> bool:
        with self._lock:
            if len(self._open) >= self.max_connections or self._per_address.get(address, 0) >= self.max_per_address:
                return False
            self._open[sock] = (address, time.monotonic() + self.deadline_s)
            self._per_address[address] = self._per_address.get(address, 0) + 1
            return True

    def done(self, sock: socket.socket) -> None:
        with self._lock:
            found = self._open.pop(sock, None)
            if found is None:
                return
            left = self._per_address.get(found[0], 1) - 1
            if left > 0:
                self._per_address[found[0]] = left
            else:
                self._per_address.pop(found[0], None)

    def cut_overdue(self) -> None:
        """Shut down connections past their deadline: the thread reading one gets end-of-file and finishes."""
        now = time.monotonic()
        with self._lock:
            overdue = [sock for sock, (_, deadline) in self._open.items() if deadline <= now]
        for sock in overdue:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # closed meanwhile
                pass


def _bounded(base: type[ThreadingHTTPServer], bounds: _Bounds) -> type[ThreadingHTTPServer]:
    """``base`` serving at most the connections ``bounds`` admit."""

    class Bounded(base):  # type: ignore[valid-type,misc]
        # connections waiting to be accepted (socketserver's 5 would make a burst's sixth wait for a SYN resend, 1 s)
        request_queue_size = 128

        def process_request(self, request: socket.socket, client_address: tuple[str, int]) -> None:
            if not bounds.admit(request, client_address[0]):
                log.debug("metrics: connection from %s refused: too many connections", client_address[0])
                self.shutdown_request(request)
                return
            try:
                super().process_request(request, client_address)
            except Exception:  # no thread started: the connection is not served, nor counted
                bounds.done(request)
                raise

        def process_request_thread(self, request: socket.socket, client_address: tuple[str, int]) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                bounds.done(request)

        def service_actions(self) -> None:  # serve_forever's loop, every poll interval (0.5 s)
            super().service_actions()
            bounds.cut_overdue()

        def handle_error(self, request: object, client_address: object) -> None:
            # a peer gone mid-answer or cut at its deadline, a scraper without TLS or with a certificate this server
            # refuses: its problem, not the broker's (no traceback on stderr)
            log.debug("metrics: connection from %s failed", client_address, exc_info=True)

    return Bounded


def _https_server(host: str, port: int, handler: type[BaseHTTPRequestHandler], tls: ServerTls,
                  bounds: _Bounds) -> ThreadingHTTPServer:
    from broker.server.server_tls import HttpsWrapper

    wrapper = HttpsWrapper(tls)

    class HttpsServer(_bounded(ThreadingHTTPServer, bounds)):  # type: ignore[misc]
        def get_request(self) -> tuple[socket.socket, object]:
            sock, address = super().get_request()
            return wrapper.wrap(sock), address

    return HttpsServer((host, port), handler)
