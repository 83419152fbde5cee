"""One remoting connection whose answers are read by the threads that wait for them (leader and followers).

A synchronous sender waits for each answer; handing the answer over from a reader thread costs two thread
wake-ups a call, which on a loaded machine is most of a small send's time. Here no thread reads for others unless
they wait at the same time: a caller sends its frame, then, if no other caller is reading, reads frames itself
until its own answer comes (the leader); answers for others it finds are handed to them. A caller that finds
another reading waits for it to hand the answer over, or to leave, and then reads itself. One caller alone (a
synchronous producer) never switches threads.

Requests the broker sends on its own (NOTIFY_CONSUMER_IDS_CHANGED, ...) are skipped: the Producer and PullConsumer
answer none. A connection that broke fails every waiting call with BrokerUnreachableError and is not used again.
"""

from __future__ import annotations

import itertools
import select
import socket
import threading
import time

from broker.errors import BrokerUnreachableError, RemotingFrameError
from broker.remoting.client import CONNECT_TIMEOUT_S, parse_address
from broker.remoting.command import FLAG_ONEWAY, RemotingCommand
from broker.remoting.frame import PREFIX_BYTES, body_length, decode_frame, encode_frame

# How long a follower waits before it looks again whether the reader left (a leader that left wakes one follower
# at once; this only bounds a missed wake-up).
FOLLOWER_POLL_S = 0.05
RECV_CHUNK_BYTES = 1 << 20


class _Waiting:
    __slots__ = ("answer", "error", "wake")

    def __init__(self) -> None:
        self.answer: RemotingCommand | None = None
        self.error: BrokerUnreachableError | None = None
        self.wake = threading.Event()


class RemotingWire:
    def __init__(self, address: str) -> None:
        self.address = address
        try:
            self._sock = socket.create_connection(parse_address(address), CONNECT_TIMEOUT_S)
        except OSError as e:
            raise BrokerUnreachableError(f"cannot connect to {address}: {e}", request_sent=False) from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.settimeout(None)
        self._send_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._lock = threading.Lock()
        self._waiting: dict[int, _Waiting] = {}
        self._opaques = itertools.count(1)
        self._buffer = bytearray()
        self.closed = False

    def invoke(self, command: RemotingCommand, timeout_s: float) -> RemotingCommand:
        """Send ``command`` and return its answer; BrokerUnreachableError when none comes within ``timeout_s`` or
        the connection ends first (the request may have reached the broker)."""
        waiting = _Waiting()
        with self._lock:
            if self.closed:
                raise BrokerUnreachableError(f"the connection to {self.address} is closed", request_sent=False)
            command.opaque = next(self._opaques)
            command.flag &= ~FLAG_ONEWAY
            self._waiting[command.opaque] = waiting
        deadline = time.monotonic() + timeout_s
        try:
            frame = encode_frame(command)
            try:
                with self._send_lock:
                    self._sock.sendall(frame)
            except OSError as e:
                self._fail(f"sending to {self.address} failed: {e}")
            while waiting.answer is None and waiting.error is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise BrokerUnreachableError(
                        f"no answer from {self.address} to request {command.code} within {timeout_s} s"
                    )
                if self._read_lock.acquire(blocking=False):
                    try:
                        self._lead(waiting, deadline)
                    finally:
                        self._read_lock.release()
                        self._wake_one()
                else:
                    waiting.wake.wait(min(remaining, FOLLOWER_POLL_S))
                    waiting.wake.clear()
            if waiting.error is not None:
                raise waiting.error
            assert waiting.answer is not None
            return waiting.answer
        finally:
            with self._lock:
                self._waiting.pop(command.opaque, None)

    # ------------------------------------------------------------------------------------------------ reading
    def _lead(self, mine: _Waiting, deadline: float) -> None:
        """Read frames until ``mine`` is answered or the deadline passes; hand the others' answers over."""
        while mine.answer is None and mine.error is None:
            try:
                data = self._frame(deadline)
                if data is None:
                    return  # the deadline passed with no frame begun
                command = decode_frame(data)
            except RemotingFrameError as e:
                self._fail(f"malformed frame from {self.address}: {e.message}")
                return
            if not command.is_response:
                continue
            with self._lock:
                waiting = self._waiting.get(command.opaque)
            if waiting is not None:
                waiting.answer = command
                if waiting is not mine:
                    waiting.wake.set()

    def _frame(self, deadline: float) -> bytes | None:
        """The bytes after the next frame's length prefix; None when no byte of it came before ``deadline``. Once
        a frame has begun it is read whole, whatever the deadline (the stream must stay in step)."""
        while len(self._buffer) < PREFIX_BYTES:
            if not self._buffer and not self._buffer_ready(deadline):
                return None
            self._fill()
        need = body_length(bytes(self._buffer[:PREFIX_BYTES])) if len(self._buffer) >= PREFIX_BYTES else 0
        while len(self._buffer) < PREFIX_BYTES + need:
            self._fill()
        data = bytes(self._buffer[PREFIX_BYTES : PREFIX_BYTES + need])
        del self._buffer[: PREFIX_BYTES + need]
        return data

    def _buffer_ready(self, deadline: float) -> bool:
        remaining = max(deadline - time.monotonic(), 0.0)
        try:
            return bool(select.select([self._sock], [], [], remaining)[0])
        except (OSError, ValueError) as e:
            self._fail(f"the connection to {self.address} failed: {e}")
            raise BrokerUnreachableError(f"the connection to {self.address} failed: {e}") from None

    def _fill(self) -> None:
        try:
            chunk = self._sock.recv(RECV_CHUNK_BYTES)
        except OSError as e:
            chunk = b""
            why = f"connection error: {e}"
        else:
            why = "closed by the broker"
        if not chunk:
            self._fail(f"the connection to {self.address} ended ({why})")
            raise BrokerUnreachableError(f"the connection to {self.address} ended ({why})")
        self._buffer += chunk

    # ------------------------------------------------------------------------------------------------ ends
    def _wake_one(self) -> None:
        """A reader left: one waiting caller takes over the reading."""
        with self._lock:
            others = [w for w in self._waiting.values() if w.answer is None]
        if others:
            others[0].wake.set()

    def _fail(self, why: str) -> None:
        with self._lock:
            self.closed = True
            waiting = list(self._waiting.values())
        for w in waiting:
            if w.answer is None:
                w.error = BrokerUnreachableError(why)
                w.wake.set()

    def close(self) -> None:
        self._fail(f"the connection to {self.address} was closed")
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
