"""The sluice commands over TLS: the files come from $SLUICE_TLS_CA, $SLUICE_TLS_CERT and $SLUICE_TLS_KEY."""

from __future__ import annotations

import json
from typing import Any

import pytest

from broker.cli.main import main
from tests.support.certs import Pki, tls_settings


def test_cli_commands_read_the_tls_files_from_the_environment(broker_factory: Any, pki: Pki,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    b = broker_factory(**tls_settings(pki, tls_ca=str(pki.ca), tls_client_auth="require"))
    assert main(["topic", "create", "CliTls", "--endpoint", b.address]) == 1  # plain text: refused, with why
    assert "serves TLS" in capfd.readouterr().err
    monkeypatch.setenv("SLUICE_TLS_CA", str(pki.ca))
    monkeypatch.setenv("SLUICE_TLS_CERT", str(pki.client_cert))
    monkeypatch.setenv("SLUICE_TLS_KEY", str(pki.client_key))
    assert main(["topic", "create", "CliTls", "--endpoint", b.address]) == 0
    assert main(["send", "CliTls", "--body", "over tls", "--endpoint", b.address]) == 0
    capfd.readouterr()
    assert main(["topic", "list", "--endpoint", b.address, "--json"]) == 0
    assert "CliTls" in json.dumps(json.loads(capfd.readouterr().out))
