"""A cluster all over mutual TLS, as processes: a name server and two brokers started with the --tls-* flags; the
brokers register with the name server over TLS with their own certificate, clients find them through it."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.client import Admin, Message, Producer, PullConsumer, PullStatus
from broker.client.namesrv_client import NameServerClient
from broker.client.tls import TlsSettings
from broker.errors import TlsError
from tests.support.certs import Pki
from tests.support.cluster import make_cluster, route_brokers
from tests.support.waiting import wait_until

TOPIC = "TlsClusterTopic"


def tls_flags(pki: Pki) -> list[str]:
    return ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--tls-ca", str(pki.ca),
            "--tls-client-auth", "require"]


def test_a_cluster_over_mutual_tls(tmp_path: Path, pki: Pki) -> None:
    client = {"tls_ca": str(pki.ca), "tls_cert": str(pki.client_cert), "tls_key": str(pki.client_key)}
    with make_cluster(tmp_path, brokers=2, namesrv_args=tls_flags(pki), extra_broker_args=tls_flags(pki)) as cluster:
        for name in cluster.names:
            with Admin(cluster.endpoint(name), **client) as admin:
                admin.create_topic(TOPIC, 2)
        ns = NameServerClient(cluster.namesrv.split(","), tls=TlsSettings(**{k[4:] + "_file": v
                                                                            for k, v in client.items()}))
        try:  # registration over TLS is what puts both brokers in the route
            wait_until(lambda: route_brokers(ns, TOPIC) == set(cluster.names), "both brokers in the route")
        finally:
            ns.close()
        with Producer(namesrv=cluster.namesrv, **client) as producer:
            sent = [producer.send(Message(TOPIC, f"m{i}".encode())) for i in range(20)]
        assert {r.broker_name for r in sent} == set(cluster.names)
        got: list[bytes] = []
        with PullConsumer(namesrv=f"https://{cluster.namesrv}", group="tls-cluster", **client) as consumer:
            for mq in consumer.fetch_queues(TOPIC):
                result = consumer.pull(mq, 0, 32)
                if result.status is PullStatus.FOUND:
                    got += [m.body for m in result.messages]
        assert sorted(got) == sorted(f"m{i}".encode() for i in range(20))
        with Admin(namesrv=cluster.namesrv) as plain, pytest.raises(TlsError, match="serves TLS"):
            plain.cluster_info()
