"""`sluice user ...` and `sluice acl ...`, and every command's credentials ($SLUICE_ACCESS_KEY / $SLUICE_SECRET_KEY
or a profile file), against real brokers run with authentication: one broker, and a cluster of two behind an
in-process name server."""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import FrozenInstanceError, dataclass
from pathlib import Path
from typing import Any

import pytest

from broker.auth.accounts import User
from broker.auth.gate import BAD_CREDENTIALS
from broker.cli.main import main
from broker.client.admin import AclEntry, Admin, BrokerUserInfo, UserInfo
from broker.errors import InvalidArgumentError
from broker.namesrv import NameServer
from broker.server.broker_controller import BrokerController

ROOT, ROOT_SECRET = "root", "root-secret-0123"
AUTH = {"auth_enabled": True, "allow_plaintext_auth": True, "auth_root_access_key": ROOT,
        "auth_root_secret_key": ROOT_SECRET}
CLIENT_ENV = ("SLUICE_ENDPOINT", "SLUICE_NAMESRV", "SLUICE_ACCESS_KEY", "SLUICE_SECRET_KEY", "SLUICE_PROFILE",
              "SLUICE_TLS_CA", "SLUICE_TLS_CERT", "SLUICE_TLS_KEY")


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


class Cli:
    """``sluice`` as its main() runs it, with the environment a test gives each command (and nothing inherited)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], endpoint: str) -> None:
        self.monkeypatch, self.capfd, self.endpoint = monkeypatch, capfd, endpoint
        for name in CLIENT_ENV:
            monkeypatch.delenv(name, raising=False)

    def __call__(self, *argv: str, user: tuple[str, str] | None = (ROOT, ROOT_SECRET), endpoint: bool = True,
                 env: dict[str, str] | None = None) -> Run:
        settings = {"SLUICE_ACCESS_KEY": user[0], "SLUICE_SECRET_KEY": user[1]} if user else {}
        settings.update(env or {})
        for name in CLIENT_ENV:
            if name in settings:
                self.monkeypatch.setenv(name, settings[name])
            else:
                self.monkeypatch.delenv(name, raising=False)
        self.capfd.readouterr()
        code = main([*argv, *(["--endpoint", self.endpoint] if endpoint else [])])
        captured = self.capfd.readouterr()
        return Run(code, captured.out, captured.err)


def private_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.fixture
def broker(broker_factory: Any) -> BrokerController:
    return broker_factory(**AUTH)


@pytest.fixture
def cli(broker: BrokerController, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> Cli:
    return Cli(monkeypatch, capfd, broker.address)


def users(cli: Cli) -> dict[str, dict[str, Any]]:
    listed = cli("user", "list", "--json")
    assert listed.code == 0, listed.err
    return {u["access_key"]: u for u in listed.json()}


def test_user_create_list_update_delete(cli: Cli, tmp_path: Path) -> None:
    secret_file = private_file(tmp_path / "alice.secret", "alice-secret-1\n")
    created = cli("user", "create", "alice", "--secret-key-file", str(secret_file), "--json")
    assert created.code == 0, created.err
    assert created.json() == {"access_key": "alice", "super_user": False, "enabled": True}
    assert users(cli)["alice"] == {"access_key": "alice", "super_user": False, "enabled": True}
    assert users(cli)[ROOT]["super_user"] is True
    assert "alice-secret-1" not in cli("user", "list").out + cli("user", "list", "--json").out

    assert cli("user", "update", "alice", "--super").code == 0
    assert users(cli)["alice"]["super_user"] is True
    # the secret of the file works: alice, now a super user, lists the users herself
    assert cli("user", "list", user=("alice", "alice-secret-1")).code == 0
    updated = cli("user", "update", "alice", "--no-super", "--disable", "--json")
    assert updated.json() == {"access_key": "alice", "super_user": False, "enabled": False}
    assert "alice       no          no" in cli("user", "list").out.splitlines()  # the table's row

    again = cli("user", "create", "alice", "--secret-key-file", str(secret_file))
    assert again.code == 1 and "exists" in again.err and "[INVALID_ARGUMENT]" in again.err
    nothing = cli("user", "update", "alice")
    assert nothing.code == 1 and "nothing to update" in nothing.err

    deleted = cli("user", "delete", "alice", "--json")
    assert deleted.code == 0 and deleted.json() == {"deleted": "alice"}
    assert "alice" not in users(cli)
    gone = cli("user", "delete", "alice")
    assert gone.code == 1 and "no user 'alice'" in gone.err and "[QUERY_NOT_FOUND]" in gone.err


def test_a_generated_secret_is_printed_once_and_works(cli: Cli, broker: BrokerController) -> None:
    created = cli("user", "create", "bob")
    assert created.code == 0, created.err
    found = re.findall(r"^secret key: (\S+)$", created.out, re.MULTILINE)
    assert len(found) == 1
    secret = found[0]
    assert created.out.count(secret) == 1 and "shown only this once" in created.out
    assert len(secret) >= 40  # 30 random bytes
    assert secret not in cli("user", "list", "--json").out + cli("user", "list").out

    assert cli("topic", "create", "GenTopic", "--queues", "1").code == 0
    assert cli("acl", "grant", "bob", "--resource", "Topic:GenTopic", "--actions", "Pub").code == 0
    sent = cli("send", "GenTopic", "--body", "from bob", user=("bob", secret))
    assert sent.code == 0, sent.err
    # Acknowledged is stored; visible to readers once the dispatcher has indexed it, a moment later
    assert broker.store is not None and broker.store.wait_dispatched()
    with Admin(broker.address, access_key=ROOT, secret_key=ROOT_SECRET) as admin:
        assert admin.queue_offsets("GenTopic") == {0: (0, 1)}

    as_json = cli("user", "create", "bob-json", "--json").json()  # the JSON form carries it once too
    assert as_json["secret_key_note"].startswith("shown only this once") and len(as_json["secret_key"]) >= 40
    assert cli("user", "list", user=("bob-json", as_json["secret_key"])).code == 1  # valid, but not a super user


def test_secret_key_files_must_be_private_and_never_arguments(cli: Cli, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    shared = private_file(tmp_path / "shared.secret", "shared-secret-1", mode=0o644)
    refused = cli("user", "create", "carol", "--secret-key-file", str(shared))
    assert refused.code == 1 and "0644" in refused.err and f"chmod 600 {shared}" in refused.err
    assert "shared-secret-1" not in refused.err
    assert "carol" not in users(cli)  # refused before anything was sent

    with pytest.raises(SystemExit) as usage:  # no option takes a secret itself, not even as an abbreviation
        main(["user", "create", "carol", "--secret-key", "on-the-command-line", "--endpoint", cli.endpoint])
    assert usage.value.code == 2
    assert "carol" not in users(cli)

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"piped-secret-1\n")))
    assert cli("user", "create", "carol", "--secret-key-file", "-").code == 0
    assert cli("user", "update", "carol", "--super").code == 0
    assert cli("user", "list", user=("carol", "piped-secret-1")).code == 0


def test_acl_grant_list_revoke_apply_to_the_next_request(cli: Cli, tmp_path: Path) -> None:
    secret = private_file(tmp_path / "dave.secret", "dave-secret-1")
    dave = ("dave", "dave-secret-1")
    assert cli("user", "create", "dave", "--secret-key-file", str(secret)).code == 0
    assert cli("topic", "create", "AclTopic", "--queues", "1").code == 0

    refused = cli("send", "AclTopic", "--body", "x", user=dave)
    assert refused.code == 1 and "user 'dave' lacks" in refused.err
    assert "on Topic:AclTopic [NO_PERMISSION]" in refused.err

    granted = cli("acl", "grant", "dave", "--resource", "Topic:AclTopic", "--actions", "Pub,Sub", "--json")
    assert granted.code == 0, granted.err
    assert granted.json() == [{"access_key": "dave", "resource": "Topic:AclTopic", "actions": ["Pub", "Sub"],
                               "decision": "Allow", "source_ips": []}]
    assert cli("acl", "grant", "dave", "--resource", "Group:dave-*", "--actions", "Sub").code == 0
    assert cli("send", "AclTopic", "--body", "allowed", user=dave).code == 0
    consumed = cli("consume", "AclTopic", "--group", "dave-readers", "--from", "earliest", "--max", "1", user=dave)
    assert consumed.code == 0, consumed.err
    assert "'allowed'" in consumed.out

    listed = cli("acl", "list", "dave")
    assert listed.code == 0
    assert listed.out.splitlines()[2:] == ["dave        Topic:AclTopic  Allow     Pub,Sub  *",
                                           "dave        Group:dave-*    Allow     Sub      *"]
    assert {e["access_key"] for e in cli("acl", "list", "--json").json()} == {"dave"}

    # a Deny as specific as the Allow wins, from the next request on
    assert cli("acl", "grant", "dave", "--resource", "Topic:AclTopic", "--actions", "Pub", "--deny").code == 0
    denied = cli("send", "AclTopic", "--body", "x", user=dave)
    assert denied.code == 1 and "lacks Pub on Topic:AclTopic [NO_PERMISSION]" in denied.err

    revoked = cli("acl", "revoke", "dave", "--resource", "Topic:AclTopic", "--actions", "Pub", "--json")
    assert revoked.code == 0
    assert [(e["resource"], e["actions"], e["decision"]) for e in revoked.json()] == [
        ("Topic:AclTopic", ["Sub"], "Allow"), ("Group:dave-*", ["Sub"], "Allow")]
    assert cli("send", "AclTopic", "--body", "x", user=dave).code == 1  # nothing allows Pub any more
    assert cli("consume", "AclTopic", "--group", "dave-readers", "--from", "earliest", "--max", "1",
               user=dave).code == 0
    assert cli("acl", "revoke", "dave", "--resource", "Topic:AclTopic").code == 0  # every action
    gone = cli("consume", "AclTopic", "--group", "dave-readers", "--from", "earliest", "--max", "1", user=dave)
    assert gone.code == 1 and "[NO_PERMISSION]" in gone.err
    assert [e["resource"] for e in cli("acl", "list", "dave", "--json").json()] == ["Group:dave-*"]

    bad = cli("acl", "grant", "dave", "--resource", "Queue:x", "--actions", "Pub")
    assert bad.code == 1 and "[INVALID_ARGUMENT]" in bad.err and "Topic:NAME" in bad.err
    bad_action = cli("acl", "grant", "dave", "--resource", "Topic:x", "--actions", "Publish")
    assert bad_action.code == 1 and "unknown action 'Publish'" in bad_action.err


def test_a_disabled_user_is_refused_from_its_next_request(cli: Cli, tmp_path: Path) -> None:
    erin = ("erin", "erin-secret-1")
    assert cli("user", "create", "erin", "--super", "--secret-key-file",
               str(private_file(tmp_path / "erin", erin[1]))).code == 0
    assert cli("user", "list", user=erin).code == 0
    assert cli("user", "update", "erin", "--disable").code == 0
    refused = cli("user", "list", user=erin)
    assert refused.code == 1
    assert f"{BAD_CREDENTIALS.format(key='erin')} [UNAUTHENTICATED]" in refused.err
    assert "came from the environment" in refused.err
    assert cli("user", "update", "erin", "--enable").code == 0
    assert cli("user", "list", user=erin).code == 0
    wrong = cli("user", "list", user=("erin", "not-the-secret"))
    assert wrong.code == 1 and f"{BAD_CREDENTIALS.format(key='erin')} [UNAUTHENTICATED]" in wrong.err
    assert "not-the-secret" not in wrong.err


def test_user_and_acl_commands_need_a_super_user(cli: Cli, tmp_path: Path) -> None:
    frank = ("frank", "frank-secret-1")
    assert cli("user", "create", "frank", "--secret-key-file", str(private_file(tmp_path / "f", frank[1]))).code == 0
    assert cli("acl", "grant", "frank", "--resource", "*", "--actions", "All").code == 0  # every right but these
    new_secret = str(private_file(tmp_path / "g", "g-secret-1"))
    for argv in (["user", "list"], ["user", "create", "mallory", "--secret-key-file", new_secret],
                 ["user", "update", "frank", "--super"], ["user", "delete", ROOT], ["acl", "list"],
                 ["acl", "grant", "frank", "--resource", "Cluster", "--actions", "All"],
                 ["acl", "revoke", "frank", "--resource", "*"]):
        refused = cli(*argv, user=frank)
        assert refused.code == 1, argv
        assert "user 'frank' may not call" in refused.err and "super users only [NO_PERMISSION]" in refused.err
    assert set(users(cli)) == {ROOT, "frank"}
    assert users(cli)["frank"]["super_user"] is False
    assert [e["actions"] for e in cli("acl", "list", "frank", "--json").json()] == [["All"]]


def test_a_profile_file_applies_where_the_environment_does_not(cli: Cli, tmp_path: Path) -> None:
    profile = tmp_path / "admin.profile"
    text = (f"# the admin's settings\nSLUICE_ENDPOINT={cli.endpoint}\nexport SLUICE_ACCESS_KEY={ROOT}\n"
            f"SLUICE_SECRET_KEY='{ROOT_SECRET}'\n")
    private_file(profile, text, mode=0o640)
    refused = cli("user", "list", "--profile", str(profile), user=None, endpoint=False)
    assert refused.code == 1
    assert f"profile {profile} holds a secret key but its permissions 0640" in refused.err
    assert f"chmod 600 {profile}" in refused.err and ROOT_SECRET not in refused.err

    profile.chmod(0o600)
    by_option = cli("user", "list", "--profile", str(profile), "--json", user=None, endpoint=False)
    assert by_option.code == 0, by_option.err
    assert ROOT in {u["access_key"] for u in by_option.json()}
    by_env = cli("user", "list", user=None, endpoint=False, env={"SLUICE_PROFILE": str(profile)})
    assert by_env.code == 0, by_env.err

    # the environment's pair wins over the profile's, whole
    wrong = cli("user", "list", user=("root", "wrong-secret"), endpoint=False, env={"SLUICE_PROFILE": str(profile)})
    assert wrong.code == 1 and "the signature is wrong" in wrong.err and "came from the environment" in wrong.err
    half = cli("user", "list", user=None, endpoint=False,
               env={"SLUICE_PROFILE": str(profile), "SLUICE_ACCESS_KEY": ROOT})
    assert half.code == 1 and "sets only one of SLUICE_ACCESS_KEY and SLUICE_SECRET_KEY" in half.err

    no_secret = private_file(tmp_path / "shared.profile", f"SLUICE_ENDPOINT={cli.endpoint}\n", mode=0o644)
    anonymous = cli("user", "list", "--profile", str(no_secret), user=None, endpoint=False)
    assert anonymous.code == 1 and "[UNAUTHENTICATED]" in anonymous.err  # readable: it holds no secret
    assert "sent no credentials" in anonymous.err

    typo = private_file(tmp_path / "typo.profile", f"SLUICE_SECRETKEY={ROOT_SECRET}\n")
    bad = cli("user", "list", "--profile", str(typo), user=None)
    assert bad.code == 1 and "line 1: unknown setting 'SLUICE_SECRETKEY'" in bad.err and ROOT_SECRET not in bad.err
    missing = cli("user", "list", "--profile", str(tmp_path / "none"), user=None)
    assert missing.code == 1 and "cannot read profile" in missing.err


def test_help_never_shows_a_secret(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capfd: pytest.CaptureFixture[str]) -> None:
    profile = private_file(tmp_path / "p", f"SLUICE_ACCESS_KEY={ROOT}\nSLUICE_SECRET_KEY=profile-secret-1\n")
    monkeypatch.setenv("SLUICE_SECRET_KEY", "env-secret-1")
    monkeypatch.setenv("SLUICE_PROFILE", str(profile))
    for argv in ([], ["user"], ["user", "create"], ["user", "update"], ["acl", "grant"], ["send"], ["consume"],
                 ["topic", "list"], ["user", "list", "--profile", str(profile)]):
        capfd.readouterr()
        with pytest.raises(SystemExit) as done:
            main([*argv, "--help"])
        assert done.value.code == 0
        shown = capfd.readouterr().out
        assert "usage: sluice" in shown
        assert "env-secret-1" not in shown and "profile-secret-1" not in shown


def test_send_and_consume_sign_with_the_environment_s_credentials(cli: Cli) -> None:
    assert cli("topic", "create", "EnvTopic", "--queues", "2").code == 0
    unsigned = cli("send", "EnvTopic", "--body", "x", user=None)
    assert unsigned.code == 1
    assert "this broker requires credentials" in unsigned.err and "[UNAUTHENTICATED]" in unsigned.err
    assert "sent no credentials: set SLUICE_ACCESS_KEY and SLUICE_SECRET_KEY" in unsigned.err
    unsigned_read = cli("consume", "EnvTopic", "--group", "g", "--from", "earliest", user=None)
    assert unsigned_read.code == 1 and "[UNAUTHENTICATED]" in unsigned_read.err

    sent = cli("send", "EnvTopic", "--body", "signed", "--count", "3", "--json")
    assert sent.code == 0, sent.err
    assert sent.json()["acknowledged"] == 3
    got = cli("consume", "EnvTopic", "--group", "env-group", "--from", "earliest", "--json")
    assert got.code == 0, got.err
    assert [json.loads(line)["body"] for line in got.out.splitlines()] == ["signed"] * 3
    for argv in (["topic", "describe", "EnvTopic"], ["group", "lag", "env-group"], ["stats"], ["tx", "list"],
                 ["group", "list"], ["query", "key", "EnvTopic", "k"]):
        assert cli(*argv).code == 0, argv
        assert cli(*argv, user=None).code == 1, argv


def test_admin_user_and_acl_methods(broker: BrokerController) -> None:
    with Admin(broker.address, access_key=ROOT, secret_key=ROOT_SECRET) as admin:
        user = admin.create_user("ivy", "ivy-secret-1", enabled=False)
        assert user == UserInfo("ivy", super_user=False, enabled=False)
        assert not hasattr(user, "secret_key")
        assert admin.update_user("ivy", enabled=True) == UserInfo("ivy", False, True)
        entries = admin.grant_acl("ivy", "Topic:ivy-*", ["Pub", "Sub"], source_ips=["127.0.0.0/8"])
        assert entries == [AclEntry("ivy", "Topic:ivy-*", ("Pub", "Sub"), "Allow", ("127.0.0.0/8",))]
        assert admin.list_acls("ivy") == entries == admin.list_acls()
        with pytest.raises(FrozenInstanceError):
            entries[0].decision = "Deny"  # type: ignore[misc]
        assert admin.revoke_acl("ivy", "Topic:ivy-*", "Sub") == [
            AclEntry("ivy", "Topic:ivy-*", ("Pub",), "Allow", ("127.0.0.0/8",))]
        with pytest.raises(InvalidArgumentError, match="access key"):
            admin.create_user("no spaces", "s")  # refused before it is sent
        with pytest.raises(InvalidArgumentError, match="cluster= and broker="):
            admin.list_users(cluster="DefaultCluster")
        assert admin.delete_user("ivy") == [""]
        assert [u.access_key for u in admin.list_users()] == [ROOT]
        assert admin.list_acls() == []


# ------------------------------------------------------------------------------------------------ a cluster
@dataclass
class Cluster:
    namesrv: str
    brokers: dict[str, BrokerController]


@pytest.fixture
def cluster(broker_factory: Any, tmp_path: Path) -> Iterator[Cluster]:
    ns = NameServer("127.0.0.1", 0, root=User(ROOT, ROOT_SECRET))  # the brokers run with --auth: they sign as root
    ns.start()
    try:
        brokers = {name: broker_factory(tmp_path / name, namesrv_addr=ns.address, broker_name=name, **AUTH)
                   for name in ("auth-a", "auth-b")}
        yield Cluster(ns.address, brokers)
    finally:
        ns.shutdown()


def held_users(c: Cluster) -> dict[str, set[str]]:
    """Each broker's users, asked of the broker itself."""
    out = {}
    for name, b in c.brokers.items():
        with Admin(b.address, access_key=ROOT, secret_key=ROOT_SECRET) as admin:
            out[name] = {u.access_key for u in admin.list_users()}
    return out


def test_user_and_acl_changes_reach_every_broker_of_a_cluster(cluster: Cluster, monkeypatch: pytest.MonkeyPatch,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    cli = Cli(monkeypatch, capfd, "")

    def run(*argv: str, user: tuple[str, str] | None = (ROOT, ROOT_SECRET)) -> Run:
        return cli(*argv, "--namesrv", cluster.namesrv, user=user, endpoint=False)

    created = run("user", "create", "gina", "--json")
    assert created.code == 0, created.err
    gina = ("gina", created.json()["secret_key"])
    assert sorted(b["broker_name"] for b in created.json()["brokers"]) == ["auth-a", "auth-b"]
    assert held_users(cluster) == {"auth-a": {ROOT, "gina"}, "auth-b": {ROOT, "gina"}}
    listed = run("user", "list", "--json").json()
    assert sorted((u["access_key"], u["broker_name"]) for u in listed) == [
        ("gina", "auth-a"), ("gina", "auth-b"), (ROOT, "auth-a"), (ROOT, "auth-b")]

    assert run("topic", "create", "ClusterAuth", "--queues", "2").code == 0
    assert run("acl", "grant", "gina", "--resource", "Topic:ClusterAuth", "--actions", "Pub").code == 0
    sent = run("send", "ClusterAuth", "--body", "spread", "--count", "20", "--json", user=gina)
    assert sent.code == 0, sent.err
    assert {r["broker_name"] for r in sent.json()["results"]} == {"auth-a", "auth-b"}

    assert run("acl", "revoke", "gina", "--resource", "Topic:ClusterAuth").code == 0
    for name, b in cluster.brokers.items():  # refused by each broker, asked directly
        refused = cli("send", "ClusterAuth", "--body", "x", user=gina, env={"SLUICE_ENDPOINT": b.address},
                      endpoint=False)
        assert refused.code == 1 and "[NO_PERMISSION]" in refused.err, name

    # a group's offsets reset through the name servers: each broker is asked with the same credentials
    reset = run("group", "reset-offsets", "nobody", "--topic", "ClusterAuth", "--to-latest", "--json")
    assert reset.code == 0, reset.err
    assert {r["broker_name"] for r in reset.json()["queues"]} == {"auth-a", "auth-b"}

    one = run("user", "create", "hank", "--broker", "auth-b", "--json")
    assert one.code == 0 and [b["broker_name"] for b in one.json()["brokers"]] == ["auth-b"]
    everywhere = run("user", "create", "hank")
    assert everywhere.code == 1 and "exists on auth-b; nothing was created" in everywhere.err
    assert held_users(cluster)["auth-a"] == {ROOT, "gina"}
    grant = run("acl", "grant", "hank", "--resource", "Cluster", "--actions", "Get")
    assert grant.code == 1 and "no user 'hank' on auth-a; nothing was granted" in grant.err

    deleted = run("user", "delete", "hank", "--json")
    assert deleted.code == 0 and deleted.json()["brokers"] == ["auth-b"]  # passed over where it was not
    assert run("user", "delete", "gina").code == 0
    assert held_users(cluster) == {"auth-a": {ROOT}, "auth-b": {ROOT}}
    with Admin(namesrv=cluster.namesrv, access_key=ROOT, secret_key=ROOT_SECRET) as admin:  # the client's rows
        assert [(u.access_key, u.broker_name) for u in admin.list_users() if isinstance(u, BrokerUserInfo)] == [
            (ROOT, "auth-a"), (ROOT, "auth-b")]
