"""Unary calls served on one long-lived bidirectional stream: SendStream (SendMessage's) and PullStream (PullMessage's).

Why streams: grpcio's synchronous server spends about 600 us of CPU on each unary call whatever the handler does
(a new call's poller turns, the hand-off to a worker thread; ``bench.hops``, docs/benchmarks.md), and a producer
sending a message at a time, or a consumer pulling a queue, waits for it. On a stream the call is set up once and
each request costs a read and a write on it.

Each request is served exactly as its unary call. The broker resolves the unary method's handler through the
server's own interceptors once (``through_interceptors``): the request guard, the auth gate, the replication gate
and the servicer's error mapping, so no check is written twice and none can be missed. Each request runs that
handler with a ``StreamCallContext`` whose ``abort`` raises ``CallRefused`` instead of ending the stream; the
refusal is that request's answer (its response code and reason). A bad message, a topic the user may not use, a
slave's NOT_MASTER: each answers one request, and the stream goes on. Answers come in request order, one for each
request, and the next request is read only once the previous one is answered (for a send, after the replication
gate's wait for the in-sync replicas): one request of a stream is in the broker at a time.

Authentication happens once, when the stream opens (the auth gate's stream wrapper: the signature's date-time must
be inside the window then). For each request the gate checks the stream's credentials again except the window (the
user still exists and is enabled, the secret key unchanged), and the request's operation its rights: a disabled
user or a revoked right refuses the next request.

A held pull on a stream holds the stream's worker thread as a held pull call does and counts as a held pull; the
stream's end (a consumer dropping its queue, or closing) ends the hold at once, as a cancelled call's does. The
pull registers that with ``add_callback``; on a stream it replaces the previous request's registration, so a
long-lived stream keeps one.

Limits: an open stream holds one gRPC worker thread for its life. ``CallStreams`` admits at most ``max_streams`` of
both kinds together; past that a stream is refused when it opens with SYSTEM_BUSY, and its client makes calls
instead. A stream waiting between two requests counts against the held-call budget (``waiting_count``; one serving
a request is a call in progress, and a held pull is counted as one). Clients close a stream they have not used for
a while (broker/client/call_stream.py). A stopping broker ends each stream at its next gap between requests (one
waiting is cancelled, one serving a request answers it first), so that the server's stop does not wait its grace
period for idle clients.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import grpc

from broker.errors import InvalidArgumentError, ResponseCode, ServiceNotAvailableError, SystemBusyError
from broker.proto.status import RESPONSE_CODE_KEY

SEND_MESSAGE_METHOD = "/sluice.v1.Broker/SendMessage"
PULL_MESSAGE_METHOD = "/sluice.v1.Broker/PullMessage"
UnaryBehavior = Callable[[Any, Any], Any]  # a unary handler: (request, context) -> response


class CallRefused(grpc.RpcError):
    """A request of a stream refused by a check or its handler: ``StreamCallContext.abort``'s exception (an
    RpcError, so that the handlers' error mapping lets it through as it does a unary call's abort)."""

    def __init__(self, code: int, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _StreamEnd:
    """The stream's one end-of-call registration, handed to the request being served (module docstring)."""

    def __init__(self, stream: grpc.ServicerContext) -> None:
        self._lock = threading.Lock()
        self._current: Callable[[], None] | None = None
        self._ended = False
        self._registered = False
        self._stream = stream

    def register(self, callback: Callable[[], None]) -> bool:
        """Like ``ServicerContext.add_callback``: False when the stream has ended already."""
        with self._lock:
            if self._ended:
                return False
            self._current = callback
            if self._registered:
                return True
            self._registered = True
        if self._stream.add_callback(self._fire):
            return True
        with self._lock:  # the stream had ended: so has every request of it from now on
            self._ended = True
            self._current = None
        return False

    def served(self) -> None:
        with self._lock:
            self._current = None

    def _fire(self) -> None:
        with self._lock:
            self._ended = True
            callback, self._current = self._current, None
        if callback is not None:
            callback()


class StreamCallContext:
    """What a unary handler and the gates see of one request on a stream: the stream's metadata, peer, TLS
    identity and end; an abort that refuses the request, not the stream."""

    def __init__(self, stream: grpc.ServicerContext, end: _StreamEnd) -> None:
        self._stream = stream
        self._end = end
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

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return self._end.register(callback)

    def set_trailing_metadata(self, metadata: Sequence[tuple[str, str | bytes]]) -> None:
        for key, value in metadata:
            if key == RESPONSE_CODE_KEY:
                self._code = int(value)

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise CallRefused(self._code, details)


class CallStreams:
    """The open streams of both kinds: at most ``max_streams``, ended when the broker stops (module docstring)."""

    def __init__(self, max_streams: int) -> None:
        if max_streams < 1:
            raise InvalidArgumentError(f"max_streams={max_streams}: at least one stream must be possible")
        self.max_streams = max_streams
        self._lock = threading.Lock()
        self._open = 0
        self._waiting: set[grpc.ServicerContext] = set()  # streams between two requests, waiting for the next
        self._stopping = False

    def serve(self, requests: Iterator[Any], context: grpc.ServicerContext, call_one: UnaryBehavior,
              answer_type: Callable[..., Any]) -> Iterator[Any]:
        """The answers of one stream: each request served by ``call_one``, its outcome as ``answer_type(response=)``
        or ``answer_type(code=, error=)``. Raises (before any answer) SystemBusyError at the limit,
        ServiceNotAvailableError once the broker stops."""
        self._admit()
        end = _StreamEnd(context)
        try:
            while True:
                with self._lock:
                    if self._stopping:
                        return  # between two requests: the stream ends, the client opens one elsewhere
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
                try:
                    yield answer_type(response=call_one(request, StreamCallContext(context, end)))
                except CallRefused as r:
                    yield answer_type(code=r.code, error=r.details)
                finally:
                    end.served()
        finally:
            with self._lock:
                self._open -= 1

    def stop(self) -> None:
        """End every stream at its next gap between requests, so that the server's stop need not wait for them: one
        waiting now is cancelled, one serving a request ends once it has answered it."""
        with self._lock:
            self._stopping = True
            waiting = list(self._waiting)
        for context in waiting:
            context.cancel()

    def open_count(self) -> int:
        return self._open

    def waiting_count(self) -> int:
        """Streams holding a worker thread between two requests (what the held-call budget counts of them)."""
        return len(self._waiting)

    def _admit(self) -> None:
        with self._lock:
            if self._stopping:
                raise ServiceNotAvailableError("the broker is stopping; send to another broker of the topic")
            if self._open >= self.max_streams:
                raise SystemBusyError(
                    f"{self._open} streams are open, this broker's limit (each holds a worker thread: half of "
                    "grpc_max_workers - grpc_reserved_workers); the client makes calls instead, or raise "
                    "grpc_max_workers"
                )
            self._open += 1


class StreamRequestDetails(NamedTuple):
    """The call details a stream's per-request handler is resolved with: no call yet, no metadata. An interceptor
    that checks a call's headers leaves that to the handler here (broker/auth/gate.py)."""

    method: str
    invocation_metadata: tuple[tuple[str, str], ...]


def through_interceptors(interceptors: Sequence[grpc.ServerInterceptor], method: str,
                         behavior: UnaryBehavior) -> UnaryBehavior:
    """The unary ``behavior`` of ``method`` as the server runs it behind ``interceptors`` (the first outermost). Its
    requests arrive parsed (a stream's own parser, guarded, made them), so the handler has no (de)serializers."""
    handler = grpc.unary_unary_rpc_method_handler(behavior)

    def resolve(index: int, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if index == len(interceptors):
            return handler
        return interceptors[index].intercept_service(lambda d: resolve(index + 1, d), details)

    resolved = resolve(0, StreamRequestDetails(method, ()))  # the two fields interceptors read
    assert resolved is not None and resolved.unary_unary is not None, f"no unary handler of {method}"
    gated: UnaryBehavior = resolved.unary_unary
    return gated
