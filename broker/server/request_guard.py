"""Requests whose bytes are not a valid protobuf message of their method's type.

gRPC parses a request before any handler runs; when the parser raises (corrupt wire format, a string field that is
not UTF-8, a request of another type), grpcio logs "Exception deserializing message!" with a traceback and answers
INTERNAL without a response code: a bad request reported as a broker bug. ``MalformedRequestGuard``, a server
interceptor, wraps every method's parser so that it never raises: it returns a ``MalformedRequest`` naming what was
wrong, and the handler (``service._answer``) refuses it as INVALID_ARGUMENT with its response code and one log
line, like any other bad request. Wrapping the handlers (instead of registering our own) keeps every method the
generated stubs register covered, including ones added later.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from broker.errors import InvalidArgumentError
from broker.server.handler_cache import WrappedHandlers

_MAX_REASON_CHARS = 200  # the parser's own words; what it quotes of the request is cut by the status layer too
# What a message parser raises on bytes that are not a message of its type (protobuf's own error, and what its
# pure-Python and C implementations raise on some inputs).
_PARSE_ERRORS = (DecodeError, ValueError, TypeError, OverflowError, RecursionError)


@dataclass(frozen=True, slots=True)
class MalformedRequest:
    """Stands for a request that could not be parsed; handlers refuse it (``refuse_if_malformed``)."""

    method: str
    reason: str


def refuse_if_malformed(request: object) -> None:
    """InvalidArgumentError for a request the guard could not parse; nothing for a parsed one."""
    if isinstance(request, MalformedRequest):
        raise InvalidArgumentError(
            f"{request.method}: the request is not a valid protobuf message of its type ({request.reason}); "
            "build it with the generated stubs (string fields must be UTF-8)"
        )


def _tolerant(parse: Callable[[bytes], Any], method: str) -> Callable[[bytes], Any]:
    def parse_or_mark(data: bytes) -> Any:
        try:
            return parse(data)
        except _PARSE_ERRORS as e:
            return MalformedRequest(method, f"{type(e).__name__}: {str(e)[:_MAX_REASON_CHARS]}")

    return parse_or_mark


class MalformedRequestGuard(grpc.ServerInterceptor):
    """Gives each method handler a parser that returns MalformedRequest instead of raising (module docstring)."""

    def __init__(self) -> None:
        self._wrapped = WrappedHandlers()  # each method's handler with the tolerant parser, made once

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method
        text = method.decode("ascii", "replace") if isinstance(method, bytes) else str(method)
        name = text.rsplit("/", 1)[-1]
        return self._wrapped.get(
            text, handler, lambda h: h._replace(request_deserializer=_tolerant(h.request_deserializer, name))
        )
