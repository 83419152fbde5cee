"""Secrets at rest: every file of a broker that holds a secret is readable by its owner only, from its creation on;
a broker refuses to start with a config file, a replication secret or a users file that others can read (as ssh
refuses such a private key); and a rotated secret does not survive in a backup."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from broker.auth.accounts import USERS_FILE, Accounts, User
from broker.client import Admin
from broker.config import BrokerConfig
from broker.errors import AuthenticationError, InvalidArgumentError
from broker.json_file import write_json_atomic
from broker.private_file import write_private
from broker.semantics.receipt_handle import SECRET_BYTES, load_secret
from tests.support.secured_process import ROOT, ROOT_SECRET, refused_start, start_secured, write_config

OLD_SECRET, NEW_SECRET = "alice-old-secret-4711", "alice-new-secret-0815"


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextmanager
def umask(mask: int) -> Iterator[None]:
    """The process's umask set to ``mask``: 0 shows what mode a file is created with, whatever the umask."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def secret_files(store: Path) -> list[Path]:
    """The files of a store that hold secrets: the users file and the receipt-handle secrets (pop, timer)."""
    return sorted([*store.rglob(USERS_FILE), *store.rglob("secret")])


def sluice(*argv: str, endpoint: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLUICE_ACCESS_KEY": ROOT, "SLUICE_SECRET_KEY": ROOT_SECRET}
    return subprocess.run([sys.executable, "-m", "broker", *argv, "--endpoint", endpoint], capture_output=True,
                          text=True, env=env, timeout=60, check=False)


# ------------------------------------------------------------------------------------------------ written private
def test_secret_files_are_private_after_the_first_start_and_a_rotation_keeps_no_old_secret(tmp_path: Path) -> None:
    store = tmp_path / "store"
    broker = start_secured(tmp_path)
    try:
        with Admin(broker.endpoint, access_key=ROOT, secret_key=ROOT_SECRET) as admin:
            admin.create_user("alice", OLD_SECRET)
            admin.create_user("bob", "bob-secret-0042")  # a second change: a backup would now hold alice's secret
        files = secret_files(store)
        assert {f.name for f in files} == {USERS_FILE, "secret"} and len(files) >= 2, files  # pop's, timer's
        assert {f: mode_of(f) for f in files} == {f: 0o600 for f in files}

        new_secret = tmp_path / "alice.secret"
        write_private(new_secret, NEW_SECRET.encode())
        rotated = sluice("user", "update", "alice", "--secret-key-file", str(new_secret), endpoint=broker.endpoint)
        assert rotated.returncode == 0, rotated.stderr

        with pytest.raises(AuthenticationError), Admin(broker.endpoint, access_key="alice",
                                                       secret_key=OLD_SECRET) as old:
            old.list_users()
    finally:
        assert broker.stop() == 0, "\n".join(broker.output)
    # stopped: no file of the config directory is being replaced while it is read
    users_file = store / "config" / USERS_FILE
    assert mode_of(users_file) == 0o600
    assert json.loads(users_file.read_text())["users"]["alice"]["secret_key"] == NEW_SECRET
    assert not users_file.with_name(f"{USERS_FILE}.bak").exists()
    for f in (store / "config").rglob("*"):  # the old secret is in no file of the config directory
        assert not f.is_file() or OLD_SECRET.encode() not in f.read_bytes(), f


def test_files_holding_secrets_are_created_private_whatever_the_umask(tmp_path: Path) -> None:
    with umask(0):
        accounts = Accounts(tmp_path / "config")
        accounts.create_user("alice", OLD_SECRET)
        secret = load_secret(str(tmp_path / "pop"))
        write_private(tmp_path / "plain", b"x")
    for path in (tmp_path / "config" / USERS_FILE, tmp_path / "pop" / "secret", tmp_path / "plain"):
        assert mode_of(path) == 0o600, path
    assert not list(tmp_path.rglob("*.tmp")) and len(secret) == SECRET_BYTES
    with umask(0):
        write_json_atomic(tmp_path / "public.json", {"a": 1})
        write_json_atomic(tmp_path / "public.json", {"a": 2})
    assert mode_of(tmp_path / "public.json") == 0o644  # files without secrets stay as they were, with a backup
    assert json.loads((tmp_path / "public.json.bak").read_text()) == {"a": 1}


def test_a_receipt_handle_secret_an_earlier_version_left_readable_is_made_private_and_kept(tmp_path: Path) -> None:
    folder = tmp_path / "pop"
    folder.mkdir()
    (folder / "secret").write_bytes(b"k" * SECRET_BYTES)
    (folder / "secret").chmod(0o644)
    assert load_secret(str(folder)) == b"k" * SECRET_BYTES  # handles in flight stay valid
    assert mode_of(folder / "secret") == 0o600


def test_a_users_backup_an_earlier_version_kept_is_removed_when_the_users_are_loaded(tmp_path: Path) -> None:
    config = tmp_path / "config"
    current = {"users": {"alice": {"secret_key": NEW_SECRET, "super_user": False, "enabled": True}}, "acls": {}}
    previous = {"users": {"alice": {"secret_key": OLD_SECRET, "super_user": False, "enabled": True}}, "acls": {}}
    config.mkdir()
    write_private(config / USERS_FILE, json.dumps(current).encode())
    write_private(config / f"{USERS_FILE}.bak", json.dumps(previous).encode())
    accounts = Accounts(config)
    accounts.load()
    assert accounts.user("alice") == User("alice", NEW_SECRET)
    assert not (config / f"{USERS_FILE}.bak").exists()
    assert OLD_SECRET not in (config / USERS_FILE).read_text() and mode_of(config / USERS_FILE) == 0o600


# ------------------------------------------------------------------------------------------------ refused starts
@pytest.mark.parametrize("mode", [0o644, 0o640])
def test_a_broker_refuses_to_start_with_a_config_file_holding_the_root_secret_that_others_can_read(
    tmp_path: Path, mode: int
) -> None:
    config = write_config(tmp_path / "broker.json", mode=mode)
    refused = refused_start(tmp_path / "store", "--config", str(config))
    assert refused.returncode == 1, refused.stderr
    assert f"config file {config} holds a secret but its permissions {mode:04o} are open to other users" in (
        refused.stderr
    )
    assert f"chmod 600 {config}" in refused.stderr and "[INVALID_ARGUMENT]" in refused.stderr
    assert ROOT_SECRET not in refused.stderr + refused.stdout
    assert not (tmp_path / "store").exists()  # refused before anything was made


def test_only_a_config_file_that_holds_the_root_secret_must_be_private(tmp_path: Path) -> None:
    public = tmp_path / "public.toml"
    public.write_text('default_topic_queue_nums = 4\nauth_root_access_key = ""\n')
    public.chmod(0o644)
    assert BrokerConfig.from_file(public).default_topic_queue_nums == 4
    secret = tmp_path / "secret.toml"
    secret.write_text(f'auth_root_access_key = "{ROOT}"\nauth_root_secret_key = "{ROOT_SECRET}"\n')
    secret.chmod(0o604)  # others, not group: refused too
    with pytest.raises(InvalidArgumentError, match=f"config file {secret} holds a secret but its permissions 0604"):
        BrokerConfig.from_file(secret)


def test_a_broker_refuses_to_start_with_a_replication_secret_others_can_read(tmp_path: Path) -> None:
    secret = tmp_path / "group.secret"
    write_private(secret, os.urandom(24).hex().encode())
    secret.chmod(0o640)
    config = tmp_path / "replica.json"
    config.write_text(json.dumps({"role": "SYNC_MASTER", "ha_secret_file": str(secret)}))
    refused = refused_start(tmp_path / "store", "--config", str(config))
    assert refused.returncode == 1, refused.stderr
    assert f"ha_secret_file {secret} holds a secret but its permissions 0640 are open to other users" in (
        refused.stderr
    )
    assert f"chmod 600 {secret}" in refused.stderr
    assert not (tmp_path / "store").exists()


def test_a_broker_refuses_to_start_with_a_users_file_others_can_read(tmp_path: Path) -> None:
    users_file = tmp_path / "store" / "config" / USERS_FILE
    users_file.parent.mkdir(parents=True)
    users = {"users": {"alice": {"secret_key": OLD_SECRET, "super_user": True, "enabled": True}}, "acls": {}}
    write_private(users_file, json.dumps(users).encode())
    users_file.chmod(0o644)
    before = users_file.read_bytes()
    config = write_config(tmp_path / "broker.json")
    refused = refused_start(tmp_path / "store", "--config", str(config))
    assert refused.returncode == 1, refused.stderr
    assert f"users file {users_file} holds a secret but its permissions 0644 are open to other users" in (
        refused.stderr
    )
    assert users_file.read_bytes() == before and mode_of(users_file) == 0o644  # left for its owner to fix
    assert sorted(p.name for p in users_file.parent.iterdir()) == [USERS_FILE]
