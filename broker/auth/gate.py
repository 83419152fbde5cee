"""Who is calling and whether they may: a gRPC server interceptor in front of every service of the client port.

Each call is authenticated first, from its metadata alone, before its body is parsed (below):

* an ``authorization`` header (format/signature.py): ``x-mq-date-time`` must be inside the window, the access key must
  name an enabled user, the signature must match; any failure is UNAUTHENTICATED, never saying what the secret or
  the expected signature is. An unknown or disabled access key and a wrong signature get the same answer
  (``BAD_CREDENTIALS``), in about the same time (the signature is computed for an unknown key too, under a random
  key): a caller cannot learn which access keys exist. The broker's log says which it was;
* else, when mutual TLS is required (so the certificate was verified), a client certificate whose common name or a
  subject alternative name is an enabled user's access key;
* else UNAUTHENTICATED: nothing anonymous passes once authentication is on, except the methods the requirement
  table declares ``ANONYMOUS`` (a name server's route reads).

Then the gate hands the caller to the call: it leaves it in ``caller.current`` (caller.py), and each operation the
call does asks for the caller's rights on the objects it touches, after resolving them and before it changes
anything (operations.py, decided by policy.py on the user's entries and the caller's address): the gate does not
read what a request names, so no protocol front decides a right on its own reading of a request. The gate decides
only what needs no request: the methods the requirement table (requirements.py) reserves for super users, and
those it has no row for (default deny). A refusal is PERMISSION_DENIED (or, in RocketMQ 5's answers, FORBIDDEN)
naming the first missing right. Both refusals carry their response code (UNAUTHENTICATED, NO_PERMISSION) like
every other error, are counted in ``sluice_auth_refusals_total`` by reason, and are logged at most
``LOG_PER_SECOND`` times a second per access key (a client retrying in a loop must not flood the log).

Nothing is cached across calls: a user's entries are read from ``Accounts`` on each call (dictionary lookups), so
a revocation or a disabled user applies to the next request. The cost per call is two HMAC-SHA1 (before the body
and with it, below) and a scan of the user's entries by the operation; bench/security.py measures one of each. A
SendStream or PullStream is authenticated when it opens, and each of its requests is admitted as its unary call
is, its signature checked again but not its date-time (server/call_streams.py).
A stream counts against its user's share of the held worker threads while it is open (held_streams.py).

Before the body: gRPC hands a server interceptor the method and the metadata of a call before it reads the request
(``intercept_service``), so the signature is checked there, and a call that fails gets a handler that refuses it
without parsing its body (the bytes are read, never decoded): an unauthenticated caller reaches no protobuf parser
of the broker. A call that passes is checked again by the wrapped handler (a second HMAC, a few microseconds: the
handler must not rely on having been reached through this one path).
Two cases are decided in the wrapped handler only: a call with no header under mutual TLS (the client
certificate's names are in the servicer context, which an interceptor does not get), and each request of a
SendStream or PullStream (server/call_streams.py resolves those handlers once, for every request to come).

A request that could not be parsed (request_guard.py) is authenticated and then passed to its handler, which
refuses it as INVALID_ARGUMENT: it reaches no operation, and changes nothing.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from broker.auth.accounts import Accounts, User
from broker.auth.caller import Caller, current
from broker.auth.held_streams import HELD_ANSWER_STREAMS, UserStreams
from broker.auth.requirements import Requirement, is_anonymous, is_super_only, requirement_of
from broker.errors import AuthenticationError, BrokerError, NoPermissionError
from broker.format.signature import (
    AUTHORIZATION_HEADER,
    DATE_TIME_HEADER,
    check_date_time,
    parse_header,
    signature_matches,
)
from broker.proto.status import RESPONSE_CODE_KEY, capped_details, grpc_code_for
from broker.server.call_streams import StreamCallContext, StreamRequestDetails
from broker.server.handler_cache import WrappedHandlers
from broker.server.metrics import Counter

log = logging.getLogger(__name__)

LOG_PER_SECOND = 5  # refusals logged per access key per second; the rest are only counted
# The one answer to an unknown access key, a disabled user and a wrong signature (module docstring).
BAD_CREDENTIALS = (
    "access key {key!r} is unknown or disabled, or the signature is wrong: check the access key and the secret key"
)
# What an unknown access key's signature is computed under, so that its answer takes as long as a wrong signature's:
# random, so that no signature matches it.
_NO_USER_SECRET = secrets.token_hex(16)


class BadCredentials(AuthenticationError):
    """``BAD_CREDENTIALS``; ``cause`` (which of the three it was) goes to the broker's log, never to the caller."""

    def __init__(self, access_key: str, cause: str) -> None:
        super().__init__(BAD_CREDENTIALS.format(key=access_key))
        self.cause = cause


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
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
                 streams: UserStreams | None = None) -> None:
        """``streams``: the per-user count of open streams (held_streams.py); None counts nothing."""
        self.accounts = accounts
        self.streams = streams
        self.settings = settings
        self.refusals = refusals
        self.clock = clock
        self._log = _RefusalLog()
        self._wrapped = WrappedHandlers()

    # ------------------------------------------------------------------------------------------ the checks
    def authenticate(self, metadata: dict[str, str], context: grpc.ServicerContext | None) -> User:
        """The caller's user; AuthenticationError when there is none. ``context`` None: from the headers alone,
        before the body is read (``intercept_service``)."""
        header = metadata.get(AUTHORIZATION_HEADER)
        if header is not None:
            signed = parse_header(header)
            date_time = metadata.get(DATE_TIME_HEADER)
            if not isinstance(context, StreamCallContext):  # a stream's requests: its window was checked at its open
                check_date_time(date_time, self.clock(), self.settings.window_s)
            if date_time is None:
                raise AuthenticationError(f"the {DATE_TIME_HEADER} header is missing")
            user = self.accounts.user(signed.access_key)
            secret = user.secret_key if user is not None else _NO_USER_SECRET  # computed either way: same timing
            matches = signature_matches(secret, date_time, signed.signature_hex)
            if user is None:
                raise BadCredentials(signed.access_key, "unknown access key")
            if not user.enabled:
                raise BadCredentials(signed.access_key, "disabled user")
            if not matches:
                raise BadCredentials(signed.access_key, "wrong signature")
            return user
        if self.settings.certificate_names_user and context is not None:
            auth = context.auth_context()
            for name in (*auth.get("x509_common_name", ()), *auth.get("x509_subject_alternative_name", ())):
                user = self.accounts.user(name.decode("utf-8", "replace"))
                if user is not None and user.enabled:
                    return user
        raise AuthenticationError(
            "this broker requires credentials: give an access key and secret key (or, under mutual TLS, a client "
            "certificate that names a user)"
        )

    @staticmethod
    def authorize(user: User, method: str, requirement: Requirement | None) -> None:
        """What the gate decides itself: the methods for super users only, and those without a row (default deny).
        Every other right is asked by the operations the call does (module docstring)."""
        if not user.super_user and is_super_only(requirement):
            raise NoPermissionError(
                f"user {user.access_key!r} may not call {method.rsplit('/', 1)[-1]}: super users only"
            )

    def _refuse(self, e: BrokerError, context: grpc.ServicerContext, who: str, method: str) -> None:
        reason = "unauthenticated" if isinstance(e, AuthenticationError) else "denied"
        self.refusals.inc(labels=(("reason", reason),))
        cause = f" ({e.cause})" if isinstance(e, BadCredentials) else ""  # the log tells apart what the answer does not
        self._log.warn(who, f"{method} refused ({reason}) for {who} from {context.peer()}: {e.message}{cause}")
        context.set_trailing_metadata(((RESPONSE_CODE_KEY, str(int(e.code))),))
        context.abort(grpc_code_for(e.code), capped_details(e.message))

    def _admit(self, method: str, context: grpc.ServicerContext) -> Caller | None:
        """The caller, authenticated and authorized for ``method``; None for an anonymous method. Aborts the call
        (raises) when refused."""
        requirement = requirement_of(method)
        if is_anonymous(requirement):
            return None
        metadata = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
        who = "an anonymous caller"
        try:
            user = self.authenticate(metadata, context)
            who = f"user {user.access_key!r}"
            self.authorize(user, method, requirement)
        except BrokerError as e:  # AuthenticationError, NoPermissionError
            if who == "an anonymous caller":
                who = _caller(metadata)
            self._refuse(e, context, who, method.rsplit("/", 1)[-1])
            raise  # not reached: abort raised
        return Caller(user.access_key, source_address(context.peer()), self.accounts,
                      lambda e: self._refused_inside(e, context, user.access_key, method))

    def _refused_inside(self, e: NoPermissionError, context: grpc.ServicerContext, key: str, method: str) -> None:
        """A refusal decided by a handler (caller.py): counted and logged as the gate's own are."""
        self.refusals.inc(labels=(("reason", "denied"),))
        rpc = method.rsplit("/", 1)[-1]
        self._log.warn(key, f"{rpc} refused (denied) for user {key!r} from {context.peer()}: {e.message}")

    def _hold_stream(self, caller: Caller | None, method: str, context: grpc.ServicerContext) -> Callable[[], None]:
        """Count the stream against its user's share of the held workers (held_streams.py); aborts past it."""
        if self.streams is None or caller is None:
            return _nothing
        user = self.accounts.user(caller.access_key)
        if user is not None and user.super_user:
            return _nothing
        try:
            return self.streams.hold(caller.access_key)
        except BrokerError as e:
            self._refuse(e, context, f"user {caller.access_key!r}", method.rsplit("/", 1)[-1])
            raise  # not reached: abort raised

    # ------------------------------------------------------------------------------------------ wrapping
    def intercept_service(self, continuation: Callable[[Any], Any], details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        wrapped = self._wrapped.get(details.method, handler, lambda h: self._wrap(details.method, h))
        if isinstance(details, StreamRequestDetails):  # no call yet: each request is checked by the wrapped handler
            return wrapped
        refusal = self._refusal_before_parse(details.method, details.invocation_metadata)
        return wrapped if refusal is None else self._refusing(handler, details.method, *refusal)

    def _refusal_before_parse(self, method: str, invocation_metadata: Any) -> tuple[AuthenticationError, str] | None:
        """Why a call must be refused from its headers alone, and who made it; None when it passes, or when only
        its handler can tell (module docstring)."""
        if is_anonymous(requirement_of(method)):
            return None
        metadata = {k: v for k, v in invocation_metadata or () if isinstance(v, str)}
        if AUTHORIZATION_HEADER not in metadata and self.settings.certificate_names_user:
            return None  # the client certificate is in the servicer context only
        try:
            self.authenticate(metadata, None)
        except AuthenticationError as e:
            return e, _caller(metadata)
        return None

    def _refusing(self, handler: Any, method: str, error: AuthenticationError, who: str) -> Any:
        """A handler of ``handler``'s kind that refuses the call with ``error`` and never parses its body: without a
        deserializer, gRPC hands the behaviour the bytes as they came (and the request guard in front leaves such a
        handler as it is, so a refusal does not displace the handler it keeps for the method's other calls)."""

        def refuse(_request: Any, context: grpc.ServicerContext) -> None:
            self._refuse(error, context, who, method.rsplit("/", 1)[-1])

        kind = next(k for k in ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
                    if getattr(handler, k) is not None)
        return handler._replace(request_deserializer=None, **{kind: refuse})

    def _wrap(self, method: str, handler: Any) -> Any:
        if handler.unary_unary is not None:
            inner_uu = handler.unary_unary

            def unary(request: Any, context: grpc.ServicerContext) -> Any:
                caller_token = current.set(None)  # a worker thread's last call must not lend this one its caller
                try:
                    current.set(self._admit(method, context))
                    return inner_uu(request, context)
                finally:
                    current.reset(caller_token)

            return handler._replace(unary_unary=unary)
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream

            held = method in HELD_ANSWER_STREAMS

            def unary_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                current.set(None)
                try:
                    caller = self._admit(method, context)
                    current.set(caller)
                    release = self._hold_stream(caller, method, context) if held else _nothing
                    try:
                        yield from inner_us(request, context)
                    finally:
                        release()
                finally:
                    current.set(None)  # not reset: a generator may be closed on another thread than its own

            return handler._replace(unary_stream=unary_stream)
        if handler.stream_stream is not None:
            inner_ss = handler.stream_stream

            def stream_stream(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
                current.set(None)
                try:
                    caller = self._admit(method, context)
                    current.set(caller)
                    release = self._hold_stream(caller, method, context)
                    try:
                        yield from inner_ss(requests, context)
                    finally:
                        release()
                finally:
                    current.set(None)

            return handler._replace(stream_stream=stream_stream)
        inner_su = handler.stream_unary

        def stream_unary(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            caller_token = current.set(None)
            try:
                caller = self._admit(method, context)
                current.set(caller)
                release = self._hold_stream(caller, method, context)
                try:
                    return inner_su(requests, context)
                finally:
                    release()
            finally:
                current.reset(caller_token)

        return handler._replace(stream_unary=stream_unary)


def _nothing() -> None:
    return None


def _caller(metadata: dict[str, str]) -> str:
    """Who a refused call was, for the log: the access key its header names, if any."""
    if AUTHORIZATION_HEADER not in metadata:
        return "an anonymous caller"
    try:
        return f"access key {parse_header(metadata[AUTHORIZATION_HEADER]).access_key!r}"
    except AuthenticationError:
        return "a caller with a malformed authorization header"
