"""The latency floors: ``bench.hops``' bare grpcio relay, a call a message or on streams, timed as the brokers are.

Apart from the brokers because it stores and checks nothing: its rows are what Python gRPC costs here."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.hops import GRPC_SERVER as RELAY_SERVER
from bench.hops import relay_receive, relay_sender, relay_stream_receive
from bench.peers.figures import Latency, Throughput, latency_of
from bench.peers.pacing import LatencyConsumer, paced, stamp
from bench.peers.processes import Server


class GrpcRelay:
    """The floor of the latency rows: ``bench.hops``'s bare grpcio relay (a ``Put`` appends the body to a list and
    wakes a held ``Get``, which answers at once), measured exactly as the brokers are (same pacing, same consumer
    process, same clock). No store, no checks, no encoding: the least any broker reached through Python gRPC pays
    on this machine, at each rate, with a call a message."""

    name = "relay"
    batches = False
    streams = False

    def __init__(self) -> None:
        self.workdir = Path()
        self.run = 0

    def start(self, workdir: Path) -> str:
        from importlib.metadata import version

        self.workdir = workdir
        return f"grpcio {version('grpcio')}"

    def throughput(self, size_b: int, count: int, run: str) -> Throughput:
        raise NotImplementedError("the relay is a latency floor only")

    def latency(self, rate_per_s: int, count: int, size_b: int) -> Latency:
        import grpc

        self.run += 1  # a relay of its own per run: its Get counts bodies from the first
        server = Server([sys.executable, "-c", RELAY_SERVER], self.workdir / f"{self.name}-{self.run}.log")
        try:
            server.wait_for(lambda: server.log_text().strip().isdigit(), "grpcio relay")
            port = int(server.log_text())
            consumer = LatencyConsumer(relay_latency_consumer, port, size_b, self.streams, count)
            sent_at: dict[int, float] = {}
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                put, end = relay_sender(channel, self.streams)
                t0 = time.monotonic()
                for seq, due in paced(rate_per_s, count):
                    sent_at[seq] = due
                    put(stamp(seq, size_b))
                send_wall_s = time.monotonic() - t0
                end()
            return latency_of(sent_at, consumer.received(), rate_per_s, size_b, send_wall_s)
        finally:
            server.stop()

    def stop(self) -> None:
        pass


class GrpcStreamRelay(GrpcRelay):
    """The relay with streams instead of a call a message (``bench.hops``' ``relay-streams``): the sender's puts on
    one bidirectional stream, the bodies pushed to the consumer on one server stream. What a broker protocol built
    on streams could reach through Python gRPC; Sluice's protocol is a call a message."""

    name = "relay-streams"
    streams = True


def relay_latency_consumer(
    port: int, size_b: int, streams: bool, *, ready: Callable[[], None], more: Callable[[int], bool]
) -> dict[int, float]:
    receive = relay_stream_receive if streams else relay_receive
    return receive(port, size_b, ready, more, time.monotonic)
