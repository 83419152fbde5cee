"""Who is calling and whether they may: a gRPC server interceptor in front of every service of the client port.

Each call is authenticated first, from its metadata alone:

* an ``authorization`` header (signature.py): the access key must name an enabled user, the ``x-mq-date-time``
  must be inside the window, the signature must match; any failure is UNAUTHENTICATED, saying which check failed
  and never what the secret or the expected signature is;
* else, when mutual TLS is required (so the certificate was verified), a client certificate whose common name or a
  subject alternative name is an enabled user's access key;
* else UNAUTHENTICATED: nothing anonymous passes once authentication is on, except the methods the requirement
  table declares ``ANONYMOUS`` (a name server's route reads).

Then authorized: super users pass; anyone else needs every right the method's row (requirements.py) names for
this request, decided by policy.py on the user's entries and the caller's address. The operations a row marks
resolved (ending or joining a transaction, a send-back) are decided later by the operation on what it found
(operations.py): the gate leaves the caller for them in ``operations.current``. A refusal is
PERMISSION_DENIED naming the first missing right. Both refusals carry their response code (UNAUTHENTICATED,
NO_PERMISSION) like every other error, are counted in ``sluice_auth_refusals_total`` by reason, and are logged at
most ``LOG_PER_SECOND`` times a second per access key (a client retrying in a loop must not flood the log).

Nothing is cached across calls: a user's entries are read from ``Accounts`` on each call (dictionary lookups), so
a revocation or a disabled user applies to the next request. The cost per call is one HMAC-SHA1 and a scan of the
user's entries; measured in bench/security.py. A SendBatch's topics are decided where the batch is parsed
(operations.py's PUBLISH_BATCH). A SendStream or PullStream is authenticated when it opens, and each of its requests
is admitted as its unary call is, its signature checked again but not its date-time (server/call_stream.py).

A request that could not be parsed (request_guard.py) is authenticated and then passed to its handler, which
refuses it as INVALID_ARGUMENT: its rights cannot be read from it, and it changes nothing.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from broker.auth import operations
from broker.auth.accounts import Accounts, User
from broker.auth.requirements import (
    Lookup,
    Requirement,
    is_anonymous,
    is_super_only,
    requirement_of,
)
from broker.auth.signature import (
    AUTHORIZATION_HEADER,
    DATE_TIME_HEADER,
    check_date_time,
    parse_header,
    signature_matches,
)
from broker.errors import AuthenticationError, BrokerError, NoPermissionError
from broker.proto.status import RESPONSE_CODE_KEY, capped_details, grpc_code_for
from broker.server.call_stream import StreamCallContext
from broker.server.handler_cache import WrappedHandlers
from broker.server.metrics import Counter
from broker.server.request_guard import MalformedRequest

log = logging.getLogger(__name__)

LOG_PER_SECOND = 5  # refusals logged per access key per second; the rest are only counted


class _NoLookup:
    def transaction_group(self, txn_id: str, half_commitlog_offset: int | None) -> str | None:
        return None

    def message_topic(self, msg_id: str) -> str | None:
        return None


@dataclass(frozen=True, slots=True)
class AuthSettings:
    window_s: float
    certificate_names_user: bool  # mutual TLS is required, so a client certificate is a verified identity


Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def source_address(peer: str) -> Address | None:
    """The address of gRPC's ``context.peer()`` (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``); None for other transports."""
    kind, _, rest = peer.partition(":")
    host = rest.rsplit(":", 1)[0].strip("[]") if kind in ("ipv4", "ipv6") else ""
    try:
        return ipaddress.ip_address(host) if host else None
    except ValueError:
        return None


class _RefusalLog:
    """At most LOG_PER_SECOND lines per access key per second."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[int, int]] = {}  # key -> (second, lines logged in it)

    def warn(self, key: str, message: str) -> None:
        second = int(time.monotonic())
        with self._lock:
            at, count = self._seen.get(key, (second, 0))
            count = count + 1 if at == second else 1
            if len(self._seen) > 10_000:  # keys made up by a scanner: forget them rather than grow
                self._seen.clear()
            self._seen[key] = (second, count)
        if count <= LOG_PER_SECOND:
            log.warning("%s", message)


class AuthGate(grpc.ServerInterceptor):
    """Authentication and authorization of every call (module docstring)."""

    def __init__(self, accounts: Accounts, settings: AuthSettings, refusals: Counter,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:  # fmt: skip
        self.accounts = accounts
        self.settings = settings
        self.refusals = refusals
        self.clock = clock
        self.lookup: Lookup = _NoLookup()  # the broker's, once its store runs
        self._log = _RefusalLog()
        self._wrapped = WrappedHandlers()

    # ------------------------------------------------------------------------------------------ the checks
    def authenticate(self, metadata: dict[str, str], context: grpc.ServicerContext) -> User:
        header = metadata.get(AUTHORIZATION_HEADER)
        if header is not None:
            signed = parse_header(header)
            user = self.accounts.user(signed.access_key)
            if user is None or not user.enabled:
                raise AuthenticationError(f"access key {signed.access_key!r} is unknown or disabled")
            date_time = metadata.get(DATE_TIME_HEADER)
            if not isinstance(context, StreamCallContext):  # a stream's requests: its window was checked at its open
                check_date_time(date_time, self.clock(), self.settings.window_s)
            if date_time is None:
                raise AuthenticationError(f"the {DATE_TIME_HEADER} header is missing")
            if not signature_matches(user.secret_key, date_time, signed.signature_hex):
                raise AuthenticationError(f"wrong signature for access key {signed.access_key!r}; check the secret key")
            return user
        if self.settings.certificate_names_user:
            auth = context.auth_context()
            for name in (*auth.get("x509_common_name", ()), *auth.get("x509_subject_alternative_name", ())):
                user = self.accounts.user(name.decode("utf-8", "replace"))
                if user is not None and user.enabled:
                    return user
        raise AuthenticationError(
            "this broker requires credentials: give an access key and secret key (or, under mutual TLS, a client "
            "certificate that names a user)"
        )

    def authorize(self, user: User, method: str, requirement: Requirement | None, request: Any,
                  context: grpc.ServicerContext) -> None:  # fmt: skip
        if user.super_user:
            return
        if is_super_only(requirement):
            raise NoPermissionError(
                f"user {user.access_key!r} may not call {method.rsplit('/', 1)[-1]}: super users only"
            )
        if isinstance(request, MalformedRequest):
            return  # refused by its handler (module docstring)
        assert requirement is not None
        source = source_address(context.peer())
        entries = self.accounts.entries(user.access_key)
        caller = operations.Caller(user.access_key, entries, source, self._refusal_counter(user, method, context))
        gate_needs = getattr(requirement, "gate_needs", requirement)  # a Row's resolved operations come later
        operations.check(caller, gate_needs(request, self.lookup))
        operations.current.set(caller)  # for the operations that decide on what they resolve (operations.py)

    def _refusal_counter(self, user: User, method: str, context: grpc.ServicerContext
                         ) -> Callable[[NoPermissionError], None]:  # fmt: skip
        """How an operation's own refusal (operations.authorize) is counted and logged, as the gate's are."""

        def refused(e: NoPermissionError) -> None:
            self.refusals.inc(labels=(("reason", "denied"),))
            rpc = method.rsplit("/", 1)[-1]
            self._log.warn(user.access_key, f"{rpc} refused (denied) for user {user.access_key!r} from "
                                           f"{context.peer()}: {e.message}")  # fmt: skip

        return refused

    def _refuse(self, e: BrokerError, context: grpc.ServicerContext, who: str, method: str) -> None:
        reason = "unauthenticated" if isinstance(e, AuthenticationError) else "denied"
        self.refusals.inc(labels=(("reason", reason),))
        self._log.warn(who, f"{method} refused ({reason}) for {who} from {context.peer()}: {e.message}")
        context.set_trailing_metadata(((RESPONSE_CODE_KEY, str(int(e.code))),))
        context.abort(grpc_code_for(e.code), capped_details(e.message))

    def _admit(self, method: str, request: Any, context: grpc.ServicerContext) -> None:
        requirement = requirement_of(method)
        if is_anonymous(requirement):
            return
        metadata = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
        who = "an anonymous caller"
        try:
            user = self.authenticate(metadata, context)
            who = f"user {user.access_key!r}"
            self.authorize(user, method, requirement, request, context)
        except BrokerError as e:  # AuthenticationError, NoPermissionError, InvalidArgumentError from a requirement
            if who == "an anonymous caller" and AUTHORIZATION_HEADER in metadata:
                try:
                    who = f"access key {parse_header(metadata[AUTHORIZATION_HEADER]).access_key!r}"
                except AuthenticationError:
                    who = "a caller with a malformed authorization header"
            self._refuse(e, context, who, method.rsplit("/", 1)[-1])

    # ------------------------------------------------------------------------------------------ wrapping
    def intercept_service(self, continuation: Callable[[Any], Any], details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        return self._wrapped.get(details.method, handler, lambda h: self._wrap(details.method, h))

    def _wrap(self, method: str, handler: Any) -> Any:
        if handler.unary_unary is not None:
            inner_uu = handler.unary_unary

            def unary(request: Any, context: grpc.ServicerContext) -> Any:
                caller = operations.current.set(None)  # a worker thread's last call must not lend this one its caller
                try:
                    self._admit(method, request, context)
                    return inner_uu(request, context)
                finally:
                    operations.current.reset(caller)

            return handler._replace(unary_unary=unary)
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream

            def unary_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                # set, not reset by token: a generator may be closed from another thread's context
                operations.current.set(None)
                try:
                    self._admit(method, request, context)
                    yield from inner_us(request, context)
                finally:
                    operations.current.set(None)

            return handler._replace(unary_stream=unary_stream)
        inner = handler.stream_stream or handler.stream_unary
        streaming = "stream_stream" if handler.stream_stream is not None else "stream_unary"

        def from_stream(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            operations.current.set(None)
            try:
                self._admit(method, None, context)  # rights from metadata only: see the requirement of these methods
            finally:
                operations.current.set(None)  # each request of the stream is admitted as its unary call, caller too
            return inner(requests, context)

        return handler._replace(**{streaming: from_stream})
