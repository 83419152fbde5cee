"""How broker errors travel over gRPC: a status code, a message a person can act on, and the RocketMQ-style
response code in the trailing metadata key ``sluice-response-code`` so a client can rebuild the same error class.
"""

from __future__ import annotations

import grpc

from broker import errors
from broker.errors import BrokerError, ResponseCode

RESPONSE_CODE_KEY = "sluice-response-code"
# The status details travel as the ``grpc-message`` header, percent-encoded (3 bytes for any byte outside printable
# ASCII), and a receiver drops a response whose headers pass its limit (8 KiB soft, 16 KiB hard by default): the
# caller would then see RESOURCE_EXHAUSTED without the response code instead of the error. Details are cut so
# their encoded form stays within this, whatever a message repeats of the request.
MAX_DETAILS_ENCODED_BYTES = 2048

# Every code has its status: INTERNAL is SYSTEM_ERROR's alone (a broker bug), never a refusal of a bad request.
_GRPC_CODE = {
    ResponseCode.SUCCESS: grpc.StatusCode.OK,
    ResponseCode.SYSTEM_ERROR: grpc.StatusCode.INTERNAL,
    ResponseCode.SYSTEM_BUSY: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ResponseCode.TRANSACTION_FAILED: grpc.StatusCode.FAILED_PRECONDITION,
    ResponseCode.FLUSH_DISK_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    ResponseCode.SLAVE_NOT_AVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    ResponseCode.MESSAGE_ILLEGAL: grpc.StatusCode.INVALID_ARGUMENT,
    ResponseCode.SERVICE_NOT_AVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ResponseCode.VERSION_NOT_SUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ResponseCode.NO_PERMISSION: grpc.StatusCode.PERMISSION_DENIED,
    ResponseCode.TOPIC_NOT_EXIST: grpc.StatusCode.NOT_FOUND,
    ResponseCode.TOPIC_EXIST_ALREADY: grpc.StatusCode.ALREADY_EXISTS,
    ResponseCode.PULL_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ResponseCode.PULL_RETRY_IMMEDIATELY: grpc.StatusCode.UNAVAILABLE,
    ResponseCode.PULL_OFFSET_MOVED: grpc.StatusCode.OUT_OF_RANGE,
    ResponseCode.QUERY_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ResponseCode.SUBSCRIPTION_PARSE_FAILED: grpc.StatusCode.INVALID_ARGUMENT,
    ResponseCode.SUBSCRIPTION_NOT_EXIST: grpc.StatusCode.NOT_FOUND,
    ResponseCode.SUBSCRIPTION_NOT_LATEST: grpc.StatusCode.FAILED_PRECONDITION,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: grpc.StatusCode.NOT_FOUND,
    ResponseCode.CONSUMER_NOT_ONLINE: grpc.StatusCode.NOT_FOUND,
    ResponseCode.CONSUME_MSG_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    ResponseCode.NO_MESSAGE: grpc.StatusCode.NOT_FOUND,
    ResponseCode.STORE_CORRUPTED: grpc.StatusCode.DATA_LOSS,
    ResponseCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ResponseCode.INVALID_RECEIPT_HANDLE: grpc.StatusCode.FAILED_PRECONDITION,
    ResponseCode.LIMIT_EXCEEDED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    ResponseCode.NOT_ENOUGH_REPLICAS: grpc.StatusCode.UNAVAILABLE,
    ResponseCode.NOT_MASTER: grpc.StatusCode.FAILED_PRECONDITION,
    ResponseCode.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
}
assert set(_GRPC_CODE) == set(ResponseCode), "every response code needs its gRPC status"


def grpc_code_for(code: ResponseCode) -> grpc.StatusCode:
    return _GRPC_CODE[code]


def _encoded_size(char: str) -> int:
    """Bytes one character takes in the percent-encoded grpc-message header."""
    if " " <= char <= "~" and char != "%":
        return 1
    return 3 * len(char.encode("utf-8"))


def capped_details(message: str, limit: int = MAX_DETAILS_ENCODED_BYTES) -> str:
    """``message`` cut so that its percent-encoded form fits ``limit`` bytes (MAX_DETAILS_ENCODED_BYTES says why);
    a lone surrogate (which UTF-8 cannot carry) is written as its escape."""
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(message) * 12 <= limit:  # 4 UTF-8 bytes x 3: short enough whatever it holds
        return message
    tail = " ...(cut)"
    budget, used = limit - len(tail), 0
    for i, char in enumerate(message):
        used += _encoded_size(char)
        if used > budget:
            return message[:i] + tail
    return message


def _error_classes() -> dict[ResponseCode, type[BrokerError]]:
    """The most specific BrokerError subclass for each response code (first one declared wins)."""
    table: dict[ResponseCode, type[BrokerError]] = {}
    for obj in vars(errors).values():
        if isinstance(obj, type) and issubclass(obj, BrokerError) and obj is not BrokerError:
            table.setdefault(obj.code, obj)
    return table


_ERROR_CLASS = _error_classes()


# What gRPC says when a call failed because no connection could be made: the request never left the client. Any
# other UNAVAILABLE (a connection reset or closed mid-call) may have reached the broker.
_NEVER_CONNECTED = ("failed to connect", "connection refused", "dns resolution failed", "name resolution")


def never_connected(details: str) -> bool:
    lowered = details.lower()
    return any(s in lowered for s in _NEVER_CONNECTED)


# What gRPC says of a call this process cancelled itself (a future's cancel, its channel closed): the caller meant
# it. Any other CANCELLED is the broker's server ending the call unanswered (a master fenced by a partition restarts
# in place, and its server's stop cancels the calls in flight): the request may have been carried out.
_CANCELLED_HERE = ("locally cancelled", "channel closed")


def cancelled_by_server(status: grpc.StatusCode, details: str) -> bool:
    lowered = details.lower()
    return status is grpc.StatusCode.CANCELLED and not any(s in lowered for s in _CANCELLED_HERE)


def error_from_rpc(e: grpc.RpcError) -> BrokerError:
    """Rebuild the broker's error from a failed call; transport failures become SERVICE_NOT_AVAILABLE."""
    details = e.details() if isinstance(e, grpc.Call) else str(e)
    trailers = e.trailing_metadata() if isinstance(e, grpc.Call) else None
    raw_code = dict(trailers or ()).get(RESPONSE_CODE_KEY)
    if raw_code is None:
        status = e.code() if isinstance(e, grpc.Call) else grpc.StatusCode.UNKNOWN
        if status in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return errors.BrokerUnreachableError(
                f"broker unreachable or too slow ({status.name}: {details}); check the endpoint and that it runs",
                request_sent=not (status is grpc.StatusCode.UNAVAILABLE and never_connected(details or "")),
            )
        if cancelled_by_server(status, details or ""):
            return errors.BrokerUnreachableError(
                f"the broker ended the call without an answer ({status.name}: {details}; it was stopping or "
                "restarting): the request may or may not have been carried out",
                request_sent=True,
            )
        return BrokerError(f"gRPC call failed ({status.name}): {details}")
    return error_for(raw_code, details)


def error_for(raw_code: str | int, details: str) -> BrokerError:
    """The broker's error for a response code and what the broker said (a refused call's, a refused message's)."""
    try:
        code = ResponseCode(int(raw_code))
    except ValueError:
        return BrokerError(f"{details} (unknown response code {raw_code})")
    cls = _ERROR_CLASS.get(code)
    if cls is None:
        return BrokerError(details or code.name, code)
    if cls is errors.CorruptionError:
        return BrokerError(details, code)
    return cls(details or code.name)
