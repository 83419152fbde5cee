"""The credential options of the source and the sink: ``accessKey`` and ``secretKey``, a user of brokers that run
with authentication (broker/auth, docs/security.md). Both or neither; without them the query's calls are anonymous.

Every call the driver and the executors make is signed with them (broker/client/credentials.py), so they travel
inside the options Spark pickles for each task. The secret is kept out of everything that is printed: the options'
repr hides it (``field(repr=False)``), no error quotes it, and Spark's own redaction (``spark.redaction.regex``,
whose default ``(?i)secret|password|token|access[.]?key`` matches both option names) hides both values wherever
Spark shows a relation's options (``explain``, the SQL tab, the event log). A broker's refusal reaches the user
with its response code, the user it refused and the rights this query needs (``refusals_explained``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Concatenate, ParamSpec, Protocol, TypedDict, TypeVar

from broker.client.credentials import Credentials
from broker.errors import AuthenticationError, InvalidArgumentError, NoPermissionError
from broker.format.signature import validate_access_key, validate_secret_key
from connector.connector_errors import CredentialsRefusedError, RightsMissingError, SourceOptionError

AUTH_OPTIONS = ("accessKey", "secretKey")
P = ParamSpec("P")
R = TypeVar("R")


class AuthArgs(TypedDict):
    """The keyword arguments every client takes (``Producer(..., **args)``)."""

    access_key: str | None
    secret_key: str | None


@dataclass(frozen=True, slots=True)
class AuthKeys:
    access_key: str = ""
    secret_key: str = field(default="", repr=False)

    @property
    def given(self) -> bool:
        return bool(self.access_key)

    def credentials(self) -> Credentials | None:
        return Credentials.of(self.access_key, self.secret_key)

    def client_args(self) -> AuthArgs:
        return AuthArgs(access_key=self.access_key or None, secret_key=self.secret_key or None)


ANONYMOUS = AuthKeys()  # no credentials: calls carry no signature


def parse_auth_options(opts: Mapping[str, str]) -> AuthKeys:
    """From options keyed in lower case; SourceOptionError naming the option, never quoting the secret."""
    access_key = opts.get("accesskey", "").strip()
    secret_key = opts.get("secretkey", "")  # a secret is any string: spaces included
    if not access_key and not secret_key:
        return ANONYMOUS
    if not (access_key and secret_key):
        raise SourceOptionError(
            "options 'accessKey' and 'secretKey' go together: give both (a user of the brokers) or neither"
        )
    try:
        validate_access_key(access_key)
    except InvalidArgumentError as e:
        raise SourceOptionError(f"option 'accessKey': {e.message}") from None
    try:
        validate_secret_key(secret_key)
    except InvalidArgumentError as e:
        raise SourceOptionError(f"option 'secretKey': {e.message}") from None
    return AuthKeys(access_key, secret_key)


class NeedsRights(Protocol):
    """Options that say who the query is and what rights it needs (the source's and the sink's)."""

    @property
    def auth(self) -> AuthKeys: ...

    def rights_needed(self) -> str: ...


def explained(
    e: AuthenticationError | NoPermissionError, opts: NeedsRights
) -> CredentialsRefusedError | RightsMissingError:
    """``e`` with what the user can do about it: which options to check, which rights to grant."""
    if isinstance(e, AuthenticationError):
        if opts.auth.given:
            return CredentialsRefusedError(
                f"the broker refused access key {opts.auth.access_key!r} of option 'accessKey' "
                f"({e.code.name}): {e.message}. Check the options 'accessKey' and 'secretKey'"
            )
        return CredentialsRefusedError(
            f"the broker refused an anonymous call ({e.code.name}): {e.message}. Give the options 'accessKey' and "
            "'secretKey' of a user of the brokers"
        )
    who = f"access key {opts.auth.access_key!r}" if opts.auth.given else "an anonymous call"
    return RightsMissingError(f"the broker refused {who} ({e.code.name}): {e.message}. {opts.rights_needed()}")


@contextmanager
def refusals_explained(opts: NeedsRights) -> Iterator[None]:
    """Re-raise a broker's UNAUTHENTICATED or NO_PERMISSION refusal as ``explained`` says (once: an explained
    refusal passes through an outer block as it is)."""
    try:
        yield
    except (CredentialsRefusedError, RightsMissingError):
        raise
    except (AuthenticationError, NoPermissionError) as e:
        raise explained(e, opts) from None


class WithOptions(Protocol):
    """A reader or writer Spark calls: its ``options`` say who the query is."""

    @property
    def options(self) -> NeedsRights: ...


S = TypeVar("S", bound=WithOptions)


def explains_refusals(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """A method Spark calls, whose refusals reach the user explained (``refusals_explained``). Not for a method that
    returns an iterator: its calls happen after it returned (read_partition has its own block)."""

    @functools.wraps(method)
    def wrapper(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with refusals_explained(self.options):
            return method(self, *args, **kwargs)

    return wrapper
