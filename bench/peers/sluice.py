"""Sluice as a peer: a broker subprocess and broker.client (``send_batch``, ``pull``, ``pull_raw``, and a
PushConsumer's listener for latency). ``bench.timeline`` starts its broker through this class too."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.hops import wait_push_ready
from bench.peers.figures import Latency, Throughput, latency_of
from bench.peers.pacing import LatencyConsumer, paced, seq_of, stamp
from bench.peers.processes import Server, ServerPeer
from bench.peers.settings import BATCH_MSGS, RECEIVE_TIMEOUT_S, SERVER_START_TIMEOUT_S


class SluiceBroker(ServerPeer):
    name = "sluice"
    ready_port = re.compile(r"\bready\b.*?:(\d+)|:(\d+).*\bready\b")  # "sluice broker ready on HOST:PORT ..."

    def __init__(self, launcher: list[str] | None = None) -> None:
        super().__init__()
        self.endpoint = ""  # the broker's gRPC port: topics are created there
        self.sync_runs = 0
        self.client_endpoint = ""  # where the producers and consumers go (the gRPC port, or remoting:// in a subclass)
        # What runs `broker ...`: ``python -m broker``, or a wrapper that does more first (bench.timeline's)
        self.launcher = launcher or [sys.executable, "-m", "broker"]

    def start(self, workdir: Path) -> str:
        from importlib.metadata import version

        store = workdir / self.name
        args = [*self.launcher, "broker", "--store", str(store), "--listen", "127.0.0.1:0", *self.extra_args()]
        self.server = Server(args, workdir / "sluice.log")
        self.server.wait_for(lambda: self._ready_port() is not None, "sluice broker")
        self.endpoint = self.client_endpoint = f"127.0.0.1:{self._ready_port()}"
        return version("sluice")

    def extra_args(self) -> list[str]:
        """More ``broker`` flags (a subclass's)."""
        return []

    def latency_consumer(self) -> Callable[..., dict[int, float]]:
        """The latency run's receiving side (a module-level function: it runs in a spawned process)."""
        return sluice_latency_consumer

    def _ready_port(self) -> int | None:
        assert self.server is not None
        for line in self.server.log_text().splitlines():
            match = self.ready_port.search(line)
            if match:
                return int(match.group(1) or match.group(2))
        return None

    def throughput(self, size_b: int, count: int, run: str) -> Throughput:
        from broker.client import Admin, Message, Producer

        topic = f"bench-{run}-{size_b}"
        with Admin(self.endpoint) as admin:
            admin.create_topic(topic, queues=1)
        payload = os.urandom(size_b)
        with Producer(self.client_endpoint) as producer:
            t0 = time.perf_counter()
            for start in range(0, count, BATCH_MSGS):
                batch = [Message(topic, payload) for _ in range(min(BATCH_MSGS, count - start))]
                results = producer.send_batch(batch, queue_id=0)
                assert len(results) == len(batch)
            produce_s = time.perf_counter() - t0
        index_wait_s = self._wait_indexed(topic, count)
        consume_s = self._consume(topic, count, size_b, "pull")
        consume_raw_s = self._consume(topic, count, size_b, "raw")
        consume_eager_s = self._consume(topic, count, size_b, "eager")
        return Throughput(size_b, count, produce_s, consume_s, consume_raw_s, index_wait_s, consume_eager_s)

    def _wait_indexed(self, topic: str, count: int) -> float:
        """Seconds until the dispatcher has indexed all ``count`` messages. Without this wait the first consume
        (the decoded one) would also wait out the indexing that follows the produce, and the second not."""
        from broker.client import PullConsumer

        t0 = time.perf_counter()
        with PullConsumer(self.endpoint, "bench-index-wait") as consumer:
            while consumer.queue_offsets(topic)[0][1] < count:
                if time.perf_counter() - t0 > RECEIVE_TIMEOUT_S:
                    raise RuntimeError(f"sluice: fewer than {count} messages indexed after {RECEIVE_TIMEOUT_S} s")
                time.sleep(0.01)
        return time.perf_counter() - t0

    def _consume(self, topic: str, count: int, size_b: int, mode: str) -> float:
        """Seconds to pull the whole queue, committing offsets on each pull. ``mode``: "pull" (PullConsumer.pull),
        "raw" (pull_raw, entries not decoded) or "eager" (pull_raw, then decode_entry on every entry and its tags
        read, as a client that decodes every field up front would)."""
        from broker.client import PullConsumer
        from broker.format.message import decode_entry

        with PullConsumer(self.client_endpoint, f"bench-{mode}") as consumer:
            t0 = time.perf_counter()
            offset = 0
            while offset < count:
                # A long-poll timeout, in case a pull finds the queue's end before the last batch is visible.
                if mode == "pull":
                    result = consumer.pull(topic, 0, offset, BATCH_MSGS, timeout_ms=1000, commit_offset=offset)
                    assert all(len(m.body) == size_b for m in result.messages)
                    got, status, next_offset = len(result.messages), result.status, result.next_begin_offset
                else:
                    raw = consumer.pull_raw(topic, 0, offset, BATCH_MSGS, timeout_ms=1000, commit_offset=offset)
                    if mode == "eager":
                        starts = raw.entry_positions
                        ends = [*starts[1:], len(raw.buffer)]
                        decoded = [decode_entry(raw.buffer, p, e) for p, e in zip(starts, ends, strict=True)]
                        assert all(len(m.body) == size_b and m.tags is None for m in decoded)
                    got, status, next_offset = len(raw.entry_positions), raw.status, raw.next_begin_offset
                if got == 0:
                    raise RuntimeError(f"sluice: {status.name} after {offset} of {count} messages")
                offset = next_offset
            consumer.commit_offsets({(topic, 0): offset})
            return time.perf_counter() - t0

    def latency(self, rate_per_s: int, count: int, size_b: int) -> Latency:
        from broker.client import Admin, Message, Producer

        self.latency_runs += 1  # each round of a rate on a topic of its own
        topic = f"bench-latency-{rate_per_s}-{self.latency_runs}"
        with Admin(self.endpoint) as admin:
            admin.create_topic(topic, queues=1)
        consumer = LatencyConsumer(self.latency_consumer(), self.client_endpoint, topic, count)
        sent_at: dict[int, float] = {}
        t0 = time.monotonic()
        with Producer(self.client_endpoint) as producer:
            for seq, due in paced(rate_per_s, count):
                sent_at[seq] = due
                producer.send(Message(topic, stamp(seq, size_b)), queue_id=0)
        send_wall_s = time.monotonic() - t0
        return latency_of(sent_at, consumer.received(), rate_per_s, size_b, send_wall_s)

    def sync_sends(self, count: int, size_b: int) -> float:
        """Sends a second of one synchronous sender: ``Producer.send`` in a loop, each waiting for its answer."""
        from broker.client import Admin, Message, Producer

        self.sync_runs += 1
        topic = f"bench-sync-sender-{self.sync_runs}"
        with Admin(self.endpoint) as admin:
            admin.create_topic(topic, queues=1)
        body = os.urandom(size_b)
        with Producer(self.client_endpoint) as producer:
            producer.send(Message(topic, body), queue_id=0)  # connection and route
            t0 = time.perf_counter()
            for _ in range(count):
                producer.send(Message(topic, body), queue_id=0)
            return count / (time.perf_counter() - t0)


def sluice_latency_consumer(
    endpoint: str, topic: str, *, ready: Callable[[], None], more: Callable[[int], bool]
) -> dict[int, float]:
    """A PushConsumer's listener, as an application receives messages (its pulls held on a PullStream)."""
    from broker.client import FIRST, PushConsumer

    received_at: dict[int, float] = {}

    def listener(messages: list[Any]) -> None:  # returns nothing: consumed
        now = time.monotonic()
        for m in messages:
            received_at[seq_of(m.body)] = now

    with PushConsumer(endpoint, f"group-{topic}", {topic: "*"}, listener, consume_from=FIRST) as consumer:
        wait_push_ready(consumer, SERVER_START_TIMEOUT_S)
        ready()
        while more(len(received_at)):
            time.sleep(0.01)
    return received_at
