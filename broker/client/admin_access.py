"""Users and access control entries, by admin (super users only): ``create_user`` ... ``list_acls`` of ``Admin``.

They live in each broker's own ``config/users.json``, which a master replicates to its slaves (slaves refuse
changes). In a cluster a change goes to every live master of the cluster (as topics do), or to one (``broker=``). A
create or a grant first asks every target for its users: one that does not answer, or (create) holds the user
already, or (grant) does not, changes nothing anywhere. An update, a delete or a revocation goes on to the other
masters when one fails, so that taking rights away reaches every broker that answers; the error then names where
it was done and where not.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from broker.client.admin_base import AdminBase, ask_broker, with_broker
from broker.client.admin_results import (
    AclEntry,
    BrokerInfo,
    BrokerUserInfo,
    ClusterUserInfo,
    UserInfo,
    acl_entry,
    user_info,
)
from broker.client.route import DIRECT_BROKER
from broker.errors import BrokerError, InvalidArgumentError, QueryNotFoundError
from broker.format.signature import validate_access_key, validate_secret_key
from broker.proto import sluice_pb2 as pb


class AccessAdmin(AdminBase):
    def create_user(
        self, access_key: str, secret_key: str, super_user: bool = False, enabled: bool = True, *,
        cluster: str | None = None, broker: str | None = None,
    ) -> UserInfo:
        """A new user (super users pass every authorization check); InvalidArgumentError when it exists. A cluster:
        on every live master of ``cluster`` (of the only one when neither is named) or on the master ``broker``, as
        a ``ClusterUserInfo`` with each broker's row; nothing is created when one of them holds the user already."""
        validate_access_key(access_key)
        validate_secret_key(secret_key)
        request = pb.UserRequest(access_key=access_key, secret_key=secret_key, super_user=super_user, enabled=enabled)
        if not self.cluster_mode:
            self._one_broker(cluster, broker)
            return user_info(self.conn.call(self.stub.CreateUser, request))
        targets = self._targets(cluster, broker)
        held = [b.broker_name for b, users in self._users_of(targets) if access_key in users]
        if held:
            raise InvalidArgumentError(
                f"user {access_key!r} exists on {', '.join(held)}; nothing was created (update it, or create it on "
                "the brokers that lack it with broker=)"
            )
        done = self._on_each(targets, "CreateUser", request, f"user {access_key!r} was created")
        return ClusterUserInfo.of(access_key, [_broker_user(a, b) for b, a in done])

    def update_user(
        self, access_key: str, secret_key: str | None = None, super_user: bool | None = None,
        enabled: bool | None = None, *, cluster: str | None = None, broker: str | None = None,
    ) -> UserInfo:
        """Change what is given of a user: a new secret key, super user or not, enabled or not (a disabled user is
        refused from its next request on). QueryNotFoundError for an unknown user. A cluster: on the masters
        ``create_user`` names, each tried even when one fails."""
        validate_access_key(access_key)
        if secret_key is not None:
            validate_secret_key(secret_key)
        if secret_key is None and super_user is None and enabled is None:
            raise InvalidArgumentError("nothing to update: give a secret key, super_user or enabled")
        request = pb.UserRequest(access_key=access_key, secret_key=secret_key, super_user=super_user, enabled=enabled)
        if not self.cluster_mode:
            self._one_broker(cluster, broker)
            return user_info(self.conn.call(self.stub.UpdateUser, request))
        targets = self._targets(cluster, broker)
        done = self._on_each(targets, "UpdateUser", request, f"user {access_key!r} was updated")
        return ClusterUserInfo.of(access_key, [_broker_user(a, b) for b, a in done])

    def delete_user(self, access_key: str, *, cluster: str | None = None, broker: str | None = None) -> list[str]:
        """Delete a user with its access control entries; the brokers it was deleted on (``[""]`` with one broker).
        QueryNotFoundError when none of them holds it; in a cluster masters that do not hold it are passed over."""
        validate_access_key(access_key)
        request = pb.DeleteUserRequest(access_key=access_key)
        if not self.cluster_mode:
            self._one_broker(cluster, broker)
            self.conn.call(self.stub.DeleteUser, request)
            return [DIRECT_BROKER]
        targets = self._targets(cluster, broker)
        done = self._on_each(targets, "DeleteUser", request, f"user {access_key!r} was deleted", absent_ok=True)
        if not done:
            raise QueryNotFoundError(f"no user {access_key!r} on any live master of {self.router.describe()}")
        return [b.broker_name for b, _ in done]

    def list_users(self, *, cluster: str | None = None, broker: str | None = None) -> list[UserInfo]:
        """Every user, by access key, the broker's root user included; never a secret key. A cluster: a
        ``BrokerUserInfo`` per user and master, so a user one master lacks shows."""
        if not self.cluster_mode:
            self._one_broker(cluster, broker)
            return [user_info(u) for u in self.conn.call(self.stub.ListUsers, pb.ListUsersRequest()).users]
        rows = [u for _, users in self._users_of(self._targets(cluster, broker)) for u in users.values()]
        return sorted(rows, key=_row_order)

    def grant_acl(
        self, access_key: str, resource: str, actions: str | Iterable[str], decision: str = "Allow",
        source_ips: Iterable[str] = (), *, cluster: str | None = None, broker: str | None = None,
    ) -> list[AclEntry]:
        """Allow (or, ``decision="Deny"``, deny) ``actions`` (Pub, Sub, Create, Update, Delete, Get, List, All; a
        list or one comma-separated string) on ``resource`` (Cluster, Topic:NAME, Group:NAME, NAME may end in
        ``*``; or ``*``) to a user, from ``source_ips`` (CIDRs; none: from anywhere). The actions join the user's
        entry with the same resource, decision and networks, or make a new one. Returns the user's entries after
        the change (``BrokerAclEntry`` rows of every master in a cluster, where nothing is granted unless every
        master holds the user)."""
        validate_access_key(access_key)
        wanted = _actions(actions)
        if not wanted:
            raise InvalidArgumentError("name at least one action to grant (Pub, Sub, Create, Update, Delete, Get, "
                                       "List, All)")
        entry = pb.AclEntry(access_key=access_key, resource=resource, actions=wanted, decision=decision,
                            source_ips=list(source_ips))
        request = pb.GrantAclRequest(entry=entry)
        if not self.cluster_mode:
            self._one_broker(cluster, broker)
            return [acl_entry(e) for e in self.conn.call(self.stub.GrantAcl, request).entries]
        targets = self._targets(cluster, broker)
        missing = [b.broker_name for b, users in self._users_of(targets) if access_key not in users]
        if missing:
            raise QueryNotFoundError(
                f"no user {access_key!r} on {', '.join(missing)}; nothing was granted (create it there first, with "
                "broker=)"
            )
        done = self._on_each(targets, "GrantAcl", request, f"the grant to {access_key!r} was made")
        return sorted((acl_entry(e, b) for b, a in done for e in a.entries), key=_row_order)

    def revoke_acl(
        self, access_key: str, resource: str, actions: str | Iterable[str] = (), *, cluster: str | None = None,
        broker: str | None = None,
    ) -> list[AclEntry]:
        """Take ``actions`` (every action when none are named) on ``resource`` away from the user's entries, Allow
        and Deny alike; applies to the user's next request. Returns the user's entries after the change. A
        cluster: on the masters ``create_user`` names, each tried even when one fails."""
        validate_access_key(access_key)
        request = pb.RevokeAclRequest(access_key=access_key, resource=resource, actions=_actions(actions))
        if not self.cluster_mode:
            self._one_broker(cluster, broker)
            return [acl_entry(e) for e in self.conn.call(self.stub.RevokeAcl, request).entries]
        targets = self._targets(cluster, broker)
        done = self._on_each(targets, "RevokeAcl", request, f"the revocation from {access_key!r} was made")
        return sorted((acl_entry(e, b) for b, a in done for e in a.entries), key=_row_order)

    def list_acls(self, access_key: str = "", *, cluster: str | None = None,
                  broker: str | None = None) -> list[AclEntry]:
        """The access control entries of one user, or of every user (``access_key=""``), by user. A cluster:
        ``BrokerAclEntry`` rows of every master."""
        if access_key:
            validate_access_key(access_key)
        request = pb.ListAclsRequest(access_key=access_key)
        if not self.cluster_mode:
            self._one_broker(cluster, broker)
            return [acl_entry(e) for e in self.conn.call(self.stub.ListAcls, request).entries]
        rows: list[AclEntry] = []
        for b in self._targets(cluster, broker):
            answer = ask_broker(b.broker_name, self._connection(b), "ListAcls", request)
            rows += [acl_entry(e, b) for e in answer.entries]
        return sorted(rows, key=_row_order)

    def _users_of(self, targets: list[BrokerInfo]) -> list[tuple[BrokerInfo, dict[str, BrokerUserInfo]]]:
        """Each target's users by access key; raises, naming the broker, when one does not answer."""
        out = []
        for b in targets:
            answer = ask_broker(b.broker_name, self._connection(b), "ListUsers", pb.ListUsersRequest())
            out.append((b, {u.access_key: _broker_user(u, b) for u in answer.users}))
        return out

    def _on_each(self, targets: list[BrokerInfo], method: str, request: Any, what: str,
                 absent_ok: bool = False) -> list[tuple[BrokerInfo, Any]]:
        """``method`` on every target, each tried even when another failed; the answers, or an error naming where
        ``what`` and where it failed. ``absent_ok``: a broker answering QueryNotFoundError is passed over."""
        done: list[tuple[BrokerInfo, Any]] = []
        failed: list[tuple[BrokerInfo, BrokerError]] = []
        for b in targets:
            conn = self._connection(b)
            try:
                done.append((b, conn.call(getattr(conn.stub, method), request)))
            except BrokerError as e:
                if not (absent_ok and isinstance(e, QueryNotFoundError)):
                    failed.append((b, e))
        if not failed:
            return done
        first = failed[0][1]
        if not done and len(failed) == 1:
            raise with_broker(first, failed[0][0].broker_name)
        reasons = "; ".join(f"{b.broker_name}: {e.message}" for b, e in failed)
        if done:
            where = ", ".join(b.broker_name for b, _ in done)
            raise BrokerError(f"{what} on {where}, but not on {reasons}", first.code)
        raise BrokerError(f"refused by every broker: {reasons}", first.code)


def _broker_user(u: pb.UserInfo, b: BrokerInfo) -> BrokerUserInfo:
    row = user_info(u, b)
    assert isinstance(row, BrokerUserInfo)
    return row


def _row_order(row: UserInfo | AclEntry) -> tuple[str, str]:
    return row.access_key, getattr(row, "broker_name", "")


def _actions(actions: str | Iterable[str]) -> list[str]:
    """A list of action names, from a list or one comma-separated string (``"Pub,Sub"``)."""
    items = actions.split(",") if isinstance(actions, str) else list(actions)
    return [a.strip() for a in items if a.strip()]
