"""The remoting port with the TLS settings the gRPC ports use (broker/server/tls.py): the same certificate and the
same client-certificate rule; a plain-text client gets nothing."""

from __future__ import annotations

import ssl

import pytest

from broker.errors import BrokerUnreachableError
from broker.remoting.client import RemotingClient
from broker.remoting.codes import WireCode
from broker.remoting.command import RemotingCommand
from broker.remoting.processor import Answer, RequestContext
from broker.remoting.server import RemotingServer
from broker.server.server_tls import ServerTls
from tests.support.certs import Pki, pki

__all__ = ["pki"]


class Echo:
    def process(self, request: RemotingCommand, context: RequestContext) -> Answer:
        return request.response(WireCode.SUCCESS, body=request.body)


def client_context(pki: Pki, *, with_certificate: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if with_certificate:
        ctx.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    return ctx


def test_tls_with_the_grpc_ports_settings(pki: Pki) -> None:
    tls = ServerTls(str(pki.server_cert), str(pki.server_key), str(pki.ca), "require")
    with RemotingServer({1: Echo()}, "127.0.0.1", 0, tls=tls) as server:
        with RemotingClient(server.address, ssl_context=client_context(pki, with_certificate=True)) as c:
            # the first call waits for the TLS handshake too: the default 3 s was once too short on a loaded machine
            assert c.invoke(RemotingCommand(1, body=b"over tls"), timeout_s=30).body == b"over tls"
        anonymous = client_context(pki, with_certificate=False)
        # mutual TLS: no certificate, no answer (the handshake or the first read fails, by TLS version)
        refused = (OSError, BrokerUnreachableError)
        with pytest.raises(refused), RemotingClient(server.address, ssl_context=anonymous) as c:
            c.invoke(RemotingCommand(1), timeout_s=2)
        with RemotingClient(server.address) as plain, pytest.raises(BrokerUnreachableError):
            plain.invoke(RemotingCommand(1), timeout_s=2)
