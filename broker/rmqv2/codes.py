"""Sluice's errors as the protocol's statuses: every response carries ``Status{code, message}``.

RocketMQ 5 clients act on the code (BAD_REQUEST family: not retried; TOO_MANY_REQUESTS: back off; NOT_FOUND:
refresh the route), so each BrokerError class and response code maps to the code the RocketMQ proxy answers for
the same fault. Anything unexpected is INTERNAL_SERVER_ERROR with the reason, never a bare gRPC failure.
"""

from __future__ import annotations

from rocketmq.grpc_protocol import definition_pb2 as v2

from broker.errors import BrokerError, ResponseCode
from broker.semantics.pop import InvisibleTimeError
from broker.semantics.timer import TimerDelayError

Code = v2.Code

# Most specific first: subclasses before the response code of their base.
_BY_CLASS: tuple[tuple[type[BrokerError], int], ...] = (
    (InvisibleTimeError, Code.ILLEGAL_INVISIBLE_TIME),
    (TimerDelayError, Code.ILLEGAL_DELIVERY_TIME),
)
_BY_CODE: dict[ResponseCode, int] = {
    ResponseCode.SYSTEM_BUSY: Code.TOO_MANY_REQUESTS,
    ResponseCode.MESSAGE_ILLEGAL: Code.MESSAGE_CORRUPTED,
    ResponseCode.INVALID_ARGUMENT: Code.BAD_REQUEST,
    ResponseCode.SERVICE_NOT_AVAILABLE: Code.INTERNAL_SERVER_ERROR,
    ResponseCode.FLUSH_DISK_TIMEOUT: Code.MASTER_PERSISTENCE_TIMEOUT,
    ResponseCode.NO_PERMISSION: Code.FORBIDDEN,
    ResponseCode.TOPIC_NOT_EXIST: Code.TOPIC_NOT_FOUND,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: Code.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.SUBSCRIPTION_PARSE_FAILED: Code.ILLEGAL_FILTER_EXPRESSION,
    ResponseCode.QUERY_NOT_FOUND: Code.NOT_FOUND,
    ResponseCode.INVALID_RECEIPT_HANDLE: Code.INVALID_RECEIPT_HANDLE,
    ResponseCode.STORE_CORRUPTED: Code.INTERNAL_SERVER_ERROR,
    ResponseCode.TRANSACTION_FAILED: Code.INVALID_TRANSACTION_ID,
}


def code_for(e: BrokerError) -> int:
    for cls, code in _BY_CLASS:
        if isinstance(e, cls):
            return code
    return _BY_CODE.get(e.code, Code.INTERNAL_SERVER_ERROR)


def status(code: int = Code.OK, message: str = "") -> v2.Status:
    return v2.Status(code=code, message=message or v2.Code.Name(code))


def error_status(e: BrokerError) -> v2.Status:
    return status(code_for(e), e.message)


class ProtocolError(BrokerError):
    """A request the protocol itself refuses, with the protocol's code (no client id, a missing field...)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message, ResponseCode.INVALID_ARGUMENT)
        self.v2_code = code


def status_of(e: BrokerError) -> v2.Status:
    if isinstance(e, ProtocolError):
        return status(e.v2_code, e.message)
    return error_status(e)
