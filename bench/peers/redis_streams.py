"""The Redis Streams peer: ``redis-server`` with AOF every second, redis-py with hiredis (pipelined XADD,
XREADGROUP with the previous batch's XACK in the same round trip)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.peers.figures import Latency, Throughput, latency_of
from bench.peers.pacing import LatencyConsumer, paced, seq_of, stamp
from bench.peers.processes import ServerPeer, start_server
from bench.peers.settings import BATCH_MSGS


class RedisStreams(ServerPeer):
    name = "redis"
    port = 0  # the server's, once started

    def start(self, workdir: Path) -> str:
        def args(data: Path, port: int) -> list[str]:
            return ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(data), "--appendonly", "yes",
                    "--appendfsync", "everysec", "--save", "", "--daemonize", "no", "--protected-mode", "yes"]

        self.server, _, self.port = start_server("redis", "redis-server", workdir, args)
        return str(self.client().info("server")["redis_version"])

    def client(self) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port)

    def throughput(self, size_b: int, count: int, run: str) -> Throughput:
        key = f"bench-{run}-{size_b}"
        payload = os.urandom(size_b)
        r = self.client()
        t0 = time.perf_counter()
        for start in range(0, count, BATCH_MSGS):
            pipe = r.pipeline(transaction=False)
            for _ in range(min(BATCH_MSGS, count - start)):
                pipe.xadd(key, {"d": payload})
            pipe.execute()
        produce_s = time.perf_counter() - t0
        r.xgroup_create(key, "g", id="0")
        t0 = time.perf_counter()
        received, ids = 0, list[bytes]()
        while received < count:
            pipe = r.pipeline(transaction=False)
            if ids:
                pipe.xack(key, "g", *ids)
            pipe.xreadgroup("g", "c", {key: ">"}, count=BATCH_MSGS)
            reply = pipe.execute()[-1]
            entries = reply[0][1] if reply else []
            if not entries:
                raise RuntimeError(f"redis: stream ended after {received} of {count} messages")
            assert all(len(fields[b"d"]) == size_b for _, fields in entries)
            ids = [entry_id for entry_id, _ in entries]
            received += len(entries)
        r.xack(key, "g", *ids)
        consume_s = time.perf_counter() - t0
        r.delete(key)
        return Throughput(size_b, count, produce_s, consume_s)

    def sync_sends(self, count: int, size_b: int) -> float:
        """Sends a second of one synchronous sender: XADD after XADD, each waiting for its reply."""
        r = self.client()
        payload = os.urandom(size_b)
        r.xadd("bench-sync-sender", {"d": payload})
        t0 = time.perf_counter()
        for _ in range(count):
            r.xadd("bench-sync-sender", {"d": payload})
        rate = count / (time.perf_counter() - t0)
        r.delete("bench-sync-sender")
        return rate

    def latency(self, rate_per_s: int, count: int, size_b: int) -> Latency:
        self.latency_runs += 1  # each round of a rate on a key of its own
        key = f"bench-latency-{rate_per_s}-{self.latency_runs}"
        producer = self.client()
        producer.xgroup_create(key, "g", id="$", mkstream=True)
        consumer = LatencyConsumer(redis_latency_consumer, self.port, key, count)
        sent_at: dict[int, float] = {}
        t0 = time.monotonic()
        for seq, due in paced(rate_per_s, count):
            sent_at[seq] = due
            producer.xadd(key, {"d": stamp(seq, size_b)})
        send_wall_s = time.monotonic() - t0
        return latency_of(sent_at, consumer.received(), rate_per_s, size_b, send_wall_s)


def redis_latency_consumer(
    port: int, key: str, *, ready: Callable[[], None], more: Callable[[int], bool]
) -> dict[int, float]:
    import redis

    r: Any = redis.Redis(host="127.0.0.1", port=port)  # Any: redis-py's reply types are unions of everything
    r.ping()
    ready()
    received_at: dict[int, float] = {}
    while more(len(received_at)):
        reply = r.xreadgroup("g", "c", {key: ">"}, count=100, block=100)
        now = time.monotonic()
        entries = reply[0][1] if reply else []
        for _, fields in entries:
            received_at[seq_of(fields[b"d"])] = now
        if entries:
            r.xack(key, "g", *[entry_id for entry_id, _ in entries])
    return received_at
