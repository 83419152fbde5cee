"""Raw gRPC calls for the hardening tests: requests built by hand (as a hostile or broken client would), answers
read as status, response code and details, without the client library's checks in between."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc

from broker.errors import ResponseCode
from broker.proto import sluice_pb2_grpc as pb_grpc
from broker.proto.status import MAX_DETAILS_ENCODED_BYTES, RESPONSE_CODE_KEY

CALL_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Answer:
    """How one call ended: OK with its response, or refused."""

    status: grpc.StatusCode
    code: ResponseCode | None  # the trailing sluice-response-code, None when absent
    details: str
    response: Any = None

    @property
    def ok(self) -> bool:
        return self.status == grpc.StatusCode.OK

    def refused_with(self, status: grpc.StatusCode, code: ResponseCode) -> bool:
        return self.status == status and self.code == code

    def __str__(self) -> str:
        return f"{self.status.name} {self.code.name if self.code else None}: {self.details[:300]}"


def answer(method: Callable[..., Any], request: Any, timeout_s: float = CALL_TIMEOUT_S) -> Answer:
    """Call a stub method; the outcome whatever it is (RpcError is not raised)."""
    try:
        return Answer(grpc.StatusCode.OK, None, "", method(request, timeout=timeout_s))
    except grpc.RpcError as e:
        trailers = dict(e.trailing_metadata() or ())  # type: ignore[attr-defined]
        raw = trailers.get(RESPONSE_CODE_KEY)
        code = ResponseCode(int(raw)) if raw is not None else None
        return Answer(e.code(), code, e.details() or "")  # type: ignore[attr-defined]


def clear_refusal(a: Answer) -> bool:
    """A refusal the standards accept: a Sluice response code, a status other than INTERNAL, details that fit."""
    return (
        a.code is not None
        and a.status != grpc.StatusCode.INTERNAL
        and a.code != ResponseCode.SYSTEM_ERROR
        and len(a.details.encode()) <= MAX_DETAILS_ENCODED_BYTES
    )


@contextmanager
def stub(endpoint: str) -> Iterator[pb_grpc.BrokerStub]:
    channel = grpc.insecure_channel(
        endpoint, options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    )
    try:
        yield pb_grpc.BrokerStub(channel)
    finally:
        channel.close()


def raw_method(channel: grpc.Channel, name: str) -> Callable[..., Any]:
    """A method of the Broker service that sends bytes as they are (no protobuf encoding on this side)."""
    return channel.unary_unary(
        f"/sluice.v1.Broker/{name}", request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
