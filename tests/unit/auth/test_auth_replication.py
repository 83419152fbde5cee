"""Users and access control entries in a replicated broker group: created on the master, they reach the slave, so a
promoted slave authenticates the same users with the same rights; a slave refuses to change them itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.auth.accounts import User
from broker.client import Message, Producer
from broker.client.connection import Connection
from broker.client.credentials import Credentials
from broker.client.tls import TlsSettings
from broker.errors import NotMasterError
from broker.proto import sluice_pb2 as pb
from tests.support.certs import Pki, tls_settings
from tests.support.replicas import brokers, in_sync_pair
from tests.support.waiting import wait_until

ROOT = {"auth_enabled": True, "auth_root_access_key": "root", "auth_root_secret_key": "root-secret-value"}


def test_users_and_entries_reach_the_slave_and_the_slave_refuses_changes(tmp_path: Path, pki: Pki) -> None:
    secret = tmp_path / "ha-secret"  # a replicated group with auth proves itself on the replication port
    secret.write_text("group-secret-0123456789abcdef")
    secret.chmod(0o600)
    settings = {**tls_settings(pki, tls_ca=str(pki.ca)), **ROOT, "ha_secret_file": str(secret)}
    with brokers() as bs:
        m, s = in_sync_pair(bs, tmp_path, master={**settings, "min_insync_replicas": 2}, slave=settings)
        root = Credentials("root", "root-secret-value")
        conn = Connection(m.address, 10, TlsSettings(str(pki.ca)), root)
        conn.call(conn.stub.CreateUser, pb.UserRequest(access_key="alice", secret_key="alice-secret"))
        conn.call(conn.stub.GrantAcl, pb.GrantAclRequest(entry=pb.AclEntry(
            access_key="alice", resource="Topic:Replicated*", actions=["Pub"])))
        conn.close()
        assert s.accounts is not None
        wait_until(lambda: s.accounts.user("alice") == User("alice", "alice-secret"), "alice on the slave")
        wait_until(lambda: len(s.accounts.entries("alice")) == 1, "alice's entry on the slave")
        assert (tmp_path / "s" / "config" / "users.json").stat().st_mode & 0o077 == 0
        with Producer(m.address, tls_ca=str(pki.ca), access_key="alice", secret_key="alice-secret") as p:
            p.send(Message("ReplicatedT", b"x"))
        on_slave = Connection(s.address, 10, TlsSettings(str(pki.ca)), root)
        with pytest.raises(NotMasterError):
            on_slave.call(on_slave.stub.CreateUser, pb.UserRequest(access_key="eve", secret_key="eve-secret"))
        on_slave.close()
        assert s.accounts.user("eve") is None
