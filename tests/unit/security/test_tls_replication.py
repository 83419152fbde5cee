"""Replication over mutual TLS: a SYNC_MASTER and its slave, both with the broker TLS settings; the slave fetches
over TLS presenting the broker's certificate, and a write is acknowledged only once it holds it."""

from __future__ import annotations

from pathlib import Path

from broker.client import Message, Producer
from broker.client.tls import diagnose
from tests.support.certs import Pki, tls_settings
from tests.support.replicas import brokers, caught_up, in_sync_pair


def test_replication_over_mutual_tls(tmp_path: Path, pki: Pki) -> None:
    tls = tls_settings(pki, tls_ca=str(pki.ca), tls_client_auth="require")
    client = {"tls_ca": str(pki.ca), "tls_cert": str(pki.client_cert), "tls_key": str(pki.client_key)}
    with brokers() as bs:
        m, s = in_sync_pair(bs, tmp_path, master={**tls, "min_insync_replicas": 2}, slave=tls)
        with Producer(m.address, timeout_s=10, **client) as producer:
            for i in range(20):
                producer.send(Message("TlsReplicated", f"m{i}".encode()))
        assert s.store is not None and caught_up(m, s)  # SYNC_MASTER: acknowledged once the slave held it
        assert s.replication is not None and s.replication.slave_fetcher is not None
        assert s.replication.slave_fetcher.connected_to.endswith(str(m.replication.ha_port))
        # the replication endpoint itself speaks only TLS
        assert "serves TLS" in (diagnose(f"127.0.0.1:{m.replication.ha_port}", None) or "")
