"""The remoting transport: a TCP server that reads frames, hands each request to its code's processor on a bounded
worker pool, and writes the answers back.

Threads. One asyncio event loop (its own thread) does all the I/O of every connection: accepting, reading and
splitting frames, writing answers. Processors run on a ``ThreadPoolExecutor`` because they call the store and may
block. This is RocketMQ's Reactor (an accept thread, I/O threads, a processor pool) with asyncio as the I/O side:
one loop thread serves thousands of idle connections without a thread each, handles TLS through the standard
``ssl`` module, and needs no dependency; Python runs one thread of bytecode at a time anyway, so more I/O threads
would not read faster. A processor that answers with a ``Future`` (a long-polling pull) frees its worker at once;
the answer is written when the future completes.

What the server guarantees, whatever a peer sends:

* An answer carries its request's ``opaque`` and serialization type; one-way requests (flag bit 1) get nothing.
* An unknown code is answered ``REQUEST_CODE_NOT_SUPPORTED`` with RocketMQ's remark; when the worker pool has
  ``MAX_QUEUED_REQUESTS`` requests waiting, a new one is answered ``SYSTEM_BUSY`` (RocketMQ's flow control) without
  being run.
* A processor that raises is answered ``SYSTEM_ERROR`` with the error's text (logged with its stack); a
  ``BrokerError`` with its own code. The server keeps serving.
* A malformed frame (broker/remoting/frame.py) closes that connection with one log line; nothing of it reaches a
  processor and other connections are not affected.
* A connection silent for ``IDLE_TIMEOUT_S`` is closed (RocketMQ's serverChannelMaxIdleTimeSeconds); at most
  ``max_connections`` are open at once, a connection past that is closed as soon as it is accepted.

Authentication: with an ``Authenticator`` (authentication.py) every request of a served code is authenticated on
its worker thread before its processor runs; a refusal is answered ``NO_PERMISSION`` and the processor never runs.
The user goes to the processor in ``RequestContext.user``.

Connections closing: ``on_close(peer)`` is called (on the loop's thread) for each connection that ends, so that what
was registered through it (a consumer's membership) is forgotten, as RocketMQ does when a channel closes.

TLS: with a ``ServerTls`` (broker/server/tls.py, the settings the gRPC ports use) every connection is TLS, with the
same certificate, key and client-certificate rule. Unlike the gRPC ports the certificate is read once at start:
replacing the files takes a restart for this port. RocketMQ's "permissive" mode (TLS and plain text on one port,
told apart by the first byte) is not offered: a port is one or the other.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

from broker.errors import AuthenticationError, BrokerError, ServiceNotAvailableError
from broker.remoting.authentication import Authenticator
from broker.remoting.codes import WireCode, error_code, not_supported_remark
from broker.remoting.command import FLAG_RESPONSE, RemotingCommand
from broker.remoting.connection import Connection
from broker.remoting.frame import PREFIX_BYTES, body_length, decode_frame
from broker.remoting.processor import Answer, Peer, Processor, RequestContext
from broker.server.server_tls import ServerTls

log = logging.getLogger(__name__)

IDLE_TIMEOUT_S = 120.0  # RocketMQ's serverChannelMaxIdleTimeSeconds; clients heartbeat every 30 s
# Connections open at once: each costs a socket and buffers; a RocketMQ broker serves a few thousand clients.
DEFAULT_MAX_CONNECTIONS = 4096
# Processor threads: requests block on the store (a sync flush, a disk read), so a few dozen keep the store busy
# while one slow call waits; held pulls take no thread (they answer with a Future).
DEFAULT_WORKERS = 32
# Requests accepted but not yet started, beyond which new ones are answered SYSTEM_BUSY at once (RocketMQ's
# send-thread queue holds 10,000): waiting longer than a client's 3 s timeout helps nobody.
MAX_QUEUED_REQUESTS = 10_000
START_TIMEOUT_S = 10.0
BUSY_REMARK = "[OVERLOAD]system busy, start flow control for a while"


def server_ssl_context(tls: ServerTls) -> ssl.SSLContext:
    """The gRPC ports' TLS settings as a Python ``ssl`` context: same certificate, key and client-certificate rule
    (``request`` asks for a certificate and accepts clients without one, as its name says)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.client_auth != "none":
        ctx.load_verify_locations(tls.ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED if tls.client_auth == "require" else ssl.CERT_OPTIONAL
    return ctx


class RemotingServer:
    def __init__(
        self, processors: Mapping[int, Processor], host: str = "0.0.0.0", port: int = 0, *,
        tls: ServerTls | None = None, workers: int = DEFAULT_WORKERS,
        max_connections: int = DEFAULT_MAX_CONNECTIONS, idle_timeout_s: float = IDLE_TIMEOUT_S, name: str = "remoting",
        authenticator: Authenticator | None = None, on_close: Callable[[Peer], None] | None = None,
    ) -> None:
        self.processors = dict(processors)
        self.authenticator = authenticator
        self.on_close = on_close
        self.host, self.port = host, port
        self.tls = tls
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s
        self.name = name
        self._pool = ThreadPoolExecutor(workers, f"{name}-worker")
        self._queued = 0
        self._queued_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[Connection] = set()

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    # ------------------------------------------------------------------------------------------------ life
    def start(self) -> None:
        """Bind and serve; ServiceNotAvailableError when the port cannot be bound."""
        context = server_ssl_context(self.tls) if self.tls is not None else None
        loop = asyncio.new_event_loop()
        bound: Future[int] = Future()

        async def open_port() -> None:
            try:
                self._server = await asyncio.start_server(self._serve, self.host, self.port, ssl=context,
                                                          reuse_address=True)
            except OSError as e:
                bound.set_exception(e)
                return
            bound.set_result(self._server.sockets[0].getsockname()[1])

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(open_port())
            if bound.exception() is None:
                loop.run_forever()
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name=f"{self.name}-io", daemon=True)
        self._thread.start()
        try:
            self.port = bound.result(START_TIMEOUT_S)
        except OSError as e:
            self._thread.join()
            self._pool.shutdown(wait=False)
            raise ServiceNotAvailableError(
                f"remoting cannot listen on {self.address} ({e.strerror}); is another process using it?"
            ) from None
        log.info("remoting listening on %s%s", self.address, " (TLS)" if context else "")

    def shutdown(self) -> None:
        loop = self._loop
        if loop is None:
            return
        self._loop = None

        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for conn in list(self._connections):
                conn.close()
            if self._server is not None:
                await self._server.wait_closed()
            loop.stop()

        if loop.is_running():
            asyncio.run_coroutine_threadsafe(close(), loop)
        if self._thread is not None:
            self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> RemotingServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------------------------------------ reading
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        address = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        assert self._loop is not None
        conn = Connection(self._loop, writer, address)
        if len(self._connections) >= self.max_connections:
            log.warning("remoting: connection from %s refused: %d connections are open, the limit", address,
                        len(self._connections))
            conn.close()
            return
        self._connections.add(conn)
        try:
            while not conn.closed:
                try:
                    async with asyncio.timeout(self.idle_timeout_s):  # cheaper than wait_for: no task per read
                        prefix = await reader.readexactly(PREFIX_BYTES)
                except asyncio.IncompleteReadError as e:
                    if e.partial:
                        log.warning("remoting: closing the connection from %s: truncated frame (%d of %d length "
                                    "bytes)", address, len(e.partial), PREFIX_BYTES)
                    break
                except TimeoutError:
                    log.info("remoting: closing the connection from %s: idle for %.0f s", address, self.idle_timeout_s)
                    break
                length = body_length(prefix)
                try:
                    async with asyncio.timeout(self.idle_timeout_s):
                        data = await reader.readexactly(length)
                except asyncio.IncompleteReadError as e:
                    log.warning("remoting: closing the connection from %s: truncated frame (%d of %d bytes)",
                                address, len(e.partial), length)
                    break
                self._dispatch(conn, decode_frame(data))
        except BrokerError as e:  # RemotingFrameError from the frame's checks
            log.warning("remoting: closing the connection from %s: malformed frame: %s", address, e.message)
        except TimeoutError:
            log.warning("remoting: closing the connection from %s: a frame was not completed within %.0f s", address,
                        self.idle_timeout_s)
        except (ConnectionError, ssl.SSLError, OSError) as e:
            log.info("remoting: connection from %s ended: %s", address, e)
        finally:
            self._connections.discard(conn)
            conn.close()
            if self.on_close is not None:
                try:
                    self.on_close(conn)
                except Exception:  # a listener's bug must not end the server
                    log.exception("remoting: forgetting the connection from %s failed", address)

    # ------------------------------------------------------------------------------------------------ dispatch
    def _dispatch(self, conn: Connection, request: RemotingCommand) -> None:
        if request.is_response:
            conn.answered(request)
            return
        processor = self.processors.get(request.code)
        if processor is None:
            if not request.is_oneway:
                conn.send(request.response(WireCode.REQUEST_CODE_NOT_SUPPORTED,
                                           remark=not_supported_remark(request.code, conn.address)))
            return
        with self._queued_lock:
            busy = self._queued >= MAX_QUEUED_REQUESTS
            if not busy:
                self._queued += 1
        if busy:
            if not request.is_oneway:
                conn.send(request.response(WireCode.SYSTEM_BUSY, remark=BUSY_REMARK))
            return
        try:
            self._pool.submit(self._run, conn, processor, request)
        except RuntimeError:  # the pool has shut down: the server is stopping
            with self._queued_lock:
                self._queued -= 1

    def _run(self, conn: Connection, processor: Processor, request: RemotingCommand) -> None:
        with self._queued_lock:
            self._queued -= 1
        try:
            user = self.authenticator.user_of(request, conn.address) if self.authenticator is not None else None
            answer: Answer = processor.process(request, RequestContext(peer=conn, user=user))
        except AuthenticationError as e:  # logged (at a bounded rate) by the authenticator
            answer = request.response(error_code(e), remark=e.message)
        except BrokerError as e:
            log.info("remoting: request %d from %s refused: %s", request.code, conn.address, e.message)
            answer = request.response(error_code(e), remark=e.message)
        except Exception as e:  # a processor's bug must not end the server, nor leave the client waiting
            log.exception("remoting: processor of request code %d failed", request.code)
            answer = request.response(WireCode.SYSTEM_ERROR, remark=f"{type(e).__name__}: {e}")
        self._answer(conn, request, answer)

    def _answer(self, conn: Connection, request: RemotingCommand, answer: Answer) -> None:
        if answer is None:
            return
        if isinstance(answer, Future):
            answer.add_done_callback(lambda done: self._answer(conn, request, self._outcome(request, done)))
            return
        if request.is_oneway:
            return
        answer.opaque = request.opaque
        answer.flag |= FLAG_RESPONSE
        conn.send(answer)

    @staticmethod
    def _outcome(request: RemotingCommand, done: Future[RemotingCommand]) -> RemotingCommand:
        try:
            return done.result()
        except BrokerError as e:
            return request.response(error_code(e), remark=e.message)
        except Exception as e:  # noqa: BLE001 - a held answer's failure is answered, as a processor's is
            log.error("remoting: held answer to request code %d failed: %r", request.code, e)
            return request.response(WireCode.SYSTEM_ERROR, remark=f"{type(e).__name__}: {e}")
