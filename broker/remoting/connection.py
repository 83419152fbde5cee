"""One accepted remoting connection: the :class:`~broker.remoting.processor.Peer` a processor is given.

Every write happens on the event loop's thread: a processor (on a worker thread) hands its frame over with
``call_soon_threadsafe``, so frames of concurrent answers never interleave. The connection also sends requests of
its own (broker-to-client calls) and matches their answers by ``opaque``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from concurrent.futures import Future

from broker.errors import BrokerUnreachableError, RemotingFrameError
from broker.remoting.command import FLAG_ONEWAY, RemotingCommand
from broker.remoting.frame import encode_frame

log = logging.getLogger(__name__)

# A peer that does not read its answers would make the server buffer them without end: past this many bytes
# waiting to be written the connection is closed (a pull answer is at most one 16 MiB frame; four of them waiting
# means the peer has stopped reading).
MAX_WRITE_BUFFER_BYTES = 64 * 1024 * 1024
# Broker-to-client requests awaiting an answer on one connection: a client that never answers cannot grow the table.
MAX_PENDING_REQUESTS = 1024


class Connection:
    def __init__(self, loop: asyncio.AbstractEventLoop, writer: asyncio.StreamWriter, address: str) -> None:
        self._loop = loop
        self._writer = writer
        self._address = address
        self._opaques = itertools.count(1)
        self._lock = threading.Lock()
        self._pending: dict[int, Future[RemotingCommand]] = {}
        self.closed = False

    @property
    def address(self) -> str:
        return self._address

    # ------------------------------------------------------------------------------------------------ writing
    def send(self, command: RemotingCommand) -> None:
        """Queue a frame for writing, from any thread; dropped (with a log line) once the connection is closed."""
        try:
            frame = encode_frame(command)
        except RemotingFrameError as e:
            log.error("remoting: an answer to %s cannot be encoded (%s); nothing sent", self._address, e.message)
            return
        try:
            self._loop.call_soon_threadsafe(self._write, frame)
        except RuntimeError:  # the loop has stopped: the server is shutting down
            pass

    def _write(self, frame: bytes) -> None:
        if self.closed or self._writer.is_closing():
            return
        self._writer.write(frame)
        if self._writer.transport.get_write_buffer_size() > MAX_WRITE_BUFFER_BYTES:
            log.warning("remoting: closing the connection from %s: it does not read its answers (%d bytes waiting)",
                        self._address, self._writer.transport.get_write_buffer_size())
            self.close()

    def send_oneway(self, command: RemotingCommand) -> None:
        command.flag |= FLAG_ONEWAY
        command.opaque = next(self._opaques)
        self.send(command)

    def invoke(self, command: RemotingCommand) -> Future[RemotingCommand]:
        """Send a request to the peer; the future completes with its answer, or fails when the connection ends. A
        caller that stops waiting calls :meth:`forget` with the command's opaque."""
        future: Future[RemotingCommand] = Future()
        with self._lock:
            if self.closed:
                future.set_exception(BrokerUnreachableError(f"the connection from {self._address} is closed"))
                return future
            if len(self._pending) >= MAX_PENDING_REQUESTS:
                future.set_exception(BrokerUnreachableError(
                    f"{MAX_PENDING_REQUESTS} requests to {self._address} await an answer already"))
                return future
            command.opaque = next(self._opaques)
            self._pending[command.opaque] = future
        self.send(command)
        return future

    def forget(self, opaque: int) -> None:
        with self._lock:
            self._pending.pop(opaque, None)

    def answered(self, response: RemotingCommand) -> None:
        """An answer from the peer: completes the request of the same opaque (an unknown one, late or never asked
        for, is dropped)."""
        with self._lock:
            future = self._pending.pop(response.opaque, None)
        if future is None:
            log.debug("remoting: answer with unknown opaque %d from %s dropped", response.opaque, self._address)
            return
        future.set_result(response)

    def close(self) -> None:
        """On the loop's thread."""
        with self._lock:
            self.closed = True
            pending, self._pending = self._pending, {}
        for future in pending.values():
            future.set_exception(BrokerUnreachableError(f"the connection from {self._address} closed"))
        if not self._writer.is_closing():
            self._writer.close()
