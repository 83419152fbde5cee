"""Sluice beside Redis Streams and NATS JetStream, and beside the limits of this machine.

    python -m bench.peers [--systems sluice,redis,nats,relay,relay-streams] [--scale 1.0] [--rounds 1]
                          [--latency-rates 5000,250] [--no-charts]

Same machine, loopback, same message count and size, each system through its standard Python client:

- **Redis Streams**: Debian's ``redis-server`` (AOF, ``appendfsync everysec``), redis-py with hiredis; produce =
  pipelined XADD, consume = XREADGROUP with the previous batch's XACK pipelined in the same round trip.
- **NATS JetStream**: Debian's ``nats-server -js`` (file storage), nats-py; produce = ``publish_async`` (up to
  4000 acks pending), consume = pull ``fetch`` with AckAll, acking the last message of each batch.
- **Sluice**: a broker subprocess (``python -m broker broker``, ASYNC_FLUSH), broker.client; produce =
  ``Producer.send_batch``, consume = ``PullConsumer.pull`` carrying the commit offset (and, as a second figure,
  ``pull_raw``, which leaves entries encoded as the Spark connector reads them, and as a third ``pull_raw`` with
  ``decode_entry`` on every entry, every field decoded up front). All are timed once the broker has indexed the
  whole queue (the wait after the produce is recorded as ``index_wait_s``).
- **The relay** (latency rows only): ``bench.hops``'s bare grpcio relay, a ``Put`` that wakes a held ``Get``, sent to
  and read from exactly as the brokers are. It stores and checks nothing: its rows are what any broker reached
  through Python gRPC with a call a message pays at least on this machine, rate by rate. **relay-streams**: the
  same relay with the puts on one bidirectional stream and the bodies pushed on one server stream (``bench.hops``
  says more): what a protocol built on streams could reach.

Every system gets one stream / one queue, batches of ``BATCH_MSGS`` messages, an uncounted warm-up run, and
flushes to disk asynchronously (Redis every second, NATS on its sync interval, Sluice every 500 ms). The clients
all run in this process, which keeps large freed blocks for reuse (``broker.client.tune_malloc()``, as a producer
that sends large batches is advised to): the same for every client; ``--default-malloc`` leaves glibc's defaults.

End-to-end latency, at a fixed 5k msgs/s (a broker's load, more than one sender may carry) and at 250 msgs/s (a
rate every system's single sends sustain here, so the figures show the systems rather than queueing behind a
saturated sender): the producer sends single messages with the synchronous API at a fixed rate; the consumer
runs in its own process (Sluice's a PushConsumer, the time taken in its listener); latency = receive time -
scheduled send time, so a sender that falls behind the rate
counts against its system (the achieved rate is reported beside; a sender that can't keep up stops after
``LATENCY_MAX_WALL_S``).

The limits: sequential disk write bandwidth with fdatasync (the ceiling for sustained produce), and gRPC on
loopback with 1 MiB messages through a trivial sink/source service in another process (the ceiling of any
gRPC broker in Python here). Sluice's MB/s are printed as ratios of them, and its consume rates as ratios of the peers'.
With Sluice among the systems, ``bench.hops`` follows: a message's time hop by hop, each beside its floor here (a
bare grpcio round trip, a thread wake-up).

The peers are started by the benchmark from their Debian packages (installed with apt-get when missing) on free
loopback ports, in a temporary directory removed at the end. Their clients are benchmark-only packages
(``pip install redis hiredis nats-py matplotlib``). Writes bench/results/peers.json and the charts
bench/results/peers_throughput.png and bench/results/peers_latency.png. Other load on the machine skews every
figure: the load average at start and end is recorded in the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from bench.hops import GRPC_SERVER as RELAY_SERVER
from bench.hops import Hop, ServerCpu, print_hops, relay_receive, relay_sender, relay_stream_receive, wait_push_ready
from bench.hops import measure as measure_hops

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SIZES_B = (100, 1024)
COUNT_BY_SIZE = {100: 200_000, 1024: 100_000}  # at scale 1.0
WARMUP_FRACTION = 10  # each measured run follows an uncounted one of a tenth of its size (caches, first routes)
BATCH_MSGS = 1000  # pipeline depth / batch / fetch size, the same for every system
HOPS_CALLS = 2000  # samples per hop of bench.hops
LATENCY_RATES_PER_S = (5000, 250)  # a broker's load, and a rate every system's single sends sustain here
LATENCY_DURATION_S = 3.0
LATENCY_SIZE_B = 100
LATENCY_WARMUP_MSGS = 500  # dropped from the percentiles: connection set-up, first topic route
LATENCY_MIN_SAMPLES = 2000  # at low rates the run lasts longer, so that p99 rests on enough samples
LATENCY_MAX_WALL_S = 12.0  # a sender that can't keep the rate stops after this long (reported as achieved rate)
MAX_ROUNDS = 10  # each round stores every message count again: disk and time grow with it
IDLE_AFTER_DONE_S = 1.0
RECEIVE_TIMEOUT_S = 60.0  # a consumer that sees nothing new for this long fails the run
SERVER_START_TIMEOUT_S = 30.0
DISK_PROBE_BYTES = 512 * 1024 * 1024
DISK_BLOCK_BYTES = 1024 * 1024
DISK_SYNC_EVERY_BYTES = 16 * 1024 * 1024
GRPC_PROBE_MSG_BYTES = 1024 * 1024
GRPC_PROBE_CALLS = 512
MB = 1_000_000


# ---- results ----------------------------------------------------------------------------------------------


@dataclass
class Throughput:
    size_b: int
    count: int
    produce_s: float
    consume_s: float
    consume_raw_s: float | None = None  # Sluice only: pull_raw, entries left encoded (the Spark connector's path)
    index_wait_s: float | None = None  # Sluice only: from the last send's answer until the queue was fully indexed
    consume_eager_s: float | None = None  # Sluice only: pull_raw + decode_entry per entry (eager decoding)

    @property
    def produce_msgs_s(self) -> float:
        return self.count / self.produce_s

    @property
    def consume_msgs_s(self) -> float:
        return self.count / self.consume_s

    @property
    def produce_mb_s(self) -> float:
        return self.count * self.size_b / self.produce_s / MB

    @property
    def consume_mb_s(self) -> float:
        return self.count * self.size_b / self.consume_s / MB

    def to_json(self) -> dict[str, float]:
        out = {
            "size_b": self.size_b, "count": self.count, "produce_s": round(self.produce_s, 4),
            "consume_s": round(self.consume_s, 4), "produce_msgs_s": round(self.produce_msgs_s),
            "consume_msgs_s": round(self.consume_msgs_s), "produce_mb_s": round(self.produce_mb_s, 2),
            "consume_mb_s": round(self.consume_mb_s, 2),
        }  # fmt: skip
        if self.consume_raw_s is not None:
            out["consume_raw_s"] = round(self.consume_raw_s, 4)
            out["consume_raw_msgs_s"] = round(self.count / self.consume_raw_s)
        if self.index_wait_s is not None:
            out["index_wait_s"] = round(self.index_wait_s, 4)
        if self.consume_eager_s is not None:
            out["consume_eager_s"] = round(self.consume_eager_s, 4)
            out["consume_eager_msgs_s"] = round(self.count / self.consume_eager_s)
        return out


def best_of(runs: list[Throughput]) -> Throughput:
    """The shortest time of each figure over rounds: on a shared machine the other load only ever adds time."""

    def least(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return min(known) if known else None

    return Throughput(
        runs[0].size_b, runs[0].count, min(r.produce_s for r in runs), min(r.consume_s for r in runs),
        least([r.consume_raw_s for r in runs]), least([r.index_wait_s for r in runs]),
        least([r.consume_eager_s for r in runs]),
    )  # fmt: skip


@dataclass
class Latency:
    rate_per_s: int  # the rate asked for
    achieved_rate_per_s: float  # below rate_per_s when single sends can't keep up (then latency grows)
    size_b: int
    sent: int
    received: int
    p50_ms: float
    p99_ms: float
    max_ms: float


@dataclass
class SystemResult:
    name: str
    version: str = ""
    throughput: list[Throughput] = field(default_factory=list)
    latency: list[Latency] = field(default_factory=list)  # one per asked rate
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "throughput": {str(t.size_b): t.to_json() for t in self.throughput},
            "latency": {str(lat.rate_per_s): asdict(lat) for lat in self.latency},
            "error": self.error,
        }


def latency_of(
    sent_at: dict[int, float], received_at: dict[int, float], rate: int, size_b: int, send_wall_s: float
) -> Latency:
    keys = [k for k in sorted(received_at) if k >= LATENCY_WARMUP_MSGS and k in sent_at]
    ms = np.array([(received_at[k] - sent_at[k]) * 1000 for k in keys])
    if len(ms) == 0:
        raise RuntimeError(f"no message past the first {LATENCY_WARMUP_MSGS} was received in the latency run")
    lost = set(sent_at) - set(received_at)
    if lost:
        raise RuntimeError(f"{len(lost)} of {len(sent_at)} sent messages never arrived (first {sorted(lost)[:5]})")
    achieved = len(sent_at) / send_wall_s
    return Latency(
        rate, round(achieved, 1), size_b, len(sent_at), len(received_at), float(np.percentile(ms, 50)),
        float(np.percentile(ms, 99)), float(ms.max()),
    )  # fmt: skip


def stamp(seq: int, size_b: int) -> bytes:
    """A latency message: its sequence number, then padding up to size_b."""
    return seq.to_bytes(8, "big") + b"x" * (size_b - 8)


def seq_of(body: bytes) -> int:
    return int.from_bytes(body[:8], "big")


def paced(rate_per_s: int, count: int) -> Iterator[tuple[int, float]]:
    """(sequence, scheduled time) at a fixed rate; sleeps until each scheduled time (monotonic clock). Stops
    early, after LATENCY_MAX_WALL_S, when the sender can't keep up: the run stays bounded in time."""
    start = time.monotonic() + 0.05
    for seq in range(count):
        due = start + seq / rate_per_s
        now = time.monotonic()
        if now - start > LATENCY_MAX_WALL_S:
            return
        if due > now:
            time.sleep(due - now)
        yield seq, due


class LatencyConsumer:
    """The receiving side of a latency run, in its own process (spawned: no GIL shared with the producer, no
    forked gRPC state). time.monotonic() is the system-wide CLOCK_MONOTONIC, so times compare across processes.

    The consumer function subscribes, calls ready(), then receives while more(received count) is true and
    returns {sequence: receive time}. more() turns false when everything arrived, when the producer is done and
    nothing came for a second, or after RECEIVE_TIMEOUT_S."""

    def __init__(self, fn: Callable[..., dict[int, float]], *args: Any) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._ready = ctx.Event()
        self._done = ctx.Event()
        self._results: Any = ctx.Queue()
        target_args = (fn, args, self._ready, self._done, self._results)
        self._proc = ctx.Process(target=_consumer_main, args=target_args, daemon=True)
        self._proc.start()
        if not self._ready.wait(SERVER_START_TIMEOUT_S):
            self._proc.kill()
            raise RuntimeError(f"latency consumer {fn.__name__} did not subscribe within {SERVER_START_TIMEOUT_S}s")

    def received(self) -> dict[int, float]:
        """Call when the producer is done: the consumer's {sequence: receive time}."""
        self._done.set()
        try:
            result: dict[int, float] | str = self._results.get(timeout=RECEIVE_TIMEOUT_S + 30)
        finally:
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.kill()
        if isinstance(result, str):
            raise RuntimeError(f"latency consumer failed: {result}")
        return result


class _More:
    def __init__(self, count: int, done: Any) -> None:
        self.count = count
        self.done = done
        self.deadline = time.monotonic() + LATENCY_MAX_WALL_S + RECEIVE_TIMEOUT_S
        self.last_n = 0
        self.last_change = time.monotonic()

    def __call__(self, received: int) -> bool:
        now = time.monotonic()
        if received != self.last_n:
            self.last_n, self.last_change = received, now
        if received >= self.count or now > self.deadline:
            return False
        return not (self.done.is_set() and now - self.last_change > IDLE_AFTER_DONE_S)


def _consumer_main(
    fn: Callable[..., dict[int, float]], args: tuple[Any, ...], ready: Any, done: Any, results: Any
) -> None:
    *head, count = args
    try:
        results.put(fn(*head, ready=ready.set, more=_More(count, done)))
    except Exception as e:  # noqa: BLE001 -- sent to the parent, which raises it with the system's name
        results.put(f"{type(e).__name__}: {e}")


# ---- processes and packages ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_binary(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None
    )


def ensure_debian_package(binary: str, package: str) -> str:
    """Path of `binary`; installs Debian's `package` with apt-get first when it is missing."""
    path = find_binary(binary)
    if path:
        return path
    if os.geteuid() != 0:
        raise RuntimeError(f"{binary} is missing: install it with `sudo apt-get install {package}`")
    print(f"  installing {package} (apt-get)...", flush=True)
    subprocess.run(["apt-get", "update", "-qq"], check=False, capture_output=True)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", package],
        check=True, capture_output=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )  # fmt: skip
    path = find_binary(binary)
    if not path:
        raise RuntimeError(f"apt-get installed {package} but {binary} is still not found")
    return path


class Server:
    """A server subprocess with its output in a log file; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def wait_for(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while not ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start: {self.log_tail()}")
            time.sleep(0.05)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self) -> str:
        return self.log_text()[-2000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


# ---- the systems --------------------------------------------------------------------------------------------


class System(Protocol):
    name: str
    batches: bool  # False: a latency floor, not a broker (no throughput runs)

    def start(self, workdir: Path) -> str: ...  # returns the server's version
    def throughput(self, size_b: int, count: int, run: str) -> Throughput: ...
    def latency(self, rate_per_s: int, count: int, size_b: int) -> Latency: ...
    def stop(self) -> None: ...


class RedisStreams:
    name = "redis"
    batches = True

    def __init__(self) -> None:
        self.server: Server | None = None
        self.port = 0

    def start(self, workdir: Path) -> str:
        binary = ensure_debian_package("redis-server", "redis-server")
        self.port = free_port()
        data = workdir / "redis"
        data.mkdir()
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(data), "--appendonly", "yes",
                "--appendfsync", "everysec", "--save", "", "--daemonize", "no", "--protected-mode", "yes"]  # fmt: skip
        self.server = Server(args, workdir / "redis.log")
        self.server.wait_for(lambda: port_open(self.port), "redis-server")
        version = str(self.client().info("server")["redis_version"])
        return version

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

    def latency(self, rate_per_s: int, count: int, size_b: int) -> Latency:
        key = f"bench-latency-{rate_per_s}"
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

    def stop(self) -> None:
        if self.server:
            self.server.stop()


class NatsJetStream:
    name = "nats"
    batches = True

    def __init__(self) -> None:
        self.server: Server | None = None
        self.port = 0

    def start(self, workdir: Path) -> str:
        binary = ensure_debian_package("nats-server", "nats-server")
        self.port = free_port()
        store = workdir / "nats"
        store.mkdir()
        args = [binary, "-js", "-sd", str(store), "-a", "127.0.0.1", "-p", str(self.port)]
        self.server = Server(args, workdir / "nats.log")
        self.server.wait_for(lambda: port_open(self.port), "nats-server")
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
        name = f"BENCHLAT{rate_per_s}"
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

    def stop(self) -> None:
        if self.server:
            self.server.stop()


class SluiceBroker:
    name = "sluice"
    batches = True
    ready_port = re.compile(r"\bready\b.*?:(\d+)|:(\d+).*\bready\b")  # "sluice broker ready on HOST:PORT ..."

    def __init__(self, launcher: list[str] | None = None) -> None:
        self.server: Server | None = None
        self.endpoint = ""
        # What runs `broker ...`: ``python -m broker``, or a wrapper that does more first (bench.timeline's)
        self.launcher = launcher or [sys.executable, "-m", "broker"]

    def start(self, workdir: Path) -> str:
        from importlib.metadata import version

        store = workdir / "sluice"
        args = [*self.launcher, "broker", "--store", str(store), "--listen", "127.0.0.1:0"]
        self.server = Server(args, workdir / "sluice.log")
        self.server.wait_for(lambda: self._ready_port() is not None, "sluice broker")
        self.endpoint = f"127.0.0.1:{self._ready_port()}"
        return version("sluice")

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
        with Producer(self.endpoint) as producer:
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

        with PullConsumer(self.endpoint, f"bench-{mode}") as consumer:
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

        topic = f"bench-latency-{rate_per_s}"
        with Admin(self.endpoint) as admin:
            admin.create_topic(topic, queues=1)
        consumer = LatencyConsumer(sluice_latency_consumer, self.endpoint, topic, count)
        sent_at: dict[int, float] = {}
        t0 = time.monotonic()
        with Producer(self.endpoint) as producer:
            for seq, due in paced(rate_per_s, count):
                sent_at[seq] = due
                producer.send(Message(topic, stamp(seq, size_b)), queue_id=0)
        send_wall_s = time.monotonic() - t0
        return latency_of(sent_at, consumer.received(), rate_per_s, size_b, send_wall_s)

    def stop(self) -> None:
        if self.server:
            self.server.stop()


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


SYSTEMS: dict[str, Callable[[], System]] = {
    "sluice": SluiceBroker, "redis": RedisStreams, "nats": NatsJetStream, "relay": GrpcRelay,
    "relay-streams": GrpcStreamRelay,
}  # fmt: skip


# The peers' Python clients (and the charts) are benchmark-only packages, not dependencies of Sluice.
BENCH_PACKAGES = {"redis": "redis hiredis", "nats": "nats-py", "matplotlib": "matplotlib"}


def missing_package_hint(e: ModuleNotFoundError) -> str:
    top = (e.name or "").split(".")[0]
    package = BENCH_PACKAGES.get(top, top)
    return f"{e}: install the benchmark's clients with `.venv/bin/pip install {package}`"


def _guarded(result: SystemResult, step: Callable[[], None]) -> None:
    """Run one step of a system's benchmark; a failure is recorded in its result (and ends its part of the run)."""
    try:
        step()
    except ModuleNotFoundError as e:
        result.error = missing_package_hint(e)
        print(f"  {result.name} FAILED: {result.error}", flush=True)
    except Exception as e:  # noqa: BLE001 -- one system failing must not hide the others' figures; reported below
        result.error = f"{type(e).__name__}: {e}"
        print(f"  {result.name} FAILED: {result.error}", flush=True)


def run_systems(
    names: list[str], workdir: Path, scale: float, latency_rates: list[int], rounds: int
) -> list[SystemResult]:
    """Every system started at once; the throughput runs go round the systems ``rounds`` times (so a burst of
    other load on the machine falls on all of them, not on one) and each figure keeps its best round; then the
    latency runs, one system at a time."""
    systems = [SYSTEMS[name]() for name in names]
    results = [SystemResult(system.name) for system in systems]
    runs: dict[tuple[str, int], list[Throughput]] = {}
    try:
        for system, result in zip(systems, results, strict=True):
            print(f"{system.name}: starting", flush=True)

            def start(system: System = system, result: SystemResult = result) -> None:
                result.version = system.start(workdir)

            _guarded(result, start)
        for round_no in range(rounds):
            for system, result in zip(systems, results, strict=True):
                for size_b in SIZES_B:
                    if result.error or not system.batches:
                        break
                    count = max(BATCH_MSGS, int(COUNT_BY_SIZE[size_b] * scale))

                    def measure(
                        system: System = system, size_b: int = size_b, count: int = count, round_no: int = round_no
                    ) -> None:
                        if round_no == 0:  # not counted
                            system.throughput(size_b, max(BATCH_MSGS, count // WARMUP_FRACTION), "warmup")
                        t = system.throughput(size_b, count, f"run{round_no}")
                        print(
                            f"  round {round_no + 1} {system.name} {size_b} B x {count}: produce "
                            f"{t.produce_msgs_s:,.0f} msgs/s, consume {t.consume_msgs_s:,.0f}", flush=True,
                        )  # fmt: skip
                        runs.setdefault((system.name, size_b), []).append(t)

                    _guarded(result, measure)
        for system, result in zip(systems, results, strict=True):
            result.throughput = [best_of(runs[(system.name, b)]) for b in SIZES_B if (system.name, b) in runs]
            for rate in latency_rates:
                if result.error:
                    break
                lat_count = max(LATENCY_WARMUP_MSGS + LATENCY_MIN_SAMPLES, int(rate * LATENCY_DURATION_S))

                def latency(system: System = system, result: SystemResult = result, rate: int = rate,
                            lat_count: int = lat_count) -> None:  # fmt: skip
                    lat = system.latency(rate, lat_count, LATENCY_SIZE_B)
                    result.latency.append(lat)
                    print(f"  {system.name} latency at {rate}/s (achieved {lat.achieved_rate_per_s:,.0f}/s): "
                          f"p50 {lat.p50_ms:.2f} ms", flush=True)  # fmt: skip

                _guarded(result, latency)
    finally:
        for system in systems:
            system.stop()
    return results


# ---- the machine's limits -----------------------------------------------------------------------------------


def disk_write_mb_s(directory: Path) -> float:
    """Sequential 1 MiB writes with fdatasync every 16 MiB and at the end: MB/s that reached the disk."""
    block = os.urandom(DISK_BLOCK_BYTES)
    path = directory / "disk-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        t0 = time.perf_counter()
        written = 0
        while written < DISK_PROBE_BYTES:
            written += os.write(fd, block)
            if written % DISK_SYNC_EVERY_BYTES == 0:
                os.fdatasync(fd)
        os.fdatasync(fd)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
    return written / elapsed / MB


GRPC_SINK_SERVER = """
import sys
from concurrent import futures
import grpc
size_limit = 64 * 1024 * 1024
def put(request, context):
    return b""
def get(request, context):
    return bytes(int.from_bytes(request, "big"))
handlers = {
    "Put": grpc.unary_unary_rpc_method_handler(put, lambda b: b, lambda b: b),
    "Get": grpc.unary_unary_rpc_method_handler(get, lambda b: b, lambda b: b),
}
server = grpc.server(futures.ThreadPoolExecutor(4), options=[
    ("grpc.max_receive_message_length", size_limit), ("grpc.max_send_message_length", size_limit)])
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Sink", handlers),))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print("ready", port, flush=True)
server.wait_for_termination()
"""


def grpc_loopback_mb_s(workdir: Path) -> tuple[float, float]:
    """(upload, download) MB/s of 1 MiB unary calls to a trivial gRPC service in another process."""
    import grpc

    server = Server([sys.executable, "-c", GRPC_SINK_SERVER], workdir / "grpc-sink.log")
    try:
        server.wait_for(lambda: "ready" in server.log_text(), "gRPC sink")
        port = int(server.log_text().split()[1])
        limit = 64 * 1024 * 1024
        options = [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)]
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            put = channel.unary_unary("/bench.Sink/Put")
            get = channel.unary_unary("/bench.Sink/Get")
            payload = os.urandom(GRPC_PROBE_MSG_BYTES)
            size_request = GRPC_PROBE_MSG_BYTES.to_bytes(8, "big")
            put(payload)
            get(size_request)  # warm-up: connection and first allocation
            t0 = time.perf_counter()
            for _ in range(GRPC_PROBE_CALLS):
                put(payload)
            upload_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            for _ in range(GRPC_PROBE_CALLS):
                assert len(get(size_request)) == GRPC_PROBE_MSG_BYTES
            download_s = time.perf_counter() - t0
    finally:
        server.stop()
    total = GRPC_PROBE_MSG_BYTES * GRPC_PROBE_CALLS
    return total / upload_s / MB, total / download_s / MB


# ---- report -------------------------------------------------------------------------------------------------


def print_table(results: list[SystemResult], limits: dict[str, float], ratios: dict[str, float]) -> None:
    print()
    print(f"{'system':<8} {'size':>6} {'produce msgs/s':>15} {'MB/s':>8} {'consume msgs/s':>15} {'MB/s':>8}")
    for r in results:
        if r.error:
            print(f"{r.name:<8} FAILED: {r.error}")
        for t in r.throughput:
            print(
                f"{r.name:<8} {t.size_b:>4} B {t.produce_msgs_s:>15,.0f} {t.produce_mb_s:>8.1f} "
                f"{t.consume_msgs_s:>15,.0f} {t.consume_mb_s:>8.1f}"
            )
    for r in results:
        for t in r.throughput:
            if t.consume_raw_s is not None:
                raw = t.count / t.consume_raw_s
                print(f"{r.name:<8} {t.size_b:>4} B consume with pull_raw (entries not decoded): {raw:,.0f} msgs/s")
            if t.consume_eager_s is not None:
                eager = t.count / t.consume_eager_s
                print(f"{r.name:<8} {t.size_b:>4} B consume decoding every field (decode_entry): {eager:,.0f} msgs/s")
            if t.index_wait_s is not None:
                print(f"{r.name:<8} {t.size_b:>4} B indexed {t.index_wait_s:.3f} s after the last send's answer")
    print()
    print(f"end-to-end latency, {LATENCY_SIZE_B} B, single synchronous sends at a fixed rate:")
    for r in results:
        for lat in r.latency:
            print(
                f"  {r.name:<13} {lat.rate_per_s:>5}/s  p50 {lat.p50_ms:8.2f} ms   p99 {lat.p99_ms:8.2f} ms"
                f"   max {lat.max_ms:8.2f} ms   (sent {lat.sent} at {lat.achieved_rate_per_s:,.0f}/s)"
            )
    print()
    print("limits of this machine, and ratios:")
    print(f"  disk write with fdatasync      {limits['disk_write_mb_s']:8.0f} MB/s")
    print(f"  gRPC loopback 1 MiB upload     {limits['grpc_upload_mb_s']:8.0f} MB/s")
    print(f"  gRPC loopback 1 MiB download   {limits['grpc_download_mb_s']:8.0f} MB/s")
    for name, value in ratios.items():
        print(f"  {name:<44} {value:6.2f}")


def peer_ratios(results: list[SystemResult]) -> dict[str, float]:
    """Sluice's consume rate over each peer's, size by size, from the same run (the same load on the machine)."""
    sluice = next((r for r in results if r.name == "sluice" and r.throughput), None)
    if sluice is None:
        return {}
    out: dict[str, float] = {}
    for peer in results:
        for t in sluice.throughput if peer is not sluice else ():
            theirs = next((p for p in peer.throughput if p.size_b == t.size_b), None)
            if theirs is not None:
                out[f"sluice consume {t.size_b} B / {peer.name} consume"] = t.consume_msgs_s / theirs.consume_msgs_s
    return out


def limit_ratios(results: list[SystemResult], limits: dict[str, float]) -> dict[str, float]:
    sluice = next((r for r in results if r.name == "sluice" and r.throughput), None)
    if sluice is None:
        return {}
    big = max(sluice.throughput, key=lambda t: t.size_b)
    return {
        f"sluice produce {big.size_b} B / disk write": big.produce_mb_s / limits["disk_write_mb_s"],
        f"sluice produce {big.size_b} B / gRPC upload": big.produce_mb_s / limits["grpc_upload_mb_s"],
        f"sluice consume {big.size_b} B / gRPC download": big.consume_mb_s / limits["grpc_download_mb_s"],
    }


def write_charts(results: list[SystemResult], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in results if r.throughput]
    paths: list[Path] = []
    fig, axes = plt.subplots(1, len(SIZES_B), figsize=(11, 4))
    for ax, size_b in zip(axes, SIZES_B, strict=True):
        xs = np.arange(2)
        width = 0.8 / max(1, len(done))
        for i, r in enumerate(done):
            t = next(t for t in r.throughput if t.size_b == size_b)
            ax.bar(xs + i * width, [t.produce_msgs_s / 1000, t.consume_msgs_s / 1000], width, label=r.name)
        ax.set_xticks(xs + width * (len(done) - 1) / 2, ["produce", "consume"])
        ax.set_title(f"{size_b} B messages")
        ax.set_ylabel("thousand msgs/s")
        ax.legend()
    fig.suptitle("Batched throughput on loopback, one stream/queue, standard Python clients")
    fig.tight_layout()
    paths.append(out_dir / "peers_throughput.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    rates = sorted({lat.rate_per_s for r in results for lat in r.latency}, reverse=True)
    fig, axes = plt.subplots(1, max(1, len(rates)), figsize=(5.5 * max(1, len(rates)), 4), squeeze=False)
    for ax, rate in zip(axes[0], rates, strict=False):
        pairs = [(r.name, lat) for r in results for lat in r.latency if lat.rate_per_s == rate]
        xs = np.arange(len(pairs))
        ax.bar(xs - 0.2, [lat.p50_ms for _, lat in pairs], 0.4, label="p50")
        ax.bar(xs + 0.2, [lat.p99_ms for _, lat in pairs], 0.4, label="p99")
        # The achieved send rate under each name: below the asked rate, queueing dominates the latency.
        ax.set_xticks(xs, [f"{name}\nsent {lat.achieved_rate_per_s:,.0f}/s" for name, lat in pairs])
        ax.set_yscale("log")
        ax.set_ylabel("ms (log scale)")
        ax.set_title(f"{rate} msgs/s asked")
        ax.legend()
    fig.suptitle(f"End-to-end latency, single synchronous sends of {LATENCY_SIZE_B} B")
    fig.tight_layout()
    paths.append(out_dir / "peers_latency.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--systems", default="sluice,redis,nats,relay,relay-streams",
        help="comma list of sluice, redis, nats, relay, relay-streams (bare grpcio relays: latency rows only)",
    )  # fmt: skip
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the message counts (default 1.0)")
    parser.add_argument("--no-charts", action="store_true", help="skip the PNG charts")
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="throughput runs per system, taken in turn over the systems; each figure keeps its best (default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--latency-rates", default=",".join(map(str, LATENCY_RATES_PER_S)),
        help="comma list of msgs/s for the latency runs (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--default-malloc", action="store_true",
        help="leave this process's malloc at glibc's defaults (else broker.client.tune_malloc(), for every client)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "peers.json")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.systems.split(",") if n.strip()]
    try:
        latency_rates = [int(r) for r in args.latency_rates.split(",") if r.strip()]
    except ValueError:
        parser.error(f"--latency-rates {args.latency_rates!r}: write whole msgs/s, e.g. 5000,250")
    if not 1 <= args.rounds <= MAX_ROUNDS:
        parser.error(f"--rounds must be 1..{MAX_ROUNDS}")
    if any(r <= 0 for r in latency_rates):
        parser.error("--latency-rates must be positive")
    unknown = sorted(set(names) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown system(s) {unknown}; choose from {sorted(SYSTEMS)}")

    from broker.client import tune_malloc

    client_malloc = "glibc defaults" if args.default_malloc or not tune_malloc() else "tuned"
    load_at_start = os.getloadavg()[0]  # other work on the machine skews every figure: recorded with them
    with tempfile.TemporaryDirectory(prefix="sluice-peers-") as tmp:
        workdir = Path(tmp)
        results = run_systems(names, workdir, args.scale, latency_rates, args.rounds)
        print("limits: disk, gRPC loopback", flush=True)
        upload, download = grpc_loopback_mb_s(workdir)
        limits = {
            "disk_write_mb_s": disk_write_mb_s(workdir),
            "grpc_upload_mb_s": upload,
            "grpc_download_mb_s": download,
        }
    hops: list[Hop] = []
    server_cpu: list[ServerCpu] = []
    if "sluice" in names:
        print("Sluice hop by hop, beside each hop's floor (bench.hops)", flush=True)
        hops, server_cpu = measure_hops(HOPS_CALLS)
    ratios = {**peer_ratios(results), **limit_ratios(results, limits)}
    print_table(results, limits, ratios)
    if hops:
        print()
        print_hops(hops, server_cpu)

    report = {
        "benchmark": "peers",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_avg_1m_at_start": round(load_at_start, 2),
            "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        },
        "config": {
            "batch_msgs": BATCH_MSGS,
            "scale": args.scale,
            "rounds": args.rounds,
            "latency_rates_per_s": latency_rates,
            "latency_size_b": LATENCY_SIZE_B,
            "latency_duration_s": LATENCY_DURATION_S,
            "queues_or_streams": 1,
            "client_malloc": client_malloc,
        },
        "systems": {r.name: r.to_json() for r in results},
        "limits": {k: round(v, 1) for k, v in limits.items()},
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "hops": [asdict(h) for h in hops],
        "server_cpu": [asdict(c) for c in server_cpu],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    if not args.no_charts:
        try:
            for path in write_charts(results, args.out.parent):
                print(f"wrote {path}")
        except ModuleNotFoundError as e:
            print(f"no charts: {missing_package_hint(e)}")
            return 1
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
