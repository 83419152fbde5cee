"""The broker's users and their access control entries, kept in ``config/users.json``.

One file holds both: ``{"users": {ACCESS_KEY: {"secret_key", "super_user", "enabled"}}, "acls": {ACCESS_KEY:
[entry, ...]}}``, written as the other config files are (json_file.py: temp file, fsync, rename), with mode 0600
because it holds secrets. Secrets are stored as given: an HMAC signature can only be checked with the secret itself
(RocketMQ stores them so too); the file's mode and the config directory's are what protect them. A broker refuses
to start when group or others can read the file (broker/private_file.py).

No ``.bak`` is kept, unlike the other config files: it would hold the previous version, so a secret just rotated
(because it leaked) or a user just deleted would stay valid on disk until the next change. The rename already
leaves the old file or the new one after a crash; what a backup adds is a copy for a file damaged later, and for
this file the way back is the root user, which is never stored (below): restart with it and create the users
again. A ``.bak`` an earlier version left is removed when the file is loaded (written again without one).

The root user comes from the broker's start (``SLUICE_ROOT_ACCESS_KEY`` and ``SLUICE_ROOT_SECRET_KEY``, or the
config file): a super user held in memory only, never written, and not changed by the user RPCs, so an operator
locked out by a bad change gets back in by restarting with the environment.

Reads take no lock: every change builds new dictionaries and swaps them in, so a request sees one consistent
version, and a change (a revocation, a disabled user) applies to every request that starts after it returned.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from broker.auth.policy import Action, Decision, Entry, Pattern, parse_networks
from broker.errors import InvalidArgumentError, NoPermissionError, QueryNotFoundError
from broker.format.signature import (
    ROOT_ACCESS_KEY_ENV,
    ROOT_SECRET_KEY_ENV,
    validate_access_key,
    validate_secret_key,
)
from broker.json_file import load_json, write_json_atomic
from broker.private_file import PRIVATE_MODE, check_private

log = logging.getLogger(__name__)

USERS_FILE = "users.json"
MAX_USERS = 10_000  # each is held in memory and written on every change; a directory service is the next step
MAX_ENTRIES_PER_USER = 1_000  # every request of the user scans them


@dataclass(frozen=True, slots=True)
class User:
    access_key: str
    secret_key: str
    super_user: bool = False
    enabled: bool = True

    def __repr__(self) -> str:  # never the secret, whatever prints a user
        return f"User({self.access_key!r}, super_user={self.super_user}, enabled={self.enabled})"


def _parse(data: dict[str, Any]) -> tuple[dict[str, User], dict[str, tuple[Entry, ...]]]:
    users = {}
    for key, u in dict(data.get("users", {})).items():
        secret = validate_secret_key(str(u["secret_key"]))
        users[validate_access_key(key)] = User(
            key, secret, bool(u.get("super_user", False)), bool(u.get("enabled", True))
        )
    acls = {validate_access_key(k): tuple(Entry.from_json(e) for e in v) for k, v in dict(data.get("acls", {})).items()}
    return users, acls


def root_user_from_env() -> User | None:
    """The root user of ``$SLUICE_ROOT_ACCESS_KEY`` and ``$SLUICE_ROOT_SECRET_KEY`` (a name server's)."""
    return root_user(None)


def root_user(config: Any) -> User | None:
    """The root super user of a BrokerConfig: its auth_root_* settings, else the environment; None for neither."""
    key = (config.auth_root_access_key if config else "") or os.environ.get(ROOT_ACCESS_KEY_ENV, "")
    secret = (config.auth_root_secret_key if config else "") or os.environ.get(ROOT_SECRET_KEY_ENV, "")
    if not key and not secret:
        return None
    if not (key and secret):
        raise InvalidArgumentError(f"the root user needs both {ROOT_ACCESS_KEY_ENV} and {ROOT_SECRET_KEY_ENV}")
    return User(validate_access_key(key), validate_secret_key(secret), super_user=True)


class Accounts:
    """Users and entries of one broker (module docstring)."""

    def __init__(self, config_dir: str | Path | None, root: User | None = None) -> None:
        """``config_dir`` None: the root user only, nothing read or written (a name server's)."""
        self.path = Path(config_dir) / USERS_FILE if config_dir is not None else None
        self.root = replace(root, super_user=True, enabled=True) if root is not None else None
        self._lock = threading.Lock()  # one change at a time; readers never take it
        self._users: dict[str, User] = {}
        self._acls: dict[str, tuple[Entry, ...]] = {}

    # ---------------------------------------------------------------------------------------------- reading
    def load(self) -> None:
        """Read the file (or the backup an earlier version kept); an empty set when there is none. CorruptionError
        naming the file when it cannot be read; InvalidArgumentError when group or others can read it."""
        if self.path is None:
            return
        backup = self.path.with_name(f"{USERS_FILE}.bak")
        for path in (self.path, backup):
            check_private(path, "users file")
        loaded = load_json(self.path, _parse)
        with self._lock:
            self._users, self._acls = loaded if loaded is not None else ({}, {})
            if loaded is not None and backup.exists():
                self._save(*loaded)  # written again without a backup, which removes it (module docstring)

    def replace(self, data: dict[str, Any]) -> None:
        """The master's file, on a slave (broker/ha/metadata_sync.py): written here and in force from the next
        request. Content that is not a users file is logged and this copy kept, as for the other config files."""
        try:
            users, acls = _parse(data)
        except (KeyError, TypeError, ValueError, AttributeError, InvalidArgumentError) as e:
            log.error("the master sent a %s that cannot be read (%s); keeping this broker's copy", USERS_FILE, e)
            return
        with self._lock:
            self._save(users, acls)

    def user(self, access_key: str) -> User | None:
        if self.root is not None and access_key == self.root.access_key:
            return self.root
        return self._users.get(access_key)

    def entries(self, access_key: str) -> tuple[Entry, ...]:
        return self._acls.get(access_key, ())

    def has_any_user(self) -> bool:
        return self.root is not None or bool(self._users)

    def users(self) -> list[User]:
        listed = dict(self._users)
        if self.root is not None:
            listed[self.root.access_key] = self.root
        return [listed[k] for k in sorted(listed)]

    def acl_entries(self, access_key: str = "") -> list[tuple[str, Entry]]:
        acls = self._acls
        keys = [access_key] if access_key else sorted(acls)
        return [(k, e) for k in keys for e in acls.get(k, ())]

    # ---------------------------------------------------------------------------------------------- changing
    def _save(self, users: dict[str, User], acls: dict[str, tuple[Entry, ...]]) -> None:
        data = {"users": {k: {"secret_key": u.secret_key, "super_user": u.super_user, "enabled": u.enabled}
                          for k, u in users.items()},
                "acls": {k: [e.to_json() for e in v] for k, v in acls.items() if v}}
        if self.path is None:
            raise InvalidArgumentError("this server keeps no users besides its root user")
        write_json_atomic(self.path, data, mode=PRIVATE_MODE, backup=False)
        self._users, self._acls = users, acls

    def _not_root(self, access_key: str) -> None:
        if self.root is not None and access_key == self.root.access_key:
            raise NoPermissionError(
                f"{access_key!r} is the root user, set by the broker's environment; change it there and restart"
            )

    def create_user(self, access_key: str, secret_key: str, super_user: bool = False, enabled: bool = True) -> User:
        validate_access_key(access_key)
        validate_secret_key(secret_key)
        self._not_root(access_key)
        with self._lock:
            if access_key in self._users:
                raise InvalidArgumentError(f"user {access_key!r} exists; update it instead")
            if len(self._users) >= MAX_USERS:
                raise InvalidArgumentError(f"the broker holds {MAX_USERS} users, its limit")
            user = User(access_key, secret_key, super_user, enabled)
            self._save({**self._users, access_key: user}, self._acls)
        log.info("user %s created (super user: %s)", access_key, super_user)
        return user

    def update_user(self, access_key: str, secret_key: str | None = None, super_user: bool | None = None,
                    enabled: bool | None = None) -> User:
        self._not_root(access_key)
        with self._lock:
            old = self._users.get(access_key)
            if old is None:
                raise QueryNotFoundError(f"no user {access_key!r}")
            secret = validate_secret_key(secret_key) if secret_key is not None else old.secret_key
            user = replace(old, secret_key=secret, super_user=old.super_user if super_user is None else super_user,
                           enabled=old.enabled if enabled is None else enabled)
            self._save({**self._users, access_key: user}, self._acls)
        log.info("user %s updated (super user: %s, enabled: %s%s)", access_key, user.super_user, user.enabled,
                 ", new secret" if secret_key is not None else "")
        return user

    def delete_user(self, access_key: str) -> None:
        self._not_root(access_key)
        with self._lock:
            if access_key not in self._users:
                raise QueryNotFoundError(f"no user {access_key!r}")
            users = {k: u for k, u in self._users.items() if k != access_key}
            self._save(users, {k: v for k, v in self._acls.items() if k != access_key})
        log.info("user %s deleted, with its access control entries", access_key)

    def grant(self, access_key: str, resource: str, actions: Iterable[str], decision: str = "Allow",
              source_ips: Iterable[str] = ()) -> list[Entry]:
        """Adds ``actions`` to the user's entry with the same resource, decision and networks (or a new one)."""
        pattern, wanted = Pattern.parse(resource), frozenset(Action.parse(a) for a in actions)
        verdict, networks = Decision.parse(decision), parse_networks(source_ips)
        if not wanted:
            raise InvalidArgumentError("name at least one action to grant")
        with self._lock:
            if self.user(access_key) is None:
                raise QueryNotFoundError(f"no user {access_key!r}; create it first")
            entries = list(self._acls.get(access_key, ()))
            for i, e in enumerate(entries):
                if (e.pattern, e.decision, e.networks) == (pattern, verdict, networks):
                    entries[i] = replace(e, actions=e.actions | wanted)
                    break
            else:
                if len(entries) >= MAX_ENTRIES_PER_USER:
                    raise InvalidArgumentError(f"user {access_key!r} has {MAX_ENTRIES_PER_USER} entries, the limit")
                entries.append(Entry(pattern, wanted, verdict, networks))
            self._save(self._users, {**self._acls, access_key: tuple(entries)})
        log.info("acl: %s %s %s on %s", access_key, verdict.value, ",".join(sorted(a.value for a in wanted)), pattern)
        return entries

    def revoke(self, access_key: str, resource: str, actions: Iterable[str] = ()) -> list[Entry]:
        """Removes ``actions`` (all when none are named) from the user's entries on ``resource``."""
        pattern, dropped = Pattern.parse(resource), frozenset(Action.parse(a) for a in actions)
        with self._lock:
            kept = []
            for e in self._acls.get(access_key, ()):
                if e.pattern != pattern:
                    kept.append(e)
                elif dropped and e.actions - dropped:
                    kept.append(replace(e, actions=e.actions - dropped))
            self._save(self._users, {**self._acls, access_key: tuple(kept)})
        log.info("acl: %s revoked %s on %s", access_key,
                 ",".join(sorted(a.value for a in dropped)) or "every action", pattern)
        return kept
