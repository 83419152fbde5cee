"""Test certificates, made at test time with the ``openssl`` command (no key or certificate is committed).

``make_pki(dir)`` writes a CA, a server certificate for 127.0.0.1 and localhost signed by it, a client certificate
signed by it, a second CA nobody trusts with a server certificate of its own, and a server certificate from the
trusted CA for another host name only. The ``pki`` fixture makes them once per run for the suites that import it
into their conftest.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

DAYS = 2  # a test run never lasts longer; short-lived keys are the point of rotation


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_ca: Path
    rogue_server_cert: Path  # signed by rogue_ca
    rogue_server_key: Path
    other_host_cert: Path  # signed by ca, for wrong.example only
    other_host_key: Path


def _openssl(*args: str | Path) -> None:
    exe = shutil.which("openssl")
    assert exe is not None, "the TLS tests make their certificates with the openssl command; install openssl"
    subprocess.run([exe, *map(str, args)], check=True, capture_output=True)


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}-key.pem"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
             "-out", cert, "-days", str(DAYS), "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return cert, key


def make_leaf(directory: Path, name: str, ca: tuple[Path, Path], san: str) -> tuple[Path, Path]:
    """A certificate for ``san`` (e.g. ``IP:127.0.0.1,DNS:localhost``), good for TLS servers and clients both."""
    cert, key, csr, ext = (directory / f"{name}.pem", directory / f"{name}-key.pem", directory / f"{name}.csr",
                           directory / f"{name}.ext")
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
             "-out", csr, "-subj", f"/CN={name}")
    ext.write_text(f"subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n")
    _openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial", "-out", cert,
             "-days", str(DAYS), "-extfile", ext)
    return cert, key


LOCAL_SAN = "IP:127.0.0.1,DNS:localhost"


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca(directory, "ca")
    rogue = make_ca(directory, "rogue-ca")
    server = make_leaf(directory, "server", ca, LOCAL_SAN)
    client = make_leaf(directory, "client", ca, "DNS:client.example")
    rogue_server = make_leaf(directory, "rogue-server", rogue, LOCAL_SAN)
    other = make_leaf(directory, "other-host", ca, "DNS:wrong.example")
    return Pki(ca[0], server[0], server[1], client[0], client[1], rogue[0], rogue_server[0], rogue_server[1],
               other[0], other[1])


def tls_settings(pki: Pki, **more: str) -> dict[str, str]:
    """Broker settings that serve TLS with the test server certificate."""
    return {"tls_cert": str(pki.server_cert), "tls_key": str(pki.server_key), **more}


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))
