"""TLS on the client side: which settings, the gRPC channel they make, and why a connection failed.

A client uses TLS when it is given a CA file (``tls_ca=``) or when an endpoint is written ``https://host:port``
(then the system's trusted roots verify the server). ``tls_cert`` and ``tls_key`` add a client certificate for a
server that asks for one (mutual TLS). Every file is PEM and read when a channel is opened, so a client opened
after a certificate was replaced uses the new one. ``TlsSettings`` is the one value every layer passes on
(clients, the router, connections, the name-server client, a broker's own clients of other brokers).

Diagnosis: gRPC reports every failed handshake as UNAVAILABLE with a line of transport detail. When a channel
fails before the request was sent, ``diagnose`` opens one TLS connection of its own to the same address (Python's
``ssl``, bounded by ``PROBE_TIMEOUT_S``) and names the cause: plain text against TLS and the reverse, a certificate
no given CA vouches for, a certificate for another host name, a server that requires a client certificate.
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import grpc

from broker.address import parse_endpoint
from broker.errors import BrokerError, BrokerUnreachableError, InvalidArgumentError, TlsError

TLS_SCHEME = "https://"
CA_ENV, CERT_ENV, KEY_ENV = "SLUICE_TLS_CA", "SLUICE_TLS_CERT", "SLUICE_TLS_KEY"
# A CA bundle or a certificate chain is a few KiB (the system bundle some 200 KiB); a larger file is not PEM
# meant for this, and reading it whole into every channel would cost memory for nothing.
MAX_PEM_BYTES = 1 << 20
PROBE_TIMEOUT_S = 2.0  # the diagnosis connection: a broker that answers takes milliseconds
_HOSTNAME_MISMATCH = 62  # X509_V_ERR_HOSTNAME_MISMATCH
_IP_MISMATCH = 64  # X509_V_ERR_IP_ADDRESS_MISMATCH


def read_pem(path: str, what: str) -> bytes:
    """The bytes of a PEM file; InvalidArgumentError naming ``what`` when it is missing, too large or not PEM."""
    p = Path(path).expanduser()
    try:
        size = p.stat().st_size
        if size > MAX_PEM_BYTES:
            raise InvalidArgumentError(f"{what} {path} is {size} bytes; a PEM file of at most {MAX_PEM_BYTES} is read")
        data = p.read_bytes()
    except OSError as e:
        raise InvalidArgumentError(f"cannot read {what} {path}: {e.strerror or e}") from None
    if b"-----BEGIN " not in data:
        raise InvalidArgumentError(f"{what} {path} is not a PEM file (no -----BEGIN line)")
    return data


class TlsArgs(TypedDict):
    """The keyword arguments every client takes (``Producer(..., **args)``)."""

    tls_ca: str | None
    tls_cert: str | None
    tls_key: str | None


@dataclass(frozen=True)
class TlsSettings:
    """A client's TLS: ``ca_file`` ("" : the system's roots), and for mutual TLS ``cert_file`` with ``key_file``."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise InvalidArgumentError("a client certificate needs its key: give tls_cert and tls_key together")

    @staticmethod
    def of(ca: str | None = None, cert: str | None = None, key: str | None = None, *,
           https: bool = False) -> TlsSettings | None:
        """The settings a client's arguments ask for; None for plain text (no CA, no certificate, no https://)."""
        if not (ca or cert or key or https):
            return None
        return TlsSettings(ca or "", cert or "", key or "")

    @staticmethod
    def from_env(https: bool = False) -> TlsSettings | None:
        """From ``$SLUICE_TLS_CA``, ``$SLUICE_TLS_CERT`` and ``$SLUICE_TLS_KEY`` (the CLI's)."""
        return TlsSettings.of(os.environ.get(CA_ENV), os.environ.get(CERT_ENV), os.environ.get(KEY_ENV), https=https)

    def credentials(self) -> grpc.ChannelCredentials:
        root = read_pem(self.ca_file, "TLS CA file") if self.ca_file else None
        key = read_pem(self.key_file, "TLS key file") if self.key_file else None
        chain = read_pem(self.cert_file, "TLS certificate file") if self.cert_file else None
        return grpc.ssl_channel_credentials(root_certificates=root, private_key=key, certificate_chain=chain)

    def describe(self) -> str:
        trust = f"CA {self.ca_file}" if self.ca_file else "the system's trusted CAs"
        return f"TLS ({trust}{', client certificate ' + self.cert_file if self.cert_file else ''})"


def split_scheme(endpoints: str) -> tuple[str, bool]:
    """``"https://h:1,h2:2"`` -> ``("h:1,h2:2", True)``: the list without schemes, and whether one said https."""
    items = [e.strip() for e in endpoints.split(",")]
    https = any(i.lower().startswith(TLS_SCHEME) for i in items)
    plain = [i[len(TLS_SCHEME):] if i.lower().startswith(TLS_SCHEME) else i for i in items]
    return ",".join(plain), https


def resolve(endpoints: str | None, tls: TlsSettings | None) -> tuple[str | None, TlsSettings | None]:
    """The endpoint list without ``https://`` and the TLS settings it implies (https:// alone: system roots)."""
    if endpoints is None:
        return None, tls
    plain, https = split_scheme(endpoints)
    return plain, tls if tls is not None else TlsSettings.of(https=https)


def open_channel(target: str, options: Sequence[tuple[str, object]], tls: TlsSettings | None) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(target, options=options)
    return grpc.secure_channel(target, tls.credentials(), options=options)


def explain(error: BrokerError, target: str, tls: TlsSettings | None) -> BrokerError:
    """``error``, or a TlsError naming the cause when a connection that was never made failed at the TLS layer."""
    if isinstance(error, BrokerUnreachableError) and not error.request_sent and not isinstance(error, TlsError):
        cause = diagnose(target, tls)
        if cause is not None:
            return TlsError(cause)
    return error


def diagnose(target: str, tls: TlsSettings | None) -> str | None:
    """Why a channel to ``target`` fails at the TLS layer, in words; None when TLS is not the reason (nothing
    listens, or the server speaks what the client does and accepts it)."""
    host, port = parse_endpoint(target)
    probe = ssl.create_default_context()
    probe.check_hostname, probe.verify_mode = False, ssl.CERT_NONE
    probe.set_alpn_protocols(["h2"])
    try:
        serves_tls = _handshake(probe, host, port)
    except OSError:
        return None  # nothing there, or gone: not a TLS matter
    if tls is None:
        if serves_tls:
            return (f"{target} serves TLS but this client connects in plain text; give tls_ca= (the CLI: "
                    f"${CA_ENV}) or write the endpoint https://{target}")
        return None
    if not serves_tls:
        return f"{target} does not serve TLS (plain text); connect without tls_ca= and without https://"
    try:
        ctx = ssl.create_default_context(cafile=tls.ca_file or None)
        if tls.cert_file:
            ctx.load_cert_chain(tls.cert_file, tls.key_file)
        ctx.set_alpn_protocols(["h2"])
        accepted = _handshake(ctx, host, port, read=True)
    except ssl.SSLCertVerificationError as e:
        trust = f"the CA in {tls.ca_file}" if tls.ca_file else "the system's trusted CAs"
        if e.verify_code in (_HOSTNAME_MISMATCH, _IP_MISMATCH):
            return (f"the TLS certificate of {target} is not for host {host} ({e.verify_message}); connect by a "
                    "name the certificate lists, or give the server a certificate for this one")
        return f"the TLS certificate of {target} is not trusted: {e.verify_message} (checked against {trust})"
    except ssl.SSLError as e:
        return _refused(target, tls) if "CERTIFICATE" in str(e).upper() else f"TLS with {target} failed: {e}"
    except OSError:
        return None
    return None if accepted else _refused(target, tls)


def _refused(target: str, tls: TlsSettings) -> str:
    """The server ended a handshake the client was content with: it wants a (different) client certificate."""
    if not tls.cert_file:
        return f"{target} requires a client certificate (mutual TLS); give tls_cert= and tls_key="
    return f"{target} refused this client's certificate {tls.cert_file}: its CA does not trust it"


def _handshake(ctx: ssl.SSLContext, host: str, port: int, read: bool = False) -> bool:
    """True when the server completed a TLS handshake. ``read``: also wait for its first bytes, which is where a
    TLS 1.3 server's refusal of the client's certificate arrives."""
    with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S) as raw:
        try:
            tls = ctx.wrap_socket(raw, server_hostname=host)
        except ssl.SSLCertVerificationError:
            raise
        except ssl.SSLError:
            if ctx.verify_mode == ssl.CERT_NONE:
                return False  # it answered, but not with TLS
            raise
        except (ConnectionResetError, EOFError):
            return False  # it hung up on a TLS hello: not TLS (a server that never answers is not judged)
        with tls:
            if read:  # the HTTP/2 preface and an empty SETTINGS frame: a server that accepts us answers
                tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                try:
                    return tls.recv(1) != b""
                except TimeoutError:
                    return True
                except ConnectionResetError:
                    return False
        return True
