"""``sluice user create|update|delete|list`` and ``sluice acl grant|revoke|list``: users and their access control
entries, on one broker or (``--namesrv``) on every master of a cluster, whose slaves receive them with the rest of
the master's configuration (broker/client/admin_access.py says how).

A secret key comes from ``--secret-key-file`` (profile.py: a private file, or stdin), never from an argument. When
``user create`` is given none it generates one with ``secrets`` and prints it once on stdout: the broker never
answers a secret back, so it cannot be shown again (``user update --secret-key-file`` replaces a lost one).
"""

from __future__ import annotations

import argparse
import secrets
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from broker.cli.output import emit
from broker.cli.profile import client_args, read_secret_file

if TYPE_CHECKING:
    from broker.client.admin_results import AclEntry, UserInfo

# 30 random bytes, 40 URL-safe characters: 240 bits, more than HMAC-SHA1's 160-bit output can use, and within the
# 64 characters a secret key may have (broker/format/signature.py).
GENERATED_SECRET_BYTES = 30
SHOWN_ONCE = "shown only this once: the broker never answers it back"
RESOURCE_HELP = ("Cluster, Topic:NAME, Group:NAME (NAME may end in * for a prefix, or be *), or * for every "
                 "resource")
ACTIONS_HELP = "Pub, Sub, Create, Update, Delete, Get, List, All (comma-separated)"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _where(args: argparse.Namespace) -> dict[str, Any]:
    return {"cluster": args.cluster, "broker": args.broker}


def _user_rows(users: list[UserInfo], cluster_mode: bool) -> tuple[list[list[object]], list[str]]:
    if cluster_mode:
        rows: list[list[object]] = [[u.access_key, _broker(u), _yes(u.super_user), _yes(u.enabled)] for u in users]
        return rows, ["access_key", "broker", "super_user", "enabled"]
    return [[u.access_key, _yes(u.super_user), _yes(u.enabled)] for u in users], ["access_key", "super_user", "enabled"]


def _broker(row: Any) -> str:
    return str(getattr(row, "broker_name", ""))


def _changed_users(user: UserInfo) -> list[UserInfo]:
    """The rows of a created or updated user: one per broker in a cluster."""
    brokers = getattr(user, "brokers", None)
    return list(brokers) if brokers is not None else [user]


def cmd_user(args: argparse.Namespace) -> int:
    from broker.client.admin import Admin

    secret = read_secret_file(args.secret_key_file) if getattr(args, "secret_key_file", None) else None
    with Admin(**client_args(args)) as admin:
        if args.action == "list":
            users = admin.list_users(**_where(args))
            emit(args, [asdict(u) for u in users], *_user_rows(users, admin.cluster_mode))
            return 0
        if args.action == "delete":
            brokers = admin.delete_user(args.access_key, **_where(args))
            if admin.cluster_mode:
                emit(args, {"deleted": args.access_key, "brokers": brokers},
                     [[args.access_key, "deleted", ", ".join(brokers)]],
                     ["access_key", "status", "brokers"])
            else:
                emit(args, {"deleted": args.access_key}, [[args.access_key, "deleted"]], ["access_key", "status"])
            return 0
        generated = args.action == "create" and secret is None
        if args.action == "create":
            secret = secret or secrets.token_urlsafe(GENERATED_SECRET_BYTES)
            user = admin.create_user(args.access_key, secret, args.super_user, **_where(args))
        else:
            user = admin.update_user(args.access_key, secret, args.super_user, args.enabled, **_where(args))
        cluster_mode = admin.cluster_mode
    rows = _changed_users(user)
    data: dict[str, Any] = asdict(user)
    if generated:
        data.update(secret_key=secret, secret_key_note=SHOWN_ONCE)
    emit(args, data, *_user_rows(rows, cluster_mode))
    if generated and not args.json:
        print(f"\nsecret key: {secret}")
        print(f"This secret key is {SHOWN_ONCE}. Keep it now, e.g. as SLUICE_SECRET_KEY in a profile file of "
              "mode 600.")
    return 0


def _acl_rows(entries: list[AclEntry], cluster_mode: bool) -> tuple[list[list[object]], list[str]]:
    headers = ["access_key", "resource", "decision", "actions", "source_ips"]
    rows: list[list[object]] = []
    for e in entries:
        row: list[object] = [e.access_key, e.resource, e.decision, ",".join(e.actions), ",".join(e.source_ips) or "*"]
        rows.append([*row[:1], _broker(e), *row[1:]] if cluster_mode else row)
    return rows, [*headers[:1], "broker", *headers[1:]] if cluster_mode else headers


def cmd_acl(args: argparse.Namespace) -> int:
    from broker.client.admin import Admin

    with Admin(**client_args(args)) as admin:
        if args.action == "grant":
            entries = admin.grant_acl(args.access_key, args.resource, args.actions,
                                      "Deny" if args.deny else "Allow", args.source_ip, **_where(args))
        elif args.action == "revoke":
            entries = admin.revoke_acl(args.access_key, args.resource, args.actions, **_where(args))
        else:
            entries = admin.list_acls(args.access_key, **_where(args))
        cluster_mode = admin.cluster_mode
    emit(args, [asdict(e) for e in entries], *_acl_rows(entries, cluster_mode))
    return 0
