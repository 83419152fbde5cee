"""SendStream: SendMessage on one long-lived bidirectional stream, for producers that send a message at a time.

Why a stream: grpcio's synchronous server spends about 600 us of CPU on each unary call whatever the handler does
(a new call's poller turns, the hand-off to a worker thread; ``bench.hops``, docs/benchmarks.md), and a synchronous
producer waits for all of it. On a stream the call is set up once; each message costs a read and a write on it.

Each message is served exactly as a SendMessage call. The broker resolves SendMessage's handler through the
server's own interceptors once (``through_interceptors``): the request guard, the auth gate, the replication gate
and the servicer's error mapping, so no check is written twice and none can be missed. Each message runs that
handler with a ``MessageContext`` whose ``abort`` raises ``MessageRefused`` instead of ending the stream; the
refusal is that message's answer (its response code and reason). A bad message, a topic the user may not publish
to, a slave's NOT_MASTER: each answers one message, and the stream goes on. Answers come in request order, one
for each request, and the next request is read only once the previous one is answered (after the replication
gate's wait for the in-sync replicas): one message of a stream is in the broker at a time.

Authentication happens once, when the stream opens (the auth gate's stream wrapper: the signature's date-time must
be inside the window then). For each message the gate checks the stream's credentials again except the window (the
user still exists and is enabled, the secret key unchanged) and the message's rights: a disabled user or a revoked
right refuses the next message.

Limits: an open stream holds one gRPC worker thread for its life, as a held pull does. ``SendStreams`` admits at
most ``max_streams`` (counted against the held-pull budget with the other held calls); past that a stream is
refused when it opens with SYSTEM_BUSY, and its client sends with SendMessage instead. Clients close a stream they
have not used for a while (broker/client/send_stream.py). A stopping broker ends each stream at its next gap
between messages (one waiting is cancelled, one serving a message answers it first), so that the server's stop
does not wait its grace period for idle producers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import grpc

from broker.errors import InvalidArgumentError, ResponseCode, ServiceNotAvailableError, SystemBusyError
from broker.proto import sluice_pb2 as pb
from broker.proto.status import RESPONSE_CODE_KEY

SEND_MESSAGE_METHOD = "/sluice.v1.Broker/SendMessage"
SendOne = Callable[[pb.SendMessageRequest, Any], pb.SendResponse]


class MessageRefused(grpc.RpcError):
    """A message of a stream refused by a check or its handler: ``MessageContext.abort``'s exception (an RpcError,
    so that the handlers' error mapping lets it through as it does a unary call's abort)."""

    def __init__(self, code: int, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class MessageContext:
    """What SendMessage's handler and the gates see of one message on a stream: the stream's metadata, peer and
    TLS identity; an abort that refuses the message, not the stream."""

    def __init__(self, stream: grpc.ServicerContext) -> None:
        self._stream = stream
        self._code = int(ResponseCode.SYSTEM_ERROR)  # an abort that set no response code: a broker bug

    def invocation_metadata(self) -> Sequence[tuple[str, str | bytes]]:
        return self._stream.invocation_metadata()

    def peer(self) -> str:
        return self._stream.peer()

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._stream.auth_context()

    def is_active(self) -> bool:
        return self._stream.is_active()

    def time_remaining(self) -> float | None:
        return self._stream.time_remaining()

    def set_trailing_metadata(self, metadata: Sequence[tuple[str, str | bytes]]) -> None:
        for key, value in metadata:
            if key == RESPONSE_CODE_KEY:
                self._code = int(value)

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise MessageRefused(self._code, details)


def answer(send_one: SendOne, request: pb.SendMessageRequest, stream: grpc.ServicerContext) -> pb.SendStreamAnswer:
    """One request of a stream served as a SendMessage call, its outcome as an answer."""
    try:
        return pb.SendStreamAnswer(response=send_one(request, MessageContext(stream)))
    except MessageRefused as r:
        return pb.SendStreamAnswer(code=r.code, error=r.details)


class SendStreams:
    """The open send streams: at most ``max_streams`` (module docstring), ended when the broker stops."""

    def __init__(self, max_streams: int) -> None:
        if max_streams < 1:
            raise InvalidArgumentError(f"max_streams={max_streams}: at least one send stream must be possible")
        self.max_streams = max_streams
        self._lock = threading.Lock()
        self._open = 0
        self._waiting: set[grpc.ServicerContext] = set()  # streams between two messages, waiting for the next
        self._stopping = False

    def serve(self, requests: Iterator[pb.SendMessageRequest], context: grpc.ServicerContext,
              send_one: SendOne) -> Iterator[pb.SendStreamAnswer]:  # fmt: skip
        """The answers of one stream, each request served by ``send_one``. Raises (before any answer) SystemBusyError
        at the limit, ServiceNotAvailableError once the broker stops."""
        self._admit()
        try:
            while True:
                with self._lock:
                    if self._stopping:
                        return  # between two messages: the stream ends, the producer opens one elsewhere
                    self._waiting.add(context)
                try:
                    request = next(requests, None)
                except grpc.RpcError:  # cancelled: by the client, or by stop() while waiting here
                    return
                finally:
                    with self._lock:
                        self._waiting.discard(context)
                if request is None:
                    return
                yield answer(send_one, request, context)
        finally:
            with self._lock:
                self._open -= 1

    def stop(self) -> None:
        """End every stream at its next gap between messages, so that the server's stop need not wait for them: one
        waiting now is cancelled, one serving a message ends once it has answered it."""
        with self._lock:
            self._stopping = True
            waiting = list(self._waiting)
        for context in waiting:
            context.cancel()

    def open_count(self) -> int:
        return self._open

    def _admit(self) -> None:
        with self._lock:
            if self._stopping:
                raise ServiceNotAvailableError("the broker is stopping; send to another broker of the topic")
            if self._open >= self.max_streams:
                raise SystemBusyError(
                    f"{self._open} send streams are open, this broker's limit (each holds a worker thread: half of "
                    "grpc_max_workers - grpc_reserved_workers); send with SendMessage, or raise grpc_max_workers"
                )
            self._open += 1


class _CallDetails(NamedTuple):
    method: str
    invocation_metadata: tuple[tuple[str, str], ...]


def through_interceptors(interceptors: Sequence[grpc.ServerInterceptor], method: str,
                         handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:  # fmt: skip
    """``handler`` of ``method`` as the server runs it behind ``interceptors`` (the first one outermost)."""

    def resolve(index: int, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if index == len(interceptors):
            return handler
        return interceptors[index].intercept_service(lambda d: resolve(index + 1, d), details)

    resolved = resolve(0, _CallDetails(method, ()))  # the two fields interceptors read
    assert resolved is not None, f"an interceptor refused to serve {method}"
    return resolved
