"""TLS on the server side: one ``ServerTls`` for every gRPC port a process opens (a broker's client port and its
replication endpoint, a name server's port), with certificates re-read when they change on disk.

* **Serving.** ``add_port`` binds a port in plain text (no settings) or TLS. TLS uses gRPC's dynamic server
  credentials: gRPC asks ``CertificateFiles.fetch`` at each new handshake whether the certificate changed; it
  answers from the files' modification times and sizes (a ``stat`` each, no read) and reads them again only when
  one changed. Connections already open keep the key they were made with; new ones get the new certificate, with
  no restart. A pair that does not load (a key that does not match the certificate yet, while the files are being
  replaced one by one) is refused by gRPC, which keeps the old pair; a file that cannot be read is logged once and
  the old pair kept too. The next change of either file is tried again.
* **Client certificates** (``client_auth``): ``none`` asks for none; ``require`` refuses a client without a
  certificate from ``ca_file`` (mutual TLS); ``request`` asks for one and accepts clients without it, but gRPC's
  Python server cannot check a certificate it does not require (its dynamic credentials either require and verify
  one or never ask), so ``request`` verifies none and serves like ``none``: it is there for the setting's shape
  (RocketMQ's tls.server.need.client.auth: none, optional, require) and logs so at start. Who a client is, for
  authorization, will come from the verified certificate in a server interceptor (``context.auth_context()``).
* **A broker's own clients** (registration with the name servers, the coordinator client, a replica fetching
  from its master) use ``client_settings()``: TLS verified against ``ca_file`` (the system's roots when it is
  empty), presenting the process's own certificate, so the same files serve both directions under mutual TLS.
* **HTTPS** (the metrics port): ``HttpsWrapper`` serves the same certificate through Python's ``ssl``, checking
  the files' stamps at each accepted connection the same way; with ``require`` a scraper needs a client
  certificate too.
* **Plain text on the network.** ``warn_if_exposed`` logs a warning at start for a plain-text port on a
  non-loopback address: anyone on the network can read and send messages.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc

from broker.client.tls import TlsSettings, read_pem
from broker.errors import InvalidArgumentError

log = logging.getLogger(__name__)

CLIENT_AUTH_MODES = ("none", "request", "require")


@dataclass(frozen=True)
class ServerTls:
    cert_file: str
    key_file: str
    ca_file: str = ""
    client_auth: str = "none"

    def __post_init__(self) -> None:
        if self.client_auth not in CLIENT_AUTH_MODES:
            raise InvalidArgumentError(
                f"tls_client_auth {self.client_auth!r} is not one of {', '.join(CLIENT_AUTH_MODES)}"
            )
        if not self.cert_file or not self.key_file:
            raise InvalidArgumentError("TLS needs a certificate and its key: give tls_cert and tls_key together")
        if self.client_auth != "none" and not self.ca_file:
            raise InvalidArgumentError(
                f"tls_client_auth {self.client_auth} needs tls_ca: the CA whose client certificates are accepted"
            )
        CertificateFiles(self).load()  # a missing or unreadable file fails the start, with its name

    @staticmethod
    def of(cert: str = "", key: str = "", ca: str = "", client_auth: str = "none") -> ServerTls | None:
        """The settings, or None for plain text; InvalidArgumentError for a half-given set."""
        if not (cert or key):
            if ca or client_auth != "none":
                raise InvalidArgumentError("tls_ca and tls_client_auth take effect with TLS: give tls_cert and tls_key")
            return None
        return ServerTls(cert, key, ca, client_auth)

    def client_settings(self) -> TlsSettings:
        return TlsSettings(self.ca_file, self.cert_file, self.key_file)


class CertificateFiles:
    """The certificate, key and CA files of one ServerTls, and what they held when last read."""

    def __init__(self, tls: ServerTls) -> None:
        self.tls = tls
        self._paths = [Path(p).expanduser() for p in (tls.cert_file, tls.key_file, tls.ca_file) if p]
        self._seen: list[tuple[int, int]] = []
        self._lock = threading.Lock()  # gRPC may ask from several handshakes at once
        self._failed = False
        self.reloads = 0

    def changed(self) -> bool:
        return self._stamp() != self._seen

    def _stamp(self) -> list[tuple[int, int]]:
        return [(s.st_mtime_ns, s.st_size) for s in (os.stat(p) for p in self._paths)]

    def load(self) -> grpc.ServerCertificateConfiguration:
        t = self.tls
        try:
            stamp = self._stamp()  # before reading: a change while reading is seen at the next handshake
        except OSError:
            stamp = []  # read_pem below names the file that is missing
        cert, key = read_pem(t.cert_file, "TLS certificate file"), read_pem(t.key_file, "TLS key file")
        ca = read_pem(t.ca_file, "TLS CA file") if t.ca_file else None
        self._seen = stamp
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's fetcher: a new configuration when a file changed since it was read, else None (keep the old)."""
        with self._lock:
            try:
                if self._stamp() == self._seen:
                    return None
                config = self.load()
            except (OSError, InvalidArgumentError) as e:
                if not self._failed:
                    log.error("TLS certificate files changed but cannot be read (%s); the previous ones stay in use", e)
                self._failed = True
                return None
            self._failed = False
            self.reloads += 1
            log.info("TLS certificate files %s changed; new connections use them", ", ".join(map(str, self._paths)))
            return config


def server_credentials(tls: ServerTls) -> tuple[grpc.ServerCredentials, CertificateFiles]:
    files = CertificateFiles(tls)
    initial = files.load()
    credentials = grpc.dynamic_ssl_server_credentials(
        initial, files.fetch, require_client_authentication=tls.client_auth == "require"
    )
    return credentials, files


def add_port(server: grpc.Server, target: str, tls: ServerTls | None, what: str) -> int:
    """Bind ``target`` on ``server``, TLS when ``tls`` is given; the bound port. RuntimeError when it cannot."""
    if tls is None:
        warn_if_exposed(target, what)
        return server.add_insecure_port(target)
    credentials, _files = server_credentials(tls)
    if tls.client_auth == "request":
        log.warning("%s: tls_client_auth request verifies no client certificate (gRPC's server cannot ask for one "
                    "without requiring it); use require for mutual TLS", what)
    return server.add_secure_port(target, credentials)


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_if_exposed(target: str, what: str) -> None:
    host = target.rsplit(":", 1)[0]
    if not is_loopback(host):
        log.warning("%s listens on %s in plain text: anyone who reaches it can read and send messages; serve TLS "
                    "(--tls-cert, --tls-key; docs/security.md)", what, target)


class HttpsWrapper:
    """Wraps each accepted socket of an HTTP server in TLS, with the certificate files as they are now."""

    def __init__(self, tls: ServerTls) -> None:
        self.files = CertificateFiles(tls)
        self._lock = threading.Lock()
        self._context = self._new_context()

    def _new_context(self) -> ssl.SSLContext:
        t = self.files.tls
        self.files.load()  # checks the files (and records their stamps) before ssl reads them
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(t.cert_file, t.key_file)
        if t.client_auth == "require":
            ctx.load_verify_locations(t.ca_file)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def wrap(self, sock: socket.socket) -> ssl.SSLSocket:
        """The TLS socket; its handshake runs at its first read, on the thread serving it, not the accepting one."""
        with self._lock:
            try:
                if self.files.changed():
                    self._context = self._new_context()
                    log.info("metrics: TLS certificate files changed; new connections use them")
            except (OSError, ssl.SSLError, InvalidArgumentError) as e:
                log.error("metrics: TLS certificate files cannot be read (%s); the previous ones stay in use", e)
            context = self._context
        return context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
