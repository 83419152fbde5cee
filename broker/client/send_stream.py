"""A connection's SendStream (broker/server/send_stream.py): synchronous sends without a gRPC call each.

A synchronous send on a stream costs the broker a read and a write instead of a call's set-up, about half the
latency of a SendMessage call (docs/benchmarks.md). ``Connection.send_message`` sends through it and falls back to
SendMessage whenever the stream cannot take the message:

* one sender at a time: a send that finds another thread's send in flight uses SendMessage, so concurrent senders
  wait for nothing;
* a broker without SendStream (UNIMPLEMENTED) or at its limit of open streams (SYSTEM_BUSY when the stream opens)
  is sent to with SendMessage for ``FALLBACK_S``, then the stream is tried again.

What a send on the stream raises is what SendMessage would raise for the same outcome:

* an answer: the message's response, or its refusal as the broker's error;
* the stream refused when it opened (a response code, no request read: credentials, the limit) or no connection
  made: that error; nothing was stored. A stream that ended between two sends (the broker stopped) is opened
  again before the next one, so a send to a stopped broker is known never to have been sent, as a call's is;
* anything else (no answer within the timeout, the stream broken mid-way): ``BrokerUnreachableError`` with
  ``request_sent``: the outcome is unknown, and the producer retries under the same UNIQ_KEY on a new stream (the
  broker stores it once).

gRPC has no timeout for a stream's next message: a watchdog thread, one per open stream, cancels the call when an
answer is overdue (it looks every ``WATCH_PERIOD_S``, so a send times out up to that much late) and closes the
stream after ``IDLE_CLOSE_S`` unused, giving the broker back the worker thread it holds.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from broker.errors import BrokerError, BrokerUnreachableError, ResponseCode
from broker.proto import sluice_pb2 as pb
from broker.proto.status import RESPONSE_CODE_KEY, error_for, error_from_rpc

WATCH_PERIOD_S = 0.05
IDLE_CLOSE_S = 30.0  # an idle stream holds one of the broker's worker threads; opening one again costs a call
FALLBACK_S = 10.0  # how long a broker that refused a stream is sent to with SendMessage before trying again
_END = object()  # ends the request iterator gRPC reads from

OpenStream = Callable[[Iterator[Any]], Any]  # the stub's SendStream: requests in, a call yielding answers out


class SendStream:
    def __init__(self, open_stream: OpenStream, explain: Callable[[BrokerError], BrokerError] = lambda e: e) -> None:
        self._open_stream = open_stream
        self._explain = explain  # a connection's TLS diagnosis of a failed connect
        self._lock = threading.Lock()  # held by the one send in flight
        self._requests: queue.SimpleQueue[Any] | None = None
        self._call: Any = None
        self._answered = False  # the open stream answered once: it was accepted
        self._deadline: float | None = None  # monotonic time by which the send in flight must be answered
        self._last_used = 0.0
        self._fallback_until = 0.0
        self._closed = False
        self.answers = 0  # messages answered on the stream (refusals included)

    def falling_back(self) -> bool:
        """True while sends go as calls because the broker refused a stream (module docstring)."""
        return time.monotonic() < self._fallback_until

    def send(self, request: pb.SendMessageRequest, timeout_s: float) -> pb.SendResponse | None:
        """The broker's response; None when the stream cannot take it now (send with SendMessage)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._closed or time.monotonic() < self._fallback_until:
                return None
            if self._call is not None and self._call.done():  # ended since the last send (the broker went away)
                self._drop()
            if self._call is None:
                self._open()
            return self._exchange(request, timeout_s)
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop()

    # ------------------------------------------------------------------------------------------------ inside
    def _open(self) -> None:
        requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._requests = requests
        self._call = call = self._open_stream(iter(requests.get, _END))
        self._answered = False
        self._last_used = time.monotonic()
        threading.Thread(target=self._watch, args=(call,), name="sluice-send-stream", daemon=True).start()

    def _exchange(self, request: pb.SendMessageRequest, timeout_s: float) -> pb.SendResponse | None:
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
            raise BrokerUnreachableError("the broker ended the send stream without answering; the message may or "
                                         "may not be stored", request_sent=True) from None  # fmt: skip
        finally:
            self._deadline = None
            self._last_used = time.monotonic()
        self._answered = True
        self.answers += 1
        if answer.code:
            raise error_for(answer.code, answer.error)
        response: pb.SendResponse = answer.response
        return response

    def _broken(self, e: grpc.RpcError, timeout_s: float) -> None:
        """The stream failed: return to send with SendMessage, else raise what the caller may conclude."""
        refused_at_open = not self._answered
        self._drop()
        status = e.code() if isinstance(e, grpc.Call) else grpc.StatusCode.UNKNOWN
        if refused_at_open:
            if status is grpc.StatusCode.UNIMPLEMENTED:
                self._fallback_until = time.monotonic() + FALLBACK_S
                return None
            trailers = dict((e.trailing_metadata() or ()) if isinstance(e, grpc.Call) else ())
            error = error_from_rpc(e)
            if RESPONSE_CODE_KEY in trailers:  # refused before any request was read: nothing stored
                if error.code is ResponseCode.SYSTEM_BUSY:
                    self._fallback_until = time.monotonic() + FALLBACK_S
                    return None
                raise error
            if isinstance(error, BrokerUnreachableError) and not error.request_sent:
                raise self._explain(error)
        details = e.details() if isinstance(e, grpc.Call) else str(e)
        why = f"no answer within {timeout_s:.1f} s" if status is grpc.StatusCode.CANCELLED else details
        raise BrokerUnreachableError(
            f"the send stream broke before its answer ({status.name}: {why}); the message may or may not be stored",
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
                call.cancel()  # the sender's next() raises CANCELLED: an unknown outcome
            elif deadline is None and now - self._last_used > IDLE_CLOSE_S and self._lock.acquire(blocking=False):
                try:
                    if self._call is call:
                        self._drop()
                finally:
                    self._lock.release()
