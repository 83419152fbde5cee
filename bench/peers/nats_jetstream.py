"""The NATS JetStream peer: ``nats-server -js`` with file storage, nats-py (``publish_async``, pull ``fetch``
with AckAll)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.peers.figures import Latency, Throughput, latency_of
from bench.peers.pacing import LatencyConsumer, seq_of, stamp
from bench.peers.processes import ServerPeer, start_server
from bench.peers.settings import BATCH_MSGS, LATENCY_MAX_WALL_S, RECEIVE_TIMEOUT_S


class NatsJetStream(ServerPeer):
    name = "nats"
    port = 0  # the server's, once started

    def start(self, workdir: Path) -> str:
        def args(store: Path, port: int) -> list[str]:
            return ["-js", "-sd", str(store), "-a", "127.0.0.1", "-p", str(port)]

        self.server, binary, self.port = start_server("nats", "nats-server", workdir, args)
        version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False).stdout
        return version.strip().removeprefix("nats-server: ")

    def throughput(self, size_b: int, count: int, run: str) -> Throughput:
        return asyncio.run(self._throughput(f"BENCH{run.upper()}{size_b}", size_b, count))

    async def _stream(self, name: str) -> tuple[Any, Any, str]:
        import nats
        from nats.js.api import StorageType

        nc = await nats.connect(f"nats://127.0.0.1:{self.port}")
        js = nc.jetstream(publish_async_max_pending=4000)
        subject = f"{name}.data"
        await js.add_stream(name=name, subjects=[subject], storage=StorageType.FILE)
        return nc, js, subject

    async def _consumer(self, js: Any, name: str, subject: str) -> Any:
        from nats.js.api import AckPolicy, ConsumerConfig

        config = ConsumerConfig(ack_policy=AckPolicy.ALL, max_ack_pending=4 * BATCH_MSGS, max_waiting=16)
        return await js.pull_subscribe(subject, durable="c", stream=name, config=config)

    async def _throughput(self, name: str, size_b: int, count: int) -> Throughput:
        nc, js, subject = await self._stream(name)
        payload = os.urandom(size_b)
        t0 = time.perf_counter()
        acks = [await js.publish_async(subject, payload) for _ in range(count)]
        await asyncio.gather(*acks)  # raises if any publish was refused
        produce_s = time.perf_counter() - t0
        sub = await self._consumer(js, name, subject)
        t0 = time.perf_counter()
        received = 0
        while received < count:
            msgs = await sub.fetch(min(BATCH_MSGS, count - received), timeout=RECEIVE_TIMEOUT_S)
            assert all(len(m.data) == size_b for m in msgs)
            await msgs[-1].ack()  # AckAll: acknowledges the whole batch
            received += len(msgs)
        await nc.flush()
        consume_s = time.perf_counter() - t0
        await js.delete_stream(name)
        await nc.close()
        return Throughput(size_b, count, produce_s, consume_s)

    def latency(self, rate_per_s: int, count: int, size_b: int) -> Latency:
        return asyncio.run(self._latency(rate_per_s, count, size_b))

    async def _latency(self, rate_per_s: int, count: int, size_b: int) -> Latency:
        self.latency_runs += 1  # each round of a rate on a stream of its own
        name = f"BENCHLAT{rate_per_s}R{self.latency_runs}"
        nc, js, subject = await self._stream(name)
        consumer = LatencyConsumer(nats_latency_consumer, self.port, name, subject, count)
        sent_at: dict[int, float] = {}
        t0 = time.monotonic()
        start = t0 + 0.05
        for seq in range(count):
            due = start + seq / rate_per_s
            if time.monotonic() - start > LATENCY_MAX_WALL_S:
                break  # can't keep the rate: stop, as paced() does
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            sent_at[seq] = due
            await js.publish(subject, stamp(seq, size_b))
        send_wall_s = time.monotonic() - t0
        received_at = await asyncio.get_running_loop().run_in_executor(None, consumer.received)
        await js.delete_stream(name)
        await nc.close()
        return latency_of(sent_at, received_at, rate_per_s, size_b, send_wall_s)


def nats_latency_consumer(
    port: int, stream: str, subject: str, *, ready: Callable[[], None], more: Callable[[int], bool]
) -> dict[int, float]:
    async def consume() -> dict[int, float]:
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig

        nc = await nats.connect(f"nats://127.0.0.1:{port}")
        config = ConsumerConfig(ack_policy=AckPolicy.ALL, max_ack_pending=4 * BATCH_MSGS)
        sub = await nc.jetstream().pull_subscribe(subject, durable="lat", stream=stream, config=config)
        ready()
        received_at: dict[int, float] = {}
        while more(len(received_at)):
            try:
                msgs = await sub.fetch(100, timeout=0.1)
            except TimeoutError:  # nats.errors.TimeoutError, or asyncio's re-raised by fetch: nothing arrived yet
                continue
            now = time.monotonic()
            for m in msgs:
                received_at[seq_of(m.data)] = now
            if msgs:
                await msgs[-1].ack()
        await nc.close()
        return received_at

    return asyncio.run(consume())
