"""The authenticated caller of the call being served, for the checks each operation makes on what it touches.

The auth gate (gate.py) records the caller of each gRPC call it admitted here (``current``, a context variable of
the worker thread serving the call), and the remoting port records the caller of each request it serves
(broker/remoting/message_outcomes.py ``Access.as_caller``); each operation then asks ``require(...)`` (through
operations.py's ``authorize``) on the objects it resolved, and a handler whose rights arrive later asks
``current_caller()`` (a RocketMQ 5 ``Telemetry`` stream's settings; a check-back goes to whichever producer stream
may receive it). With auth off no caller is set, and every check passes, as every call does.

A ``Caller`` reads the user's entries from ``Accounts`` on each question, as the gate does on each call: a right
revoked while a stream is open is gone for the stream's next settings or check-back. A handler that hands work to
another thread passes the ``Caller`` along (a new thread does not see this thread's context).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

from broker.auth.accounts import Accounts
from broker.auth.policy import Need, allows
from broker.errors import NoPermissionError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling, from where, and the accounts their rights are read from."""

    access_key: str
    source: Address | None
    accounts: Accounts
    refused: Callable[[NoPermissionError], None] = lambda e: None  # the gate's count and log of refusals

    def allows(self, n: Need) -> bool:
        user = self.accounts.user(self.access_key)
        if user is None or not user.enabled:
            return False  # disabled or deleted since the stream opened
        return user.super_user or allows(self.accounts.entries(self.access_key), n, self.source)

    def require(self, *needs: Need) -> None:
        """NoPermissionError naming the first of ``needs`` this caller lacks."""
        for n in needs:
            if not self.allows(n):
                e = NoPermissionError(f"user {self.access_key!r} lacks {n.describe()}")
                self.refused(e)
                raise e


current: ContextVar[Caller | None] = ContextVar("sluice_current_caller", default=None)


def current_caller() -> Caller | None:
    """The authenticated caller of the call this thread serves; None when auth is off."""
    return current.get()


def require(*needs: Need) -> None:
    """NoPermissionError unless the current caller holds every one of ``needs`` (nothing to check with auth off)."""
    caller = current.get()
    if caller is not None:
        caller.require(*needs)


def owner_of(caller: Caller | None) -> str:
    """The name a per-user table files the caller's entries under: its access key, "" with auth off."""
    return caller.access_key if caller is not None else ""
