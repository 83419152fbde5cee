"""The TLS options of the source and the sink: ``tls.caFile``, ``tls.certFile`` and ``tls.keyFile``, PEM files on
every machine of the Spark cluster (the driver and each executor open their own connections).

A given ``tls.caFile`` (or an ``https://`` endpoint or name server) means TLS; ``tls.certFile`` with
``tls.keyFile`` adds the client certificate of mutual TLS (broker/client/tls.py). The files are checked on the
driver when the query starts, so a wrong path fails there and not in a task.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker.client.tls import TlsArgs, TlsSettings, read_pem
from broker.errors import InvalidArgumentError
from connector.connector_errors import SourceOptionError

TLS_OPTIONS = ("tls.caFile", "tls.certFile", "tls.keyFile")


@dataclass(frozen=True, slots=True)
class TlsFiles:
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    def settings(self) -> TlsSettings | None:
        return TlsSettings.of(self.ca_file, self.cert_file, self.key_file)

    def client_args(self) -> TlsArgs:
        return TlsArgs(tls_ca=self.ca_file or None, tls_cert=self.cert_file or None, tls_key=self.key_file or None)


PLAIN = TlsFiles()  # no TLS files (plain text, unless an endpoint says https://)


def parse_tls_options(opts: Mapping[str, str]) -> TlsFiles:
    """From options keyed in lower case; SourceOptionError naming the option of a missing or unreadable file."""
    values = {name: opts.get(name.lower(), "").strip() for name in TLS_OPTIONS}
    for name, path in values.items():
        if path:
            try:
                read_pem(path, f"option '{name}'")
            except InvalidArgumentError as e:
                raise SourceOptionError(e.message) from None
    if bool(values["tls.certFile"]) != bool(values["tls.keyFile"]):
        raise SourceOptionError("options 'tls.certFile' and 'tls.keyFile' go together: a certificate needs its key")
    return TlsFiles(values["tls.caFile"], values["tls.certFile"], values["tls.keyFile"])
