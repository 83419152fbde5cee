"""An authenticated cluster as processes, one system: a name server and two brokers started with the same root
user, all over TLS; the brokers register by signing as root, a user is created on every master through the
name servers, and a route-aware producer and consumer with that user's credentials use both brokers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.client import Admin, Message, Producer, PullConsumer, PullStatus
from broker.errors import AuthenticationError, NoPermissionError
from tests.support.certs import Pki
from tests.support.cluster import make_cluster
from tests.support.waiting import wait_until

TOPIC, GROUP = "AuthClusterTopic", "auth-cluster-group"
ROOT: dict[str, Any] = {"access_key": "root", "secret_key": "cluster-root-secret"}


def tls_flags(pki: Pki) -> list[str]:
    return ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--tls-ca", str(pki.ca)]


def test_an_authenticated_cluster_over_tls(tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_ROOT_ACCESS_KEY", ROOT["access_key"])  # the name server's and every broker's
    monkeypatch.setenv("SLUICE_ROOT_SECRET_KEY", ROOT["secret_key"])
    ca: dict[str, Any] = {"tls_ca": str(pki.ca)}
    with make_cluster(tmp_path, brokers=2, namesrv_args=tls_flags(pki),
                      extra_broker_args=[*tls_flags(pki), "--auth"]) as cluster:
        with Admin(namesrv=cluster.namesrv, **ca, **ROOT) as admin:
            wait_until(lambda: {b.broker_name for b in admin.cluster_info().brokers} == set(cluster.names),
                       "both brokers registered, signed as root")
            admin.create_topic(TOPIC, 2, cluster="DefaultCluster")
            admin.create_user("alice", "alice-cluster-secret")
            admin.grant_acl("alice", f"Topic:{TOPIC}", ["Pub", "Sub"])
            admin.grant_acl("alice", f"Group:{GROUP}", ["Sub"])
            admin.create_user("bob", "bob-cluster-secret")
            admin.grant_acl("bob", f"Topic:{TOPIC}", ["Pub"])
        alice = {**ca, "access_key": "alice", "secret_key": "alice-cluster-secret"}
        with Producer(namesrv=cluster.namesrv, **alice) as producer:
            sent = [producer.send(Message(TOPIC, f"m{i}".encode())) for i in range(20)]
        assert {r.broker_name for r in sent} == set(cluster.names)
        got: list[bytes] = []
        with PullConsumer(namesrv=cluster.namesrv, group=GROUP, **alice) as consumer:
            for mq in consumer.fetch_queues(TOPIC):
                result = consumer.pull(mq, 0, 32)
                if result.status is PullStatus.FOUND:
                    got += [m.body for m in result.messages]
        assert sorted(got) == sorted(f"m{i}".encode() for i in range(20))
        bob = {**ca, "access_key": "bob", "secret_key": "bob-cluster-secret"}
        with PullConsumer(namesrv=cluster.namesrv, group=GROUP, **bob) as consumer, pytest.raises(NoPermissionError):
            consumer.pull(consumer.fetch_queues(TOPIC)[0], 0, 32)
        with Producer(namesrv=cluster.namesrv, **ca) as anonymous, pytest.raises(AuthenticationError):
            anonymous.send(Message(TOPIC, b"x"))
