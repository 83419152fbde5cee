"""Unary calls on one stream of a connection (broker/server/call_streams.py): SendStream for a producer's single
sends, PullStream for a push consumer's pulls of one queue; no gRPC call a request.

A producer of a cluster (name servers) sends with calls: when a broker dies, a send written into its stream in
the moments before gRPC sees the connection close has an unknown outcome and cannot be moved to another broker
(it is retried on the same group until the timeout), and that window is wider on a stream than for a call:
sending right after a SIGKILL, 4 of 8 sends into a stream came out unknown against 1 of 8 calls (2026-11-28). A
producer of one broker (an endpoint) has no other broker to move a send to; it sends on the stream.

A request on a stream costs the broker a read and a write instead of a call's set-up (docs/benchmarks.md). The
caller falls back to the unary call whenever ``CallStream.call`` returns None:

* one caller at a time: a call that finds another thread's in flight returns None (``Connection.send_message``
  then sends with SendMessage), so concurrent senders wait for nothing;
* a broker without the stream (UNIMPLEMENTED) or at its limit of open streams (SYSTEM_BUSY when the stream opens)
  is given calls for ``FALLBACK_S``, then the stream is tried again.

What a call on the stream raises is what the unary call would raise for the same outcome:

* an answer: the response, or the refusal as the broker's error;
* the stream refused when it opened (a response code, no request read: credentials, the limit) or no connection
  made: that error; nothing was done. A stream that ended between two requests (the broker stopped), or whose
  connection gRPC core has seen close (the broker killed: the stream's own status reaches Python later), is opened
  again before the next request, so a send to a stopped or killed broker is known never to have been sent, as a
  call's is;
* anything else (no answer within the timeout, the stream broken mid-way): ``BrokerUnreachableError`` with
  ``request_sent``: the outcome is unknown (a producer retries under the same UNIQ_KEY on a new stream, and the
  broker stores it once; a consumer pulls again from the same offset).

gRPC has no timeout for a stream's next message: a watchdog thread, one per open stream, cancels the call when an
answer is overdue (it looks every ``WATCH_PERIOD_S``, so a call times out up to that much late) and closes the
stream after ``IDLE_CLOSE_S`` unused, giving the broker back the worker thread it holds. ``cancel`` ends the stream
from another thread (a consumer dropping its queue): the call in flight raises.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from broker.errors import BrokerError, BrokerUnreachableError, ResponseCode
from broker.proto.status import RESPONSE_CODE_KEY, error_for, error_from_rpc

WATCH_PERIOD_S = 0.05
IDLE_CLOSE_S = 30.0  # an idle stream holds one of the broker's worker threads; opening one again costs a call
FALLBACK_S = 10.0  # how long a broker that refused a stream is given calls before the stream is tried again
_END = object()  # ends the request iterator gRPC reads from

OpenStream = Callable[[Iterator[Any]], Any]  # the stub's SendStream: requests in, a call yielding answers out


class CallStream:
    """One kind of unary call on a stream of one connection, opened when first needed (module docstring)."""

    def __init__(self, open_stream: OpenStream, explain: Callable[[BrokerError], BrokerError] = lambda e: e,
                 connected: Callable[[], bool] = lambda: True) -> None:
        self._open_stream = open_stream
        self._explain = explain  # a connection's TLS diagnosis of a failed connect
        self._connected = connected  # the channel's connection is up (Connection.connected)
        self._lock = threading.Lock()  # held by the one call in flight
        self._state = threading.Lock()  # opening a stream and closing for good exclude each other
        self._requests: queue.SimpleQueue[Any] | None = None
        self._call: Any = None
        self._answered = False  # the open stream answered once: it was accepted
        self._deadline: float | None = None  # monotonic time by which the call in flight must be answered
        self._last_used = 0.0
        self._fallback_until = 0.0
        self._closed = False
        self.answers = 0  # requests answered on the stream (refusals included)

    def falling_back(self) -> bool:
        """True while requests go as calls because the broker refused a stream (module docstring)."""
        return time.monotonic() < self._fallback_until

    def call(self, request: Any, timeout_s: float) -> Any:
        """The broker's response; None when the stream cannot take the request now (make the unary call)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if time.monotonic() < self._fallback_until:
                return None
            if self._call is not None and (self._call.done() or not self._connected()):
                self._drop()  # ended, or its connection closed, since the last call (the broker went away)
            with self._state:
                if self._closed:
                    return None
                if self._call is None:
                    self._open()
            return self._exchange(request, timeout_s)
        finally:
            self._lock.release()

    def cancel(self) -> None:
        """End the stream for good, from any thread: a call in flight raises, later ones return None."""
        with self._state:
            self._closed = True
            call = self._call
        if call is not None:
            call.cancel()
        if self._lock.acquire(blocking=False):
            try:
                self._drop()
            finally:
                self._lock.release()

    close = cancel

    # ------------------------------------------------------------------------------------------------ inside
    def _open(self) -> None:
        requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._requests = requests
        self._call = call = self._open_stream(iter(requests.get, _END))
        self._answered = False
        self._last_used = time.monotonic()
        threading.Thread(target=self._watch, args=(call,), name="sluice-call-stream", daemon=True).start()

    def _exchange(self, request: Any, timeout_s: float) -> Any:
        assert self._requests is not None
        self._deadline = time.monotonic() + timeout_s
        self._requests.put(request)
        try:
            answer = next(self._call)
        except grpc.RpcError as e:
            self._broken(e, timeout_s)
            return None
        except StopIteration:
            self._drop()
            raise BrokerUnreachableError("the broker ended the stream without answering; the request may or may not "
                                         "have been carried out", request_sent=True) from None
        finally:
            self._deadline = None
            self._last_used = time.monotonic()
        self._answered = True
        self.answers += 1
        if answer.code:
            raise error_for(answer.code, answer.error)
        return answer.response

    def _broken(self, e: grpc.RpcError, timeout_s: float) -> None:
        """The stream failed: return to make the unary call instead, else raise what the caller may conclude."""
        refused_at_open = not self._answered
        self._drop()
        status = e.code() if isinstance(e, grpc.Call) else grpc.StatusCode.UNKNOWN
        if refused_at_open:
            if status is grpc.StatusCode.UNIMPLEMENTED:
                self._fallback_until = time.monotonic() + FALLBACK_S
                return None
            trailers = dict((e.trailing_metadata() or ()) if isinstance(e, grpc.Call) else ())
            error = error_from_rpc(e)
            if RESPONSE_CODE_KEY in trailers:  # refused before any request was read: nothing done
                if error.code is ResponseCode.SYSTEM_BUSY:
                    self._fallback_until = time.monotonic() + FALLBACK_S
                    return None
                raise error
            if isinstance(error, BrokerUnreachableError) and not error.request_sent:
                raise self._explain(error)
        details = e.details() if isinstance(e, grpc.Call) else str(e)
        why = f"no answer within {timeout_s:.1f} s" if status is grpc.StatusCode.CANCELLED else details
        raise BrokerUnreachableError(
            f"the stream broke before its answer ({status.name}: {why}); the request may or may not have been carried "
            "out",
            request_sent=True,
        )

    def _drop(self) -> None:
        if self._requests is not None:
            self._requests.put(_END)
        if self._call is not None:
            self._call.cancel()
        self._requests, self._call = None, None

    def _watch(self, call: Any) -> None:
        while self._call is call:
            time.sleep(WATCH_PERIOD_S)
            deadline = self._deadline
            now = time.monotonic()
            if deadline is not None and now > deadline:
                call.cancel()  # the caller's next() raises CANCELLED: an unknown outcome
            elif deadline is None and now - self._last_used > IDLE_CLOSE_S and self._lock.acquire(blocking=False):
                try:
                    if self._call is call:
                        self._drop()
                finally:
                    self._lock.release()
