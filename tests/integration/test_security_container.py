"""The broker image with TLS and authentication on, as an operator runs it: ``sluice broker --auth`` with its
certificate and key mounted read-only from a test PKI and the root user from the environment. Producers,
consumers and an admin on this machine connect with the CA and their own users' credentials: a producer and a
consumer with grants make a round trip; a client without credentials, with a wrong secret, or with Pub only where
it tries to consume is refused with the matching error and changes nothing; a plain-text client and one that
trusts another CA get a TlsError saying what to change. One container for the module; each test makes its own
users and topic.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from sluice_containers import LABEL, SESSION

from broker.client import Admin, Message, Producer, PullConsumer, PullStatus
from broker.errors import AuthenticationError, NoPermissionError, TlsError
from broker.format.signature import ROOT_ACCESS_KEY_ENV, ROOT_SECRET_KEY_ENV
from broker.testing import SluiceContainer
from tests.support.brokers import wait_dispatched
from tests.support.certs import Pki, make_pki

pytestmark = pytest.mark.integration

ROOT_ACCESS_KEY = "it-root"
ROOT_SECRET_KEY = "it-root-secret-0123456789"
CONFIG_DIR = "/etc/sluice"  # in the container: certificate, key and settings, mounted read-only
# Small store files: the broker allocates ~100 MB instead of ~1.5 GB of the shared disk.
SMALL_STORE = {"store": {"mapped_file_size_commit_log": 64 << 20, "mapped_file_size_consume_queue": 30_000 * 20,
                         "max_hash_slot_num": 16_384, "max_index_num": 65_536}}
DISPATCH_TIMEOUT_S = 30.0  # the dispatcher builds consume queues right after a send: polled, busy 2-core machine


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def mounted(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Path:
    """A host directory for the container's CONFIG_DIR: the server's certificate and key, and the settings file.
    The broker runs as uid 10001, not this user: the directory and files are made readable by anyone (a throwaway
    test key; a real deployment chowns the key to the broker's user and keeps it 0600)."""
    directory = tmp_path_factory.mktemp("broker-etc")
    for name, source in (("server.pem", pki.server_cert), ("server-key.pem", pki.server_key)):
        (directory / name).write_bytes(source.read_bytes())
        (directory / name).chmod(0o644)
    (directory / "broker.json").write_text(json.dumps(SMALL_STORE))
    (directory / "broker.json").chmod(0o644)
    directory.chmod(0o755)
    return directory


@pytest.fixture(scope="module")
def secured(docker_client: docker.DockerClient, broker_image: str, mounted: Path) -> Iterator[SluiceContainer]:
    """One broker container serving TLS with authentication and authorization on."""
    broker = SluiceContainer(
        broker_image, bind_host="127.0.0.1", labels={LABEL: SESSION},
        broker_args=("--config", f"{CONFIG_DIR}/broker.json", "--auth", "--tls-cert", f"{CONFIG_DIR}/server.pem",
                     "--tls-key", f"{CONFIG_DIR}/server-key.pem"),
    )
    broker.with_env(ROOT_ACCESS_KEY_ENV, ROOT_ACCESS_KEY).with_env(ROOT_SECRET_KEY_ENV, ROOT_SECRET_KEY)
    broker.with_volume_mapping(str(mounted), CONFIG_DIR, "ro")
    try:
        broker.start()
        yield broker
    finally:
        try:  # the store is the container's anonymous volume: removed with it
            broker.stop(force=True, delete_volume=True)
        except docker.errors.NotFound:
            pass


def root_admin(broker: SluiceContainer, pki: Pki) -> Admin:
    return Admin(broker.get_endpoint(), tls_ca=str(pki.ca), access_key=ROOT_ACCESS_KEY, secret_key=ROOT_SECRET_KEY)


def create_user(admin: Admin, access_key: str, secret_key: str, *grants: tuple[str, str]) -> None:
    """A user that is not a super user, with an Allow entry per (resource, actions) grant."""
    admin.create_user(access_key, secret_key)
    for resource, actions in grants:
        admin.grant_acl(access_key, resource, actions)


def test_producer_and_consumer_with_credentials_and_the_ca(secured: SluiceContainer, pki: Pki) -> None:
    endpoint, ca = secured.get_endpoint(), str(pki.ca)
    with root_admin(secured, pki) as admin:
        admin.create_topic("payments", queues=2)
        create_user(admin, "payments-writer", "writer-secret", ("Topic:payments", "Pub"))
        create_user(admin, "payments-reader", "reader-secret", ("Topic:payments", "Sub"),
                    ("Group:payments-audit", "Sub"))
        bodies = [f"payment-{i}".encode() * (1 + i % 7) for i in range(200)]
        with Producer(endpoint, tls_ca=ca, access_key="payments-writer", secret_key="writer-secret") as producer:
            first = producer.send(Message("payments", bodies[0], keys=("p-0",)), queue_id=1)
            rest = producer.send_batch([Message("payments", b) for b in bodies[1:]], queue_id=1)
        assert [r.queue_offset for r in (first, *rest)] == list(range(200))
        wait_dispatched(admin, "payments", {1: 200}, timeout_s=DISPATCH_TIMEOUT_S)

    with PullConsumer(endpoint, "payments-audit", tls_ca=ca, access_key="payments-reader",
                      secret_key="reader-secret") as consumer:
        got, offset = [], 0
        while (result := consumer.pull("payments", 1, offset, max_msgs=64)).status is PullStatus.FOUND:
            got += [m.body for m in result.messages]
            offset = result.next_begin_offset
        consumer.commit_offsets({("payments", 1): offset})
        assert consumer.committed_offsets("payments") == {1: 200}
    assert got == bodies


def test_a_client_without_valid_credentials_is_refused_and_changes_nothing(secured: SluiceContainer, pki: Pki) -> None:
    endpoint, ca = secured.get_endpoint(), str(pki.ca)
    with root_admin(secured, pki) as admin:
        admin.create_topic("ledger", queues=1)
        create_user(admin, "ledger-writer", "right-secret", ("Topic:ledger", "Pub"))
        with (
            Producer(endpoint, tls_ca=ca) as anonymous,
            pytest.raises(AuthenticationError, match="requires credentials"),
        ):
            anonymous.send(Message("ledger", b"no credentials"), queue_id=0)
        with PullConsumer(endpoint, "ledger-readers", tls_ca=ca) as anonymous, pytest.raises(AuthenticationError):
            anonymous.pull("ledger", 0, 0)
        with (
            Producer(endpoint, tls_ca=ca, access_key="ledger-writer", secret_key="wrong-secret") as wrong,
            pytest.raises(AuthenticationError, match="'ledger-writer' is unknown or disabled, or the signature is"),
        ):
            wrong.send(Message("ledger", b"wrong secret"), queue_id=0)
        with (
            Producer(endpoint, tls_ca=ca, access_key="nobody", secret_key="any-secret") as unknown,
            pytest.raises(AuthenticationError, match="'nobody' is unknown or disabled, or the signature is wrong"),
        ):
            unknown.send(Message("ledger", b"unknown user"), queue_id=0)
        assert admin.queue_offsets("ledger") == {0: (0, 0)}, "a refused send was stored"


def test_a_user_with_pub_only_cannot_consume(secured: SluiceContainer, pki: Pki) -> None:
    endpoint, ca = secured.get_endpoint(), str(pki.ca)
    credentials: dict[str, Any] = {"tls_ca": ca, "access_key": "events-writer", "secret_key": "events-secret"}
    with root_admin(secured, pki) as admin:
        admin.create_topic("events", queues=1)
        create_user(admin, "events-writer", "events-secret", ("Topic:events", "Pub"))
        with Producer(endpoint, **credentials) as producer:
            producer.send(Message("events", b"written"), queue_id=0)
        wait_dispatched(admin, "events", {0: 1}, timeout_s=DISPATCH_TIMEOUT_S)
        with PullConsumer(endpoint, "events-readers", **credentials) as consumer:
            with pytest.raises(NoPermissionError, match="'events-writer' lacks Sub on Group:events-readers"):
                consumer.pull("events", 0, 0)
            admin.grant_acl("events-writer", "Group:events-readers", "Sub")  # the group, still not the topic
            with pytest.raises(NoPermissionError, match="'events-writer' lacks Sub on Topic:events"):
                consumer.pull("events", 0, 0)
            admin.grant_acl("events-writer", "Topic:events", "Sub")  # applies to the next request, same connection
            result = consumer.pull("events", 0, 0)
    assert result.status is PullStatus.FOUND
    assert [m.body for m in result.messages] == [b"written"]


def test_a_plain_text_client_and_one_trusting_another_ca_get_a_tls_error(secured: SluiceContainer, pki: Pki) -> None:
    endpoint = secured.get_endpoint()
    with (
        Admin(endpoint, access_key=ROOT_ACCESS_KEY, secret_key=ROOT_SECRET_KEY) as plain,
        pytest.raises(TlsError, match="serves TLS but this client connects in plain text"),
    ):
        plain.list_topics()
    with (
        Admin(endpoint, tls_ca=str(pki.rogue_ca), access_key=ROOT_ACCESS_KEY, secret_key=ROOT_SECRET_KEY) as other,
        pytest.raises(TlsError, match="is not trusted"),
    ):
        other.list_topics()
