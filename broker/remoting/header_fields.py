"""Reading a request's ``extFields`` (RocketMQ's custom header): every value is a string on the wire, and each
request code's processor parses the ones it reads. A required field that is missing or does not parse is an
``InvalidArgumentError`` naming it (answered ``INVALID_PARAMETER``), as RocketMQ refuses a header lacking a
``@CFNotNull`` field before its processor runs.
"""

from __future__ import annotations

from broker.errors import InvalidArgumentError
from broker.remoting.command import RemotingCommand

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def text(request: RemotingCommand, name: str) -> str:
    value = request.ext_fields.get(name)
    if value is None or value == "":
        raise InvalidArgumentError(f"request code {request.code}: header field {name!r} is required")
    return value


def optional_text(request: RemotingCommand, name: str, default: str = "") -> str:
    return request.ext_fields.get(name) or default


def _number(request: RemotingCommand, name: str, low: int, high: int) -> int:
    raw = text(request, name)
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgumentError(f"request code {request.code}: header field {name!r} is not a number") from None
    if not low <= value <= high:
        raise InvalidArgumentError(f"request code {request.code}: header field {name!r} is out of range")
    return value


def int32(request: RemotingCommand, name: str) -> int:
    return _number(request, name, INT32_MIN, INT32_MAX)


def int64(request: RemotingCommand, name: str) -> int:
    return _number(request, name, INT64_MIN, INT64_MAX)


def boolean(request: RemotingCommand, name: str, default: bool = False) -> bool:
    """Java's ``Boolean.parseBoolean``: "true" in any case is true, anything else false."""
    raw = request.ext_fields.get(name)
    return default if raw is None else raw.lower() == "true"
