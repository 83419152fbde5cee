"""The user and access-control RPCs (CreateUser ... ListAcls): requests in, Accounts calls, answers out.

Answers never carry a secret key. Who may call these is the gate's business (super users only, requirements.py).
A broker without auth refuses them all: whoever reached it could otherwise plant a super user that would still be
there once auth is switched on.
"""

from __future__ import annotations

from broker.auth.accounts import Accounts, User
from broker.auth.policy import Entry
from broker.errors import InvalidArgumentError, NoPermissionError
from broker.proto import sluice_pb2 as pb


def user_info(user: User) -> pb.UserInfo:
    return pb.UserInfo(access_key=user.access_key, super_user=user.super_user, enabled=user.enabled)


def acl_entry(access_key: str, entry: Entry) -> pb.AclEntry:
    j = entry.to_json()
    return pb.AclEntry(access_key=access_key, resource=str(j["resource"]), actions=list(j["actions"]),  # type: ignore[call-overload]
                       decision=str(j["decision"]), source_ips=list(j["source_ips"]))  # type: ignore[call-overload]


class AccountsAdmin:
    def __init__(self, accounts: Accounts, enabled: bool) -> None:
        self._accounts = accounts
        self.enabled = enabled

    @property
    def accounts(self) -> Accounts:
        if not self.enabled:
            raise NoPermissionError("users and access control need a broker started with auth (--auth)")
        return self._accounts

    def create_user(self, r: pb.UserRequest) -> pb.UserInfo:
        if not r.HasField("secret_key"):
            raise InvalidArgumentError("CreateUser needs a secret key")
        enabled = r.enabled if r.HasField("enabled") else True
        return user_info(self.accounts.create_user(r.access_key, r.secret_key, r.super_user, enabled))

    def update_user(self, r: pb.UserRequest) -> pb.UserInfo:
        return user_info(self.accounts.update_user(
            r.access_key, r.secret_key if r.HasField("secret_key") else None,
            r.super_user if r.HasField("super_user") else None, r.enabled if r.HasField("enabled") else None,
        ))

    def delete_user(self, r: pb.DeleteUserRequest) -> pb.DeleteUserResponse:
        self.accounts.delete_user(r.access_key)
        return pb.DeleteUserResponse()

    def list_users(self, r: pb.ListUsersRequest) -> pb.ListUsersResponse:
        return pb.ListUsersResponse(users=[user_info(u) for u in self.accounts.users()])

    def grant(self, r: pb.GrantAclRequest) -> pb.AclEntries:
        e = r.entry
        entries = self.accounts.grant(e.access_key, e.resource, e.actions, e.decision or "Allow", e.source_ips)
        return pb.AclEntries(entries=[acl_entry(e.access_key, x) for x in entries])

    def revoke(self, r: pb.RevokeAclRequest) -> pb.AclEntries:
        entries = self.accounts.revoke(r.access_key, r.resource, r.actions)
        return pb.AclEntries(entries=[acl_entry(r.access_key, x) for x in entries])

    def list_acls(self, r: pb.ListAclsRequest) -> pb.AclEntries:
        return pb.AclEntries(entries=[acl_entry(k, e) for k, e in self.accounts.acl_entries(r.access_key)])
