"""The floor of the remoting rows: a bare TCP relay in Python that does the framing work and nothing else.

The server (a subprocess, asyncio as the broker's remoting port) reads RocketMQ remoting frames
(broker/remoting/frame.py), answers each send with a response frame carrying the fields a send answer carries,
and pushes the body to every connection that subscribed, in a frame of its own. The client encodes a send as
Sluice's remoting transport does (the same header fields) and decodes the answer. No store, no checks, no
indexing: one synchronous sender here (``sync_sends``) and the end-to-end latency through it (``latency``) are the
least a Python client and server pay for a remoting call on this machine."""

from __future__ import annotations

import select
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from bench.peers.figures import Latency, Throughput, latency_of
from bench.peers.pacing import LatencyConsumer, paced, seq_of, stamp
from bench.peers.processes import Server

if TYPE_CHECKING:
    from broker.remoting.command import RemotingCommand

SEND, PUSH, SUBSCRIBE = 310, 11, 34  # SEND_MESSAGE_V2, PULL_MESSAGE (a pushed body), HEART_BEAT (subscribe)

RELAY_SERVER = """
import asyncio, struct
from broker.remoting.command import RemotingCommand
from broker.remoting.frame import body_length, decode_frame, encode_frame
subscribers = []
async def serve(reader, writer):
    try:
        while True:
            prefix = await reader.readexactly(4)
            command = decode_frame(await reader.readexactly(body_length(prefix)))
            if command.code == 34:
                subscribers.append(writer)
                writer.write(encode_frame(command.response(0)))
                continue
            push = encode_frame(RemotingCommand(11, ext_fields={"queueId": "0"}, body=command.body))
            for s in subscribers:
                s.write(push)
            writer.write(encode_frame(command.response(0, ext_fields={
                "msgId": "7F00000100002A9F0000000000000000", "queueId": "0", "queueOffset": "0",
                "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"})))
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


class TcpRelay:
    name = "tcp-relay"
    batches = False

    def __init__(self) -> None:
        self.workdir = Path()
        self.server: Server | None = None
        self.port = 0

    def start(self, workdir: Path) -> str:
        self.workdir = workdir
        return f"python {sys.version.split()[0]} asyncio"

    def _relay(self) -> Server:
        server = Server([sys.executable, "-c", RELAY_SERVER], self.workdir / f"{self.name}-{time.monotonic_ns()}.log")
        server.wait_for(lambda: server.log_text().strip().isdigit(), "TCP relay")
        self.port = int(server.log_text())
        return server

    def throughput(self, size_b: int, count: int, run: str) -> Throughput:
        raise NotImplementedError("the TCP relay is a floor of single calls only")

    def sync_sends(self, count: int, size_b: int) -> float:
        server = self._relay()
        try:
            with FramedSender(self.port) as send:
                body = b"x" * size_b
                send(body)
                t0 = time.perf_counter()
                for _ in range(count):
                    send(body)
                return count / (time.perf_counter() - t0)
        finally:
            server.stop()

    def latency(self, rate_per_s: int, count: int, size_b: int) -> Latency:
        server = self._relay()
        try:
            consumer = LatencyConsumer(tcp_latency_consumer, self.port, count)
            sent_at: dict[int, float] = {}
            with FramedSender(self.port) as send:
                t0 = time.monotonic()
                for seq, due in paced(rate_per_s, count):
                    sent_at[seq] = due
                    send(stamp(seq, size_b))
                send_wall_s = time.monotonic() - t0
            return latency_of(sent_at, consumer.received(), rate_per_s, size_b, send_wall_s)
        finally:
            server.stop()

    def stop(self) -> None:
        pass


class FramedSender:
    """One synchronous sender: a send's frame encoded as the remoting transport encodes one, its answer read and
    decoded, in the caller's thread."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.opaque = 0

    def __call__(self, body: bytes) -> None:
        from broker.remoting.command import RemotingCommand
        from broker.remoting.frame import encode_frame
        from broker.remoting.message_properties import format_properties

        self.opaque += 1
        ext = {"a": "bench", "b": "bench-topic", "c": "TBW102", "d": "4", "e": "0", "f": "0",
               "g": str(int(time.time() * 1000)), "h": "0", "i": format_properties({"UNIQ_KEY": f"{self.opaque:032X}"}),
               "j": "0", "k": "false", "m": "false"}
        self.sock.sendall(encode_frame(RemotingCommand(SEND, opaque=self.opaque, ext_fields=ext, body=body)))
        answer = read_frame(self.sock)
        assert answer.opaque == self.opaque and answer.ext_fields["msgId"]

    def __enter__(self) -> FramedSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def read_frame(sock: socket.socket) -> RemotingCommand:
    from broker.remoting.frame import PREFIX_BYTES, body_length, decode_frame

    def exactly(n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = sock.recv(left)
            if not chunk:
                raise ConnectionError("the TCP relay closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    return decode_frame(exactly(body_length(exactly(PREFIX_BYTES))))


def tcp_latency_consumer(port: int, *, ready: Callable[[], None], more: Callable[[int], bool]) -> dict[int, float]:
    from broker.remoting.command import RemotingCommand
    from broker.remoting.frame import encode_frame

    received_at: dict[int, float] = {}
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(encode_frame(RemotingCommand(SUBSCRIBE)))
        read_frame(sock)  # subscribed: every body sent from now on is pushed here
        ready()
        while more(len(received_at)):
            if select.select([sock], [], [], 0.2)[0]:
                pushed = read_frame(sock)
                received_at[seq_of(pushed.body)] = time.monotonic()
    return received_at
