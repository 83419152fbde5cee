"""What the message processors share: reading typed header fields, answering every outcome with RocketMQ's code, and
deciding the caller's rights through the same table and checks as every other front.

**Codes.** Sluice's ``ResponseCode`` is RocketMQ's numbering (broker/errors.py), so a refusal answers its own code;
the codes only Sluice has are answered with the one a 4.x client acts on the same way:

| Sluice outcome                | remoting answer            | why                                                 |
|-------------------------------|----------------------------|-----------------------------------------------------|
| INVALID_ARGUMENT (a send)     | MESSAGE_ILLEGAL (13)       | the client does not retry what cannot be stored     |
| INVALID_ARGUMENT (otherwise)  | SYSTEM_ERROR (1)           | as RocketMQ answers a header it cannot use          |
| LIMIT_EXCEEDED                | SYSTEM_ERROR (1)           | a producer retries another broker, which has room   |
| NOT_ENOUGH_REPLICAS           | SYSTEM_ERROR (1)           | RocketMQ 5's in-sync replicas refusal: not stored   |
| NOT_MASTER                    | SERVICE_NOT_AVAILABLE (14) | as a RocketMQ slave answers a send                  |
| UNAUTHENTICATED               | NO_PERMISSION (16)         | RocketMQ's ACL answers both with it                 |
| STORE_CORRUPTED, others > 900 | SYSTEM_ERROR (1)           |                                                     |
| an I/O error (OSError)        | SERVICE_NOT_AVAILABLE (14) | the disk, not the request: retry later or elsewhere |
| any other exception           | SYSTEM_ERROR (1), logged   | the last line: the broker keeps serving             |

**Rights.** A processor runs its work ``as_caller(...)``: with auth off nothing is decided; with auth on the caller
is the user the transport authenticated (``RequestContext.user``; none: refused NO_PERMISSION), set as the running
call's caller (broker/auth/caller.py). The operations the processor translates to (broker/server's processors)
then ask for the caller's rights on what they touch, as they do for every other front.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from broker.auth.accounts import Accounts
from broker.auth.caller import Caller, current
from broker.errors import (
    BrokerError,
    InvalidArgumentError,
    NoPermissionError,
    ResponseCode,
    ServiceNotAvailableError,
    shown,
)
from broker.remoting.command import RemotingCommand
from broker.remoting.processor import RequestContext
from broker.server.metrics import Counter

if TYPE_CHECKING:
    from broker.server.broker_controller import BrokerController

log = logging.getLogger(__name__)

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
# RocketMQ's remark is a header string: a refusal's text is cut to this many characters so that an echo of a long
# request value never makes the frame large.
MAX_REMARK_CHARS = 1024

_RENAMED = {
    ResponseCode.LIMIT_EXCEEDED: ResponseCode.SYSTEM_ERROR,
    ResponseCode.NOT_ENOUGH_REPLICAS: ResponseCode.SYSTEM_ERROR,
    ResponseCode.NOT_MASTER: ResponseCode.SERVICE_NOT_AVAILABLE,
    ResponseCode.UNAUTHENTICATED: ResponseCode.NO_PERMISSION,
}


# ------------------------------------------------------------------------------------------------- header fields


def text_field(ext: Mapping[str, str], name: str, default: str | None = None) -> str:
    """A string field; a required one (no default) that is missing or empty is refused, as RocketMQ's header decoder
    refuses a missing not-null field (an empty value reads as absent in its binary header)."""
    value = ext.get(name)
    if value is None or value == "":
        if default is None:
            raise InvalidArgumentError(f"the request lacks its {name!r} header field")
        return default
    return value


def int_field(ext: Mapping[str, str], name: str, default: int | None = None, bounds: tuple[int, int] = INT32) -> int:
    """An int32 (or, with ``bounds=INT64``, an int64) field written in decimal."""
    raw = ext.get(name)
    if raw is None or raw == "":
        if default is None:
            raise InvalidArgumentError(f"the request lacks its {name!r} header field")
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise InvalidArgumentError(f"header field {name!r}={shown(raw)} is not an integer") from None
    if not bounds[0] <= value <= bounds[1]:
        raise InvalidArgumentError(f"header field {name!r}={shown(raw)} is out of range")
    return value


def bool_field(ext: Mapping[str, str], name: str) -> bool:
    """Java's ``Boolean.parseBoolean``: "true" in any case is true, anything else (or nothing) false."""
    return ext.get(name, "").strip().lower() == "true"


# ------------------------------------------------------------------------------------------------- outcomes


def code_of(e: BrokerError, invalid: ResponseCode = ResponseCode.SYSTEM_ERROR) -> ResponseCode:
    """The remoting code a refusal is answered with (module docstring); ``invalid``: INVALID_ARGUMENT's."""
    if e.code is ResponseCode.INVALID_ARGUMENT:
        return invalid
    if e.code in _RENAMED:
        return _RENAMED[e.code]
    return e.code if e.code < ResponseCode.STORE_CORRUPTED else ResponseCode.SYSTEM_ERROR


def refusal(request: RemotingCommand, e: BrokerError, invalid: ResponseCode = ResponseCode.SYSTEM_ERROR,
            ext_fields: dict[str, str] | None = None) -> RemotingCommand:
    """The answer to a refused request: its code and the reason as the remark."""
    code = code_of(e, invalid)
    log.info("remoting request %d refused: %s (%s)", request.code, e.message[:200], code.name)
    return request.response(int(code), remark=e.message[:MAX_REMARK_CHARS], ext_fields=ext_fields)


def failure(request: RemotingCommand, e: Exception) -> RemotingCommand:
    """The answer when the broker itself failed a request (not the request's fault)."""
    if isinstance(e, OSError):
        log.error("remoting request %d failed on an I/O error: %s", request.code, e)
        remark = ServiceNotAvailableError.files_failed(e).message[:MAX_REMARK_CHARS]
        return request.response(int(ResponseCode.SERVICE_NOT_AVAILABLE), remark=remark)
    log.exception("remoting request %d failed unexpectedly", request.code)
    return request.response(int(ResponseCode.SYSTEM_ERROR),
                            remark=f"internal broker error ({type(e).__name__}); see the broker's log")


# ------------------------------------------------------------------------------------------------- rights


def _source(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    host = address.rpartition(":")[0].strip("[]") or address
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


class Access:
    """Rights of remoting callers: ``accounts`` None means auth is off (every request passes, as over gRPC).
    ``refusals``: the broker's ``sluice_auth_refusals_total``, counting each refusal (reason ``denied``) as the
    gRPC gate counts its own."""

    def __init__(self, accounts: Accounts | None, refusals: Counter | None = None) -> None:
        self.accounts = accounts
        self.refusals = refusals

    def _refused(self, e: NoPermissionError) -> None:
        if self.refusals is not None:
            self.refusals.inc(labels=(("reason", "denied"),))

    @classmethod
    def of(cls, controller: BrokerController) -> Access:
        """The rights of a broker's remoting callers: its accounts when auth is on, its refusal counter."""
        return cls(controller.accounts if controller.config.auth_enabled else None, controller.metrics.auth_refusals)

    def caller(self, context: RequestContext) -> Caller | None:
        if self.accounts is None:
            return None
        if context.user is None:
            raise NoPermissionError(
                "this broker requires authentication: sign requests with an AccessKey and its Signature"
            )
        return Caller(context.user, _source(context.peer.address), self.accounts, refused=self._refused)

    @contextmanager
    def as_caller(self, context: RequestContext) -> Iterator[Caller | None]:
        """The work inside runs as the request's caller (NoPermissionError when auth is on and the request was not
        signed: nothing done). Each operation asks for its own rights (broker/auth/operations.py)."""
        caller = self.caller(context)
        token = current.set(caller)
        try:
            yield caller
        finally:
            current.reset(token)
