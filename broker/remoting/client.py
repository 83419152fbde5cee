"""A small blocking remoting client: one TCP (or TLS) connection, requests matched to answers by ``opaque``.

Several threads may call :meth:`RemotingClient.invoke` at once: each request gets its own opaque, a reader thread
completes the waiting caller when the answer with that opaque arrives, whatever the order the server answers in.
Requests the server sends (broker-to-client calls such as ``NOTIFY_CONSUMER_IDS_CHANGED``) go to ``on_request``.

Given ``credentials`` (anything with ``access_key`` and ``secret_key``: broker.client's ``Credentials``), every
request is signed as a RocketMQ 4 client's ACL hook signs it (signature.py) just before it is sent, after its
fields are final.
"""

from __future__ import annotations

import itertools
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Protocol

from broker.errors import BrokerError, BrokerUnreachableError, RemotingFrameError
from broker.remoting.command import FLAG_ONEWAY, RemotingCommand
from broker.remoting.frame import PREFIX_BYTES, body_length, decode_frame, encode_frame
from broker.remoting.signature import sign

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 3.0  # RocketMQ clients' default request timeout
CONNECT_TIMEOUT_S = 3.0


class Signer(Protocol):
    @property
    def access_key(self) -> str: ...

    @property
    def secret_key(self) -> str: ...


def signed(command: RemotingCommand, credentials: Signer) -> RemotingCommand:
    """``command`` with its ``AccessKey`` and ``Signature`` set (in place), as RocketMQ's ``AclClientRPCHook``."""
    sign(command.ext_fields, command.body, credentials.access_key, credentials.secret_key)
    return command


def parse_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class RemotingClient:
    def __init__(self, address: str, *, ssl_context: ssl.SSLContext | None = None, server_hostname: str | None = None,
                 on_request: Callable[[RemotingCommand], None] | None = None,
                 credentials: Signer | None = None) -> None:
        host, port = parse_address(address)
        self.address = address
        self.credentials = credentials
        try:
            sock = socket.create_connection((host, port), CONNECT_TIMEOUT_S)
        except OSError as e:
            raise BrokerUnreachableError(f"cannot connect to {address}: {e}", request_sent=False) from None
        sock.settimeout(None)
        if ssl_context is not None:
            sock = ssl_context.wrap_socket(sock, server_hostname=server_hostname or host)
        self._sock = sock
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._pending: dict[int, Future[RemotingCommand]] = {}
        self._opaques = itertools.count(1)
        self._on_request = on_request
        self._closed = False
        self._reader = threading.Thread(target=self._read_loop, name=f"remoting-client-{address}", daemon=True)
        self._reader.start()

    # ------------------------------------------------------------------------------------------------ calls
    def invoke(self, command: RemotingCommand, timeout_s: float = DEFAULT_TIMEOUT_S) -> RemotingCommand:
        """Send a request and wait for its answer; BrokerUnreachableError when none comes in time or the
        connection ends first."""
        return self.invoke_async(command).result_or_raise(timeout_s, self)

    def invoke_async(self, command: RemotingCommand) -> _PendingCall:
        future = _PendingCall()
        with self._lock:
            if self._closed:
                raise BrokerUnreachableError(f"the connection to {self.address} is closed")
            command.opaque = next(self._opaques)
            command.flag &= ~FLAG_ONEWAY
            future.opaque = command.opaque
            self._pending[command.opaque] = future
        self._send(command)
        return future

    def invoke_oneway(self, command: RemotingCommand) -> None:
        command.opaque = next(self._opaques)
        command.flag |= FLAG_ONEWAY
        self._send(command)

    def send_raw(self, data: bytes) -> None:
        """Bytes as they are, frame or not (for tests of what the server does with malformed input)."""
        with self._send_lock:
            self._sock.sendall(data)

    def _send(self, command: RemotingCommand) -> None:
        if self.credentials is not None and not command.is_response:
            signed(command, self.credentials)
        frame = encode_frame(command)
        try:
            with self._send_lock:
                self._sock.sendall(frame)
        except OSError as e:
            self._fail_all(f"sending to {self.address} failed: {e}")
            raise BrokerUnreachableError(f"sending to {self.address} failed: {e}") from None

    def forget(self, opaque: int) -> None:
        with self._lock:
            self._pending.pop(opaque, None)

    # ------------------------------------------------------------------------------------------------ reading
    def _read_exactly(self, n: int) -> bytes | None:
        chunks, left = [], n
        while left:
            chunk = self._sock.recv(min(left, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _read_loop(self) -> None:
        why = "closed by the server"
        try:
            while True:
                prefix = self._read_exactly(PREFIX_BYTES)
                if prefix is None:
                    break
                data = self._read_exactly(body_length(prefix))
                if data is None:
                    break
                command = decode_frame(data)
                if command.is_response:
                    with self._lock:
                        future = self._pending.pop(command.opaque, None)
                    if future is not None:
                        future.set_result(command)
                elif self._on_request is not None:
                    self._on_request(command)
        except RemotingFrameError as e:
            why = f"malformed frame from the server: {e.message}"
            log.warning("remoting client: %s", why)
        except OSError as e:
            why = f"connection error: {e}"
        self._fail_all(f"the connection to {self.address} ended ({why})")

    def _fail_all(self, why: str) -> None:
        with self._lock:
            self._closed = True
            pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(BrokerUnreachableError(why))

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._lock:
            self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._reader.join(timeout=DEFAULT_TIMEOUT_S)

    def __enter__(self) -> RemotingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _PendingCall(Future[RemotingCommand]):
    """A request's answer to come; ``result_or_raise`` waits for it with a timeout and forgets the request after."""

    opaque = 0

    def result_or_raise(self, timeout_s: float, client: RemotingClient) -> RemotingCommand:
        try:
            return self.result(timeout_s)
        except FutureTimeout:
            client.forget(self.opaque)
            raise BrokerUnreachableError(
                f"no answer from {client.address} to opaque {self.opaque} within {timeout_s} s"
            ) from None
        except BrokerError:
            raise
