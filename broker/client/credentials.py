"""A client's access key and secret key, and the channel interceptor that signs each call with them.

Every call carries a fresh ``x-mq-date-time`` and its ``MQv2-HMAC-SHA1`` signature (broker/format/signature.py: the
header RocketMQ 5's clients send, so the same user works for both); the broker refuses one signed more than its
window (15 minutes by default) away from its clock, so a client whose clock is off by more gets UNAUTHENTICATED
saying so. The secret never leaves this object: its repr hides it, and it is not part of any error.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from broker.errors import InvalidArgumentError
from broker.format.signature import signed_metadata, validate_access_key, validate_secret_key

ACCESS_KEY_ENV = "SLUICE_ACCESS_KEY"
SECRET_KEY_ENV = "SLUICE_SECRET_KEY"


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str = field(repr=False)
    _signed: tuple[int, tuple[tuple[str, str], tuple[str, str]]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        validate_access_key(self.access_key)
        validate_secret_key(self.secret_key)

    @staticmethod
    def of(access_key: str | None, secret_key: str | None) -> Credentials | None:
        """The credentials a client's arguments give; None when neither is given."""
        if not access_key and not secret_key:
            return None
        if not (access_key and secret_key):
            raise InvalidArgumentError("give access_key and secret_key together")
        return Credentials(access_key, secret_key)

    @staticmethod
    def from_env() -> Credentials | None:
        """From ``$SLUICE_ACCESS_KEY`` and ``$SLUICE_SECRET_KEY`` (the CLI's)."""
        return Credentials.of(os.environ.get(ACCESS_KEY_ENV), os.environ.get(SECRET_KEY_ENV))

    def metadata(self) -> tuple[tuple[str, str], tuple[str, str]]:
        """The headers of a call made now; made once a second (the timestamp has whole seconds), then reused."""
        now_s = int(time.time())
        cached = self._signed
        if cached is not None and cached[0] == now_s:
            return cached[1]
        headers = signed_metadata(self.access_key, self.secret_key, dt.datetime.fromtimestamp(now_s, dt.UTC))
        object.__setattr__(self, "_signed", (now_s, headers))  # a cache, not part of the value
        return headers


class _Details(grpc.ClientCallDetails):
    def __init__(self, base: Any, metadata: list[tuple[str, str]]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = base.wait_for_ready
        self.compression = getattr(base, "compression", None)


class SigningInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the signature headers to every call of a channel."""

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials

    def _signed(self, details: Any) -> _Details:
        return _Details(details, [*(details.metadata or ()), *self.credentials.metadata()])

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._signed(details), request)

    def intercept_unary_stream(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._signed(details), request)

    def intercept_stream_unary(self, continuation: Callable[..., Any], details: Any, requests: Iterator[Any]) -> Any:
        return continuation(self._signed(details), requests)

    def intercept_stream_stream(self, continuation: Callable[..., Any], details: Any, requests: Iterator[Any]) -> Any:
        return continuation(self._signed(details), requests)


def signed_channel(channel: grpc.Channel, credentials: Credentials | None) -> grpc.Channel:
    """``channel`` signing every call with ``credentials`` (``channel`` itself when there are none)."""
    return channel if credentials is None else grpc.intercept_channel(channel, SigningInterceptor(credentials))
