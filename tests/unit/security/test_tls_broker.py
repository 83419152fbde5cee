"""TLS on a broker's client port: a round trip, mutual TLS in each mode, each way a connection can be refused (as
a TlsError that says what to change), certificates replaced on disk while the broker runs, and HTTPS metrics."""

from __future__ import annotations

import logging
import os
import ssl
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from broker.client import (
    FIRST,
    Admin,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    ReceivedMessage,
    TransactionProducer,
)
from broker.config import BrokerConfig
from broker.errors import InvalidArgumentError, TlsError
from tests.support.certs import Pki, tls_settings

TOPIC = "TlsTopic"


def round_trip(endpoint: str, body: bytes, **tls: Any) -> None:
    with Producer(endpoint, **tls) as producer:
        sent = producer.send(Message(TOPIC, body))
    with PullConsumer(endpoint, "tls-group", **tls) as consumer:
        result = consumer.pull(TOPIC, sent.queue_id, sent.queue_offset, 32)
    assert result.status is PullStatus.FOUND
    assert [m.body for m in result.messages] == [body]


def test_send_and_pull_over_tls(broker_factory: Any, pki: Pki) -> None:
    b = broker_factory(**tls_settings(pki))
    round_trip(b.address, b"over tls", tls_ca=str(pki.ca))
    # https:// names TLS too; the CA still has to be given for a private CA
    round_trip(f"https://{b.address}", b"https endpoint", tls_ca=str(pki.ca))


def test_plain_text_against_tls_and_tls_against_plain_text(broker_factory: Any, pki: Pki) -> None:
    tls_broker = broker_factory(**tls_settings(pki))
    plain_broker = broker_factory(store_dir=tls_broker.config.store_dir.parent / "plain")
    with Admin(tls_broker.address) as admin, pytest.raises(TlsError, match="serves TLS but this client connects in "
                                                                           "plain text"):
        admin.list_topics()
    with Admin(plain_broker.address, tls_ca=str(pki.ca)) as admin, pytest.raises(TlsError, match="not serve TLS"):
        admin.list_topics()


def test_an_untrusted_certificate_and_one_for_another_host(broker_factory: Any, pki: Pki, tmp_path: Path) -> None:
    b = broker_factory(**tls_settings(pki))
    with Admin(b.address, tls_ca=str(pki.rogue_ca)) as admin, pytest.raises(TlsError, match="is not trusted"):
        admin.list_topics()
    other = broker_factory(store_dir=tmp_path / "other", tls_cert=str(pki.other_host_cert),
                           tls_key=str(pki.other_host_key))
    with Admin(other.address, tls_ca=str(pki.ca)) as admin, pytest.raises(TlsError, match=r"not for host 127\.0\.0\.1"):
        admin.list_topics()


def test_mutual_tls_required(broker_factory: Any, pki: Pki) -> None:
    b = broker_factory(**tls_settings(pki, tls_ca=str(pki.ca), tls_client_auth="require"))
    with Admin(b.address, tls_ca=str(pki.ca)) as admin, pytest.raises(TlsError, match="requires a client certificate"):
        admin.list_topics()
    rogue = {"tls_ca": str(pki.ca), "tls_cert": str(pki.rogue_server_cert), "tls_key": str(pki.rogue_server_key)}
    with Admin(b.address, **rogue) as admin, pytest.raises(TlsError, match="refused this client's certificate"):
        admin.list_topics()
    round_trip(b.address, b"mutual", tls_ca=str(pki.ca), tls_cert=str(pki.client_cert),
               tls_key=str(pki.client_key))


@pytest.mark.parametrize("mode", ["request", "none"])
def test_client_certificate_requested_or_not_is_optional(broker_factory: Any, pki: Pki, mode: str) -> None:
    b = broker_factory(**tls_settings(pki, tls_ca=str(pki.ca), tls_client_auth=mode))
    round_trip(b.address, b"no client certificate", tls_ca=str(pki.ca))
    round_trip(b.address, b"with one", tls_ca=str(pki.ca), tls_cert=str(pki.client_cert), tls_key=str(pki.client_key))


def test_certificates_replaced_on_disk_serve_new_connections(broker_factory: Any, pki: Pki,
                                                             rotating_files: tuple[Path, Path]) -> None:
    cert, key = rotating_files
    b = broker_factory(tls_cert=str(cert), tls_key=str(key))
    with Admin(b.address, tls_ca=str(pki.ca)) as admin:
        admin.list_topics()
    # a new certificate (from another CA, so a client can tell which one it got), written the way tools do:
    # a new file renamed over the old one
    for src, dst in ((pki.rogue_server_key, key), (pki.rogue_server_cert, cert)):
        tmp = dst.with_suffix(".new")
        tmp.write_bytes(src.read_bytes())
        os.replace(tmp, dst)
    with Admin(b.address, tls_ca=str(pki.rogue_ca)) as admin:
        admin.list_topics()  # the new certificate, no restart
    with Admin(b.address, tls_ca=str(pki.ca)) as admin, pytest.raises(TlsError, match="is not trusted"):
        admin.list_topics()  # and no longer the old one
    # a key that does not (yet) match its certificate is not taken: the working pair stays in use
    key.write_bytes(pki.server_key.read_bytes())
    with Admin(b.address, tls_ca=str(pki.rogue_ca)) as admin:
        admin.list_topics()


def test_metrics_over_https_with_the_brokers_certificate(broker_factory: Any, pki: Pki) -> None:
    b = broker_factory(metrics_port=0, **tls_settings(pki))
    context = ssl.create_default_context(cafile=str(pki.ca))
    with urllib.request.urlopen(f"https://127.0.0.1:{b.metrics_port}/metrics", context=context, timeout=10) as r:
        assert b"sluice_" in r.read()
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://127.0.0.1:{b.metrics_port}/metrics", timeout=10).read()


def test_plain_text_off_loopback_is_warned_about(broker_factory: Any, pki: Pki, tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="broker.server.server_tls"):
        broker_factory(listen="0.0.0.0:0", store_dir=tmp_path / "a")
        assert any("in plain text" in r.getMessage() for r in caplog.records)
        caplog.clear()
        broker_factory(listen="0.0.0.0:0", store_dir=tmp_path / "b", **tls_settings(pki))
        assert not any("in plain text" in r.getMessage() for r in caplog.records)
        broker_factory(store_dir=tmp_path / "c")  # 127.0.0.1
        assert not any("in plain text" in r.getMessage() for r in caplog.records)


def test_settings_that_cannot_work_are_refused_before_start(pki: Pki, tmp_path: Path) -> None:
    store = str(tmp_path / "s")
    cases = [
        ({"tls_cert": str(pki.server_cert)}, "certificate and its key"),
        ({**tls_settings(pki), "tls_client_auth": "require"}, "needs tls_ca"),
        ({**tls_settings(pki), "tls_client_auth": "maybe"}, "is not one of none, request, require"),
        ({"tls_ca": str(pki.ca)}, "take effect with TLS"),
        ({"tls_cert": str(tmp_path / "missing.pem"), "tls_key": str(pki.server_key)}, "cannot read TLS certificate"),
        ({"tls_cert": str(pki.ca.parent / "ca.srl"), "tls_key": str(pki.server_key)}, "not a PEM file"),
    ]
    for settings, message in cases:
        with pytest.raises(InvalidArgumentError, match=message):
            BrokerConfig(store_path=store, **settings)
    with pytest.raises(InvalidArgumentError, match="tls_cert and tls_key together"):
        Producer("127.0.0.1:1", tls_cert=str(pki.client_cert))


def test_push_consumer_and_transaction_producer_over_mutual_tls(broker_factory: Any, pki: Pki) -> None:
    b = broker_factory(**tls_settings(pki, tls_ca=str(pki.ca), tls_client_auth="require"))
    client = {"tls_ca": str(pki.ca), "tls_cert": str(pki.client_cert), "tls_key": str(pki.client_key)}
    got: list[bytes] = []
    arrived = threading.Event()

    def listener(messages: list[ReceivedMessage]) -> ConsumeStatus:
        got.extend(m.body for m in messages)
        arrived.set()
        return ConsumeStatus.CONSUME_SUCCESS

    with Admin(b.address, **client) as admin:
        admin.create_topic("TlsTx", 1)
    with (
        PushConsumer(b.address, "tls-push", {"TlsTx": "*"}, listener, consume_from=FIRST, long_poll_ms=1000,
                     **client) as _consumer,
        TransactionProducer(b.address, "tls-tx", lambda txn_id, msg: LocalTransactionState.COMMIT_MESSAGE,
                            **client) as producer,
    ):
        sent = producer.send_in_transaction(Message("TlsTx", b"committed"),
                                            lambda m, t: LocalTransactionState.COMMIT_MESSAGE)
        assert sent.local_state is LocalTransactionState.COMMIT_MESSAGE
        assert arrived.wait(30), "the push consumer got nothing"
    assert got == [b"committed"]


def test_https_in_the_environment_means_tls(broker_factory: Any, pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    b = broker_factory(**tls_settings(pki))
    monkeypatch.setenv("SLUICE_ENDPOINT", f"https://{b.address}")
    with Admin(tls_ca=str(pki.ca)) as admin:
        admin.list_topics()
    # https:// alone trusts the system's CAs, which do not know the test CA
    with Admin() as admin, pytest.raises(TlsError, match="is not trusted"):
        admin.list_topics()
