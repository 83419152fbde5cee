"""What a compared system offers (start, throughput, latency, stop) and the systems by their ``--systems`` names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from bench.peers.figures import Latency, Throughput
from bench.peers.nats_jetstream import NatsJetStream
from bench.peers.redis_streams import RedisStreams
from bench.peers.relay import GrpcRelay, GrpcStreamRelay
from bench.peers.sluice import SluiceBroker
from bench.peers.sluice_remoting import SluiceRemoting
from bench.peers.tcp_floor import TcpRelay


class System(Protocol):
    name: str
    batches: bool  # False: a latency floor, not a broker (no throughput runs)

    def start(self, workdir: Path) -> str: ...  # returns the server's version
    def throughput(self, size_b: int, count: int, run: str) -> Throughput: ...
    def latency(self, rate_per_s: int, count: int, size_b: int) -> Latency: ...
    def stop(self) -> None: ...


SYSTEMS: dict[str, Callable[[], System]] = {
    "sluice": SluiceBroker, "redis": RedisStreams, "nats": NatsJetStream, "relay": GrpcRelay,
    "relay-streams": GrpcStreamRelay, "sluice-remoting": SluiceRemoting, "tcp-relay": TcpRelay,
}
