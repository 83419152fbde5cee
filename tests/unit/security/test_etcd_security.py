"""Controller mode against a real etcd that checks who calls: one started with TLS and ``--client-cert-auth``
(certificates made with openssl, certs.py), one with auth enabled (a root user, a user with a role on ``/sluice/``).
With the right certificate or password the broker is elected and the group's state can be read; without, every
call fails with an error carrying a response code, a broker refuses to start, and etcd holds nothing of it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.cli.parser import build_parser
from broker.client import Message, Producer
from broker.client.results import SendStatus
from broker.config import BrokerConfig
from broker.errors import InvalidArgumentError, ResponseCode
from broker.ha.controller import GroupState
from broker.ha.etcd_client import CoordinationError, Etcd, EtcdAuthError, EtcdPermissionError, EtcdTlsError
from broker.ha.etcd_process import EtcdProcess, EtcdTls
from broker.ha.etcd_security import PASSWORD_ENV, EtcdSecurity
from broker.server.broker_controller import BrokerController
from tests.support.certs import Pki
from tests.support.replicas import broker, brokers
from tests.support.waiting import wait_until

STATE_KEY = "/sluice/DefaultCluster/g/state"
MEMBERS = "/sluice/DefaultCluster/g/members/"
PASSWORD = "sluice-etcd-password-0123"


@pytest.fixture
def tls_etcd(tmp_path: Path, pki: Pki) -> Iterator[EtcdProcess]:
    tls = EtcdTls(ca=pki.ca, cert=pki.server_cert, key=pki.server_key, client_cert=pki.client_cert,
                  client_key=pki.client_key)
    with EtcdProcess(tmp_path / "etcd", tls=tls) as e:
        yield e


@pytest.fixture
def auth_etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    with EtcdProcess(tmp_path / "etcd") as e:
        e.add_user("sluice", PASSWORD, prefix="/sluice/")
        e.add_user("stranger", "stranger-password")  # a user of etcd with no right on Sluice's keys
        e.enable_auth("root-password-0123")
        yield e


def _file(path: Path, text: str) -> str:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return str(path)


def _replica(path: Path, etcd: EtcdProcess, broker_id: int = 1, **settings: Any) -> BrokerController:
    return broker(path, controller=etcd.url, broker_id=broker_id, ha_lease_ttl_s=2, min_insync_replicas=1,
                  **settings)


def _state(client: Etcd) -> GroupState:
    kv = client.get(STATE_KEY)
    assert kv is not None
    return GroupState.from_kv(kv)


def _refused(security: EtcdSecurity, etcd: EtcdProcess) -> CoordinationError:
    client = Etcd([("127.0.0.1", etcd.client_port)], security=security)
    try:
        with pytest.raises(CoordinationError) as info:
            client.get(STATE_KEY)
        return info.value
    finally:
        client.close()


def test_etcd_with_client_cert_auth_admits_the_broker_with_its_certificate_only(
    tmp_path: Path, pki: Pki, tls_etcd: EtcdProcess
) -> None:
    good = EtcdSecurity(str(pki.ca), str(pki.client_cert), str(pki.client_key))
    settings = {"etcd_ca_file": str(pki.ca), "etcd_cert_file": str(pki.client_cert),
                "etcd_key_file": str(pki.client_key)}
    with brokers() as bs:
        m = _replica(tmp_path / "r1", tls_etcd, **settings)
        bs.append(m)
        wait_until(lambda: m.replication is not None and m.replication.is_master(), "replica 1 elected over TLS")
        with Producer(endpoint=m.address, timeout_s=5) as p:
            assert p.send(Message("EtcdTlsT", b"x")).status is SendStatus.SEND_OK
        client = Etcd([("127.0.0.1", tls_etcd.client_port)], security=good)
        try:
            assert (_state(client).epoch, _state(client).master) == (1, 1)
            before = sorted(kv.key for kv in client.get_prefix(MEMBERS))
            no_cert = _refused(EtcdSecurity(str(pki.ca)), tls_etcd)
            assert isinstance(no_cert, EtcdTlsError) and no_cert.code == ResponseCode.UNAUTHENTICATED
            assert "etcd_cert_file" in no_cert.message
            untrusted = _refused(EtcdSecurity(str(pki.ca), str(pki.rogue_server_cert), str(pki.rogue_server_key)),
                                 tls_etcd)
            assert isinstance(untrusted, EtcdTlsError) and untrusted.code == ResponseCode.UNAUTHENTICATED
            plain = _refused(EtcdSecurity(), tls_etcd)  # etcd closes the connection: the message says what to try
            assert plain.code == ResponseCode.SERVICE_NOT_AVAILABLE and "etcd_ca_file" in plain.message
            wrong_ca = _refused(EtcdSecurity(str(pki.rogue_ca), str(pki.client_cert), str(pki.client_key)), tls_etcd)
            assert isinstance(wrong_ca, EtcdTlsError)
            # a replica without a client certificate refuses to start, and etcd holds nothing of it
            with pytest.raises(EtcdTlsError) as start:
                _replica(tmp_path / "r2", tls_etcd, broker_id=2, etcd_ca_file=str(pki.ca))
            assert start.value.code == ResponseCode.UNAUTHENTICATED
            assert sorted(kv.key for kv in client.get_prefix(MEMBERS)) == before == [MEMBERS + "1"]
            assert (_state(client).epoch, _state(client).master) == (1, 1)
        finally:
            client.close()


def test_etcd_with_auth_admits_the_broker_with_the_right_password_only(
    tmp_path: Path, auth_etcd: EtcdProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = EtcdSecurity(user="sluice", password=PASSWORD)
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    with brokers() as bs:
        m = _replica(tmp_path / "r1", auth_etcd, etcd_user="sluice",
                     etcd_password_file=_file(tmp_path / "etcd-password", PASSWORD))
        bs.append(m)
        wait_until(lambda: m.replication is not None and m.replication.is_master(), "replica 1 elected as sluice")
        client = Etcd([("127.0.0.1", auth_etcd.client_port)], security=good)
        try:
            assert (_state(client).epoch, _state(client).master) == (1, 1)
            client._tokens[0] = "expired.token"  # a token etcd no longer knows: the client authenticates again
            assert _state(client).epoch == 1
            before = sorted(kv.key for kv in client.get_prefix(MEMBERS))
            wrong = _refused(EtcdSecurity(user="sluice", password="not-the-password"), auth_etcd)
            assert isinstance(wrong, EtcdAuthError) and wrong.code == ResponseCode.UNAUTHENTICATED
            assert "'sluice'" in wrong.message and "password" in wrong.message
            anonymous = _refused(EtcdSecurity(), auth_etcd)
            assert isinstance(anonymous, EtcdAuthError) and "etcd_user" in anonymous.message
            stranger = _refused(EtcdSecurity(user="stranger", password="stranger-password"), auth_etcd)
            assert isinstance(stranger, EtcdPermissionError) and stranger.code == ResponseCode.NO_PERMISSION
            # the password from the environment works as the file does; a wrong one refuses the start
            monkeypatch.setenv(PASSWORD_ENV, "not-the-password")
            with pytest.raises(EtcdAuthError) as start:
                _replica(tmp_path / "r2", auth_etcd, broker_id=2, etcd_user="sluice")
            assert start.value.code == ResponseCode.UNAUTHENTICATED
            assert sorted(kv.key for kv in client.get_prefix(MEMBERS)) == before == [MEMBERS + "1"]
            monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
            r2 = _replica(tmp_path / "r2", auth_etcd, broker_id=2, etcd_user="sluice")
            bs.append(r2)
            wait_until(lambda: sorted(kv.key for kv in client.get_prefix(MEMBERS)) == [MEMBERS + "1", MEMBERS + "2"],
                       "replica 2 a member")
            assert (_state(client).epoch, _state(client).master) == (1, 1)
        finally:
            client.close()


def test_etcd_settings_are_checked_before_anything_starts(tmp_path: Path, pki: Pki,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    base: dict[str, Any] = {"listen": "127.0.0.1:0", "store_path": str(tmp_path / "s"), "broker_id": 1,
                            "controller": "etcd://127.0.0.1:2379"}
    password = _file(tmp_path / "pw", PASSWORD)
    refused = [
        ({"etcd_cert_file": str(pki.client_cert)}, "together"),
        ({"etcd_cert_file": str(pki.client_cert), "etcd_key_file": str(pki.client_key)}, "etcd_ca_file"),
        ({"etcd_user": "sluice"}, PASSWORD_ENV),
        ({"etcd_password_file": password}, "etcd_user"),
        ({"etcd_ca_file": str(tmp_path / "missing.pem")}, "cannot read etcd_ca_file"),
        ({"controller": "etcd://10.1.2.3:2379", "etcd_user": "sluice", "etcd_password_file": password}, "in clear"),
        ({"controller": "", "broker_id": 0, "etcd_ca_file": str(pki.ca)}, "controller mode"),
    ]
    for extra, reason in refused:
        with pytest.raises(InvalidArgumentError, match=reason):
            BrokerConfig(**{**base, **extra})
    config = BrokerConfig(**base, etcd_ca_file=str(pki.ca), etcd_user="sluice", etcd_password_file=password,
                          etcd_cert_file=str(pki.client_cert), etcd_key_file=str(pki.client_key))
    replication = config.replication()
    assert replication is not None
    etcd = replication.etcd
    assert (etcd.protocol, etcd.user, etcd.password) == ("https", "sluice", PASSWORD)
    assert PASSWORD not in repr(replication) and PASSWORD not in repr(config)


def test_sluice_broker_takes_the_etcd_flags_and_no_password_on_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser().parse_args(["broker", "--etcd-ca-file", "ca.pem", "--etcd-cert-file", "c.pem",
                                      "--etcd-key-file", "k.pem", "--etcd-user", "sluice",
                                      "--etcd-password-file", "pw"])
    assert (args.etcd_ca_file, args.etcd_cert_file, args.etcd_key_file, args.etcd_user, args.etcd_password_file) == (
        "ca.pem", "c.pem", "k.pem", "sluice", "pw")
    capsys.readouterr()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["broker", "--etcd-password", "secret"])
    assert "--etcd-password-file" in capsys.readouterr().err
