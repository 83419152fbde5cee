"""Who sent a remoting request: RocketMQ 4's ACL signature (signature.py) checked against Sluice's users.

The transport (server.py) asks :meth:`Authenticator.user_of` for every request of a code it serves, on the worker
thread, before the code's processor runs; the user goes into ``RequestContext.user``, each processor runs as
that caller (message_outcomes.py ``Access.as_caller``), and the operations it translates to ask for the caller's
rights as they do for the gRPC fronts (broker/auth/operations.py). A refusal here is an
``AuthenticationError``, answered ``NO_PERMISSION`` (16, RocketMQ's ACL answer) with a remark saying what to fix;
the processor never runs, so nothing is stored or changed (a one-way request is dropped unanswered).

The rules, as the gRPC gate's (broker/auth/gate.py):

* the codes the table marks ``ANONYMOUS`` (the name server's route reads) are served without credentials;
* any other request needs ``AccessKey`` and a ``Signature`` that matches the user's secret key; an unknown or
  disabled access key and a wrong signature get the same answer (the gate's ``BAD_CREDENTIALS``), after the same
  work (an unknown key's signature is computed under a random key): a caller cannot learn which keys exist;
* ``SecurityToken`` (RocketMQ's temporary credentials) is refused: Sluice issues none, so no token can be valid;
* a code served without a declared row (admission.py ``declared_codes``) is for super users only (default deny).

Users are read from ``Accounts`` on every request: a disabled user or a rotated secret applies to the next one.
Refusals are counted in ``sluice_auth_refusals_total`` (reason ``unauthenticated``) and logged at most
``LOG_PER_SECOND`` times a second, whoever sends them.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Collection

from broker.auth.accounts import Accounts
from broker.auth.gate import BadCredentials
from broker.errors import AuthenticationError, NoPermissionError
from broker.remoting import signature
from broker.remoting.command import RemotingCommand
from broker.server.metrics import Counter

log = logging.getLogger(__name__)

LOG_PER_SECOND = 5  # refusal lines a second (a client retrying in a loop must not flood the log); all are counted
# What an unknown access key's signature is computed under, so that its answer costs what a wrong signature's does.
_NO_USER_SECRET = secrets.token_hex(16)

NO_CREDENTIALS = (
    "this server requires RocketMQ ACL credentials: sign each request with an AccessKey and its Signature "
    "(a RocketMQ client's AclClientRPCHook with the user's access key and secret key)"
)
TOKEN_REFUSED = (
    "SecurityToken (temporary credentials) is not accepted: Sluice issues none; sign with a user's access key and "
    "secret key only"
)


class Authenticator:
    def __init__(self, accounts: Accounts, anonymous_codes: Collection[int] = (), refusals: Counter | None = None,
                 declared_codes: Collection[int] | None = None) -> None:
        """``declared_codes`` None: every code's processor checks rights itself (the name server's route reads)."""
        self.accounts = accounts
        self.anonymous_codes = frozenset(anonymous_codes)
        self.declared_codes = frozenset(declared_codes) if declared_codes is not None else None
        self.refusals = refusals
        self._log_lock = threading.Lock()
        self._log_second, self._logged = 0, 0

    def user_of(self, request: RemotingCommand, peer: str) -> str | None:
        """The access key of the request's user; None for a code served without credentials. AuthenticationError
        (answered NO_PERMISSION) when the request is not signed by an enabled user."""
        if request.code in self.anonymous_codes:
            return None
        try:
            access_key = self._authenticate(request)
        except AuthenticationError as e:
            self._refused(request, peer, e)
            raise
        if self.declared_codes is not None and request.code not in self.declared_codes:
            user = self.accounts.user(access_key)
            if user is None or not user.super_user:
                if self.refusals is not None:
                    self.refusals.inc(labels=(("reason", "denied"),))
                raise NoPermissionError(
                    f"user {access_key!r} may not send request code {request.code}: no rights are declared for it "
                    "over remoting, so it is for super users only"
                )
        return access_key

    def _authenticate(self, request: RemotingCommand) -> str:
        ext = request.ext_fields
        if signature.SECURITY_TOKEN in ext:
            raise AuthenticationError(TOKEN_REFUSED)
        access_key = ext.get(signature.ACCESS_KEY, "")
        if not access_key or signature.SIGNATURE not in ext:
            raise AuthenticationError(NO_CREDENTIALS)
        user = self.accounts.user(access_key)
        secret = user.secret_key if user is not None else _NO_USER_SECRET  # computed either way: same work
        good = signature.matches(secret, ext, request.body)
        if user is None:
            raise BadCredentials(access_key, "unknown access key")
        if not user.enabled:
            raise BadCredentials(access_key, "disabled user")
        if not good:
            raise BadCredentials(access_key, "wrong signature")
        return access_key

    def _refused(self, request: RemotingCommand, peer: str, e: AuthenticationError) -> None:
        if self.refusals is not None:
            self.refusals.inc(labels=(("reason", "unauthenticated"),))
        second = int(time.monotonic())
        with self._log_lock:
            if second != self._log_second:
                self._log_second, self._logged = second, 0
            self._logged += 1
            quiet = self._logged > LOG_PER_SECOND
        if not quiet:
            cause = f" ({e.cause})" if isinstance(e, BadCredentials) else ""  # the log says what the answer does not
            log.warning("remoting request %d from %s refused (unauthenticated): %s%s", request.code, peer, e.message,
                        cause)
