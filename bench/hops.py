"""Where one message's time goes, hop by hop, beside the floor Python allows for each hop on this machine.

    python -m bench.hops [--calls 2000]

A synchronous send and its delivery to a consumer waiting in a long poll, as ``bench.peers`` times it end to end,
cut into the hops that can be measured apart (100 B bodies, one queue, p50 and p99 of ``--calls`` samples each):

- **send**, client call to answer: ``Producer.send`` to a broker process (on the producer's SendStream,
  broker/client/call_stream.py). Floors: a bare grpcio unary call of
  100 B to a service in another process that answers at once, and under it a plain TCP round trip of 100 B between
  two Python processes (what a Redis client pays: a socket, no threads in between).
- **store put**: ``MessageStore.put_message`` in this process (the store's own work; no floor).
- **dispatch**, put to visible: the put's return to the store's arrival listener (the dispatcher thread, woken by
  the put, has written the consume-queue unit). Floor: a thread wake-up (an Event set in one thread until the
  waiting thread runs).
- **delivery**, answer to the held pull: the end-to-end time minus the send's p50. Floor: the same for the relay
  below (its end-to-end time minus the bare call's p50). And to a PushConsumer: a second run of paced sends read
  by a PushConsumer (its pulls held on a PullStream), the time taken in its listener.
- **end to end**: the send's start to a held ``PullConsumer.pull`` call returning the message in another process
  (**sluice**) or to the PushConsumer's listener (**sluice, push**: what ``bench.peers`` measures). Floor: a bare
  grpcio relay, the least a broker served by Python gRPC can do: a service in a third process whose unary ``Put``
  appends the body to a list and wakes its held unary ``Get``, which answers the waiting consumer at once (no
  store, no checks, no encoding). Two more shapes of it show what other ways of serving Python gRPC would give:
  ``relay-aio``, the same calls served by ``grpc.aio`` (an asyncio loop instead of a thread pool), and
  ``relay-streams``, the puts written on one bidirectional stream (each answered on it before the next) and the
  bodies pushed to the consumer on one server stream (no call a message, no re-request after each delivery).

Beside the hops, the **server's CPU a message** over the paced end-to-end samples: the broker process's user and
system time (all its threads, from ``/proc``) against the relay process's, each divided by the messages sent.

Calls are paced ``PACE_S`` apart, as messages at a fixed rate are (each sample is a message's own time, not time
queued behind the previous one), and the send and its floors are also timed back to back: between the two, the
difference is what waking idle threads costs (gRPC's poller and worker threads on both sides). ``bench.peers``
measures the whole path at fixed rates against Redis and NATS.

Writes bench/results/hops.json. Other load on the machine skews every figure.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.server import process_cpu_s

RESULTS_DIR = Path(__file__).resolve().parent / "results"
BODY_B = 100
CALLS = 2000
WARMUP_CALLS = 200  # connection set-up, first route, first file mapping: not counted
PACE_S = 0.002  # between end-to-end samples: a message at a time, none queued behind another
START_TIMEOUT_S = 30.0
TOPIC = "hops"
PUSH_TOPIC = "hops-push"  # the PushConsumer's run: a topic of its own, read from its first message

# A bare grpcio service in another process: Echo answers at once (a call's floor); Put appends the body to a list
# and wakes the held Get, which answers with what came after the offset it asked from (the relay floor).
GRPC_SERVER = """
from concurrent import futures
import threading
import time
import grpc
from broker.server.thread_names import ThreadNames
GET_TIMEOUT_S = 1.0
cond = threading.Condition()
bodies = []
def echo(request, context):
    return b""
def put(request, context):
    with cond:
        bodies.append(request)
        cond.notify_all()
    return b""
def get(request, context):
    start = int.from_bytes(request, "big")
    with cond:
        cond.wait_for(lambda: len(bodies) > start, timeout=GET_TIMEOUT_S)
        return b"".join(bodies[start:start + 100])
def put_stream(requests, context):
    for body in requests:
        put(body, context)
        yield b""
def subscribe(request, context):
    offset = int.from_bytes(request, "big")
    while context.is_active():
        with cond:
            cond.wait_for(lambda: len(bodies) > offset, timeout=GET_TIMEOUT_S)
            batch = bodies[offset:offset + 100]
        offset += len(batch)
        yield b"".join(batch)  # empty after GET_TIMEOUT_S without bodies: the reader may stop between messages
handlers = {"Echo": grpc.unary_unary_rpc_method_handler(echo, lambda b: b, lambda b: b),
            "Put": grpc.unary_unary_rpc_method_handler(put, lambda b: b, lambda b: b),
            "Get": grpc.unary_unary_rpc_method_handler(get, lambda b: b, lambda b: b),
            "PutStream": grpc.stream_stream_rpc_method_handler(put_stream, lambda b: b, lambda b: b),
            "Subscribe": grpc.unary_stream_rpc_method_handler(subscribe, lambda b: b, lambda b: b)}
server = grpc.server(futures.ThreadPoolExecutor(4, thread_name_prefix="grpc-worker"))
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Relay", handlers),))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(port, flush=True)
names = ThreadNames()  # named as the broker's are, so that CPU a thread compares role by role
while True:
    names.apply()
    time.sleep(1.0)
"""

# The relay's Put and Get served by grpc.aio (one asyncio loop; gRPC's poller hands it completions), the same calls.
AIO_SERVER = """
import asyncio
import grpc
GET_TIMEOUT_S = 1.0
async def main():
    bodies, cond = [], asyncio.Condition()
    async def put(request, context):
        async with cond:
            bodies.append(request)
            cond.notify_all()
        return b""
    async def get(request, context):
        start = int.from_bytes(request, "big")
        async with cond:
            try:
                await asyncio.wait_for(cond.wait_for(lambda: len(bodies) > start), GET_TIMEOUT_S)
            except asyncio.TimeoutError:
                pass
            return b"".join(bodies[start:start + 100])
    handlers = {"Put": grpc.unary_unary_rpc_method_handler(put, lambda b: b, lambda b: b),
                "Get": grpc.unary_unary_rpc_method_handler(get, lambda b: b, lambda b: b)}
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Relay", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()
asyncio.run(main())
"""


TCP_ECHO_SERVER = """
import socket
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
conn, _ = listener.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while data := conn.recv(65536):
    conn.sendall(data[:1])
"""


@dataclass
class Hop:
    hop: str
    what: str  # "sluice", or the floor: "grpc" (a bare grpcio call), "tcp" (a bare socket), "thread" (a wake-up),
    # "relay" (the bare grpcio relay: a put and a held get), "relay-aio", "relay-streams" (RELAYS)
    p50_ms: float
    p99_ms: float
    samples: int


@dataclass
class ServerCpu:
    what: str  # "sluice" (the broker process) or a relay's process (RELAYS)
    us_per_msg: float  # user + system CPU of the whole process over the paced messages, divided by their number
    # the same by thread role (OS thread name less its pool number, broker/server/thread_names.py), largest first
    by_thread: dict[str, float] = field(default_factory=dict)


ThreadCpu = dict[int, tuple[str, float]]  # native thread id -> (OS name, CPU seconds so far)


def thread_cpu_s(pid: int) -> ThreadCpu:
    """Each thread's OS name and user + system CPU seconds so far (Linux: /proc/PID/task/TID)."""
    tick_s = 1 / os.sysconf("SC_CLK_TCK")
    threads: ThreadCpu = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue  # the thread ended since the listing
        threads[int(tid)] = (name, (int(fields[11]) + int(fields[12])) * tick_s)
    return threads


def thread_role(name: str) -> str:
    """A thread's role: its name less a pool number ("grpc-worker_3", "schedule-level-12")."""
    head, sep, tail = name.rpartition("_" if "_" in name else "-")
    return head if sep and tail.isdigit() else name


def cpu_by_role(before: ThreadCpu, after: ThreadCpu, calls: int) -> dict[str, float]:
    """CPU microseconds a message by thread role between two thread_cpu_s readings, largest first; a thread
    started in between counts from zero. Threads that ended in between are not seen (their CPU is in the total)."""
    roles: dict[str, float] = {}
    for tid, (name, cpu_s) in after.items():
        used_s = cpu_s - before[tid][1] if tid in before else cpu_s
        if used_s > 0:
            roles[thread_role(name)] = roles.get(thread_role(name), 0.0) + used_s / calls * 1e6
    return dict(sorted(roles.items(), key=lambda kv: -kv[1]))


def hop_of(hop: str, what: str, seconds: list[float]) -> Hop:
    ms = np.array(seconds) * 1000
    return Hop(hop, what, float(np.percentile(ms, 50)), float(np.percentile(ms, 99)), len(seconds))


# ---- floors -------------------------------------------------------------------------------------------------


def grpc_call_floor(calls: int, pace_s: float) -> list[float]:
    """Round trips of a 100 B unary call to a service that answers at once, in another process."""
    import grpc

    server = subprocess.Popen([sys.executable, "-c", GRPC_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/bench.Relay/Echo")
            body = os.urandom(BODY_B)
            return timed_calls(lambda: call(body), calls, pace_s)
    finally:
        server.kill()
        server.wait()


def tcp_round_trip_floor(calls: int, pace_s: float) -> list[float]:
    """100 B to a Python process over a TCP socket, one byte back: a round trip with nothing but the kernel and two
    interpreters in it."""
    server = subprocess.Popen([sys.executable, "-c", TCP_ECHO_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            body = os.urandom(BODY_B)

            def round_trip() -> None:
                sock.sendall(body)
                if not sock.recv(1):
                    raise RuntimeError("the TCP echo process closed the connection")

            return timed_calls(round_trip, calls, pace_s)
    finally:
        server.kill()
        server.wait()


def thread_wakeup_floor(calls: int) -> list[float]:
    """An Event set in one thread until the waiting thread runs: the least a hand-off between threads costs."""
    ping, pong = threading.Event(), threading.Event()
    woke_at = [0.0]

    def waiter() -> None:
        for _ in range(calls + WARMUP_CALLS):
            ping.wait()
            woke_at[0] = time.perf_counter()
            ping.clear()
            pong.set()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    samples = []
    for i in range(calls + WARMUP_CALLS):
        pong.clear()
        t0 = time.perf_counter()
        ping.set()
        pong.wait()
        if i >= WARMUP_CALLS:
            samples.append(woke_at[0] - t0)
    thread.join()
    return samples


def _record(received: dict[int, float], reply: bytes, body_b: int, now: float) -> None:
    """Each body of a relay's reply arrived at ``now``, by the sequence number in its first 8 bytes."""
    for at in range(0, len(reply), body_b):
        received[int.from_bytes(reply[at : at + 8], "big")] = now


def relay_receive(
    port: int, body_b: int, ready: Callable[[], None], more: Callable[[int], bool], clock: Callable[[], float]
) -> dict[int, float]:
    """Held gets from the relay at ``port`` while ``more(bodies received)``: each body's arrival time on ``clock``,
    by the sequence number in its first 8 bytes. ``ready()`` once connected. bench.peers reads the relay this way
    too (on its clock, with its own end rule)."""
    import grpc

    received: dict[int, float] = {}
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        grpc.channel_ready_future(channel).result(timeout=START_TIMEOUT_S)
        get = channel.unary_unary("/bench.Relay/Get")
        ready()
        offset = 0
        while more(len(received)):
            reply = get(offset.to_bytes(8, "big"))  # held by the relay until a body past offset is there
            _record(received, reply, body_b, clock())
            offset += len(reply) // body_b
    return received


def relay_stream_receive(
    port: int, body_b: int, ready: Callable[[], None], more: Callable[[int], bool], clock: Callable[[], float]
) -> dict[int, float]:
    """``relay_receive`` through one server stream (``Subscribe``): the relay pushes bodies as they come, and an
    empty message after a second without any, so that ``more`` is asked at least that often."""
    import grpc

    received: dict[int, float] = {}
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        grpc.channel_ready_future(channel).result(timeout=START_TIMEOUT_S)
        stream = channel.unary_stream("/bench.Relay/Subscribe")((0).to_bytes(8, "big"))
        ready()
        try:
            while more(len(received)):
                reply = next(stream)
                _record(received, reply, body_b, clock())
        finally:
            stream.cancel()
    return received


def relay_consumer(port: int, streams: bool, count: int, ready: Any, results: Any) -> None:
    """In its own process: the relay's bodies (held gets, or its server stream) until ``count`` came; their arrival
    times."""
    deadline = time.monotonic() + START_TIMEOUT_S + count * PACE_S * 4
    receive = relay_stream_receive if streams else relay_receive
    results.put(receive(port, BODY_B, ready.set, lambda n: n < count and time.monotonic() < deadline,
                        time.perf_counter))


RELAYS = {  # what -> (server script, whether puts and gets are streams)
    "relay": (GRPC_SERVER, False),
    "relay-aio": (AIO_SERVER, False),
    "relay-streams": (GRPC_SERVER, True),
}


def relay_sender(channel: Any, streams: bool) -> tuple[Callable[[bytes], object], Callable[[], None]]:
    """The relay's put on ``channel`` (a grpc.Channel) and what ends the puts: a call each, or on one bidirectional
    stream, each put answered on it before the next returns."""
    if not streams:
        return channel.unary_unary("/bench.Relay/Put"), lambda: None
    outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
    acks = channel.stream_stream("/bench.Relay/PutStream")(iter(outbox.get, None))

    def put(body: bytes) -> None:
        outbox.put(body)
        next(acks)

    return put, lambda: outbox.put(None)


def relay_floor(calls: int, what: str = "relay") -> tuple[list[float], ServerCpu]:
    """Paced puts to a bare relay (RELAYS), each from its start to its arrival in a consumer process; and the
    relay process's CPU a message over them. Unary: each put a call, each body fetched by a held get. Streams: the
    puts on one bidirectional stream, each answered on it before the next; the bodies pushed on one server stream."""
    import grpc

    script, streams = RELAYS[what]
    server = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        consumer, results = start_consumer(relay_consumer, port, streams, calls + WARMUP_CALLS)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            put, end = relay_sender(channel, streams)
            sent_at, _, cpu = paced_sends(put, calls, server.pid, what)
            end()
        received = collect(consumer, results, calls + WARMUP_CALLS)
    finally:
        server.kill()
        server.wait()
    return arrivals(sent_at, received, f"the {what}"), cpu


def start_consumer(target: Callable[..., None], *args: Any) -> tuple[Any, Any]:
    """``target(*args, ready, results)`` in a spawned process (no GIL or gRPC state shared with the sender), once
    it says it is connected; the process and its results queue."""
    ctx = multiprocessing.get_context("spawn")
    ready, results = ctx.Event(), ctx.Queue()
    consumer = ctx.Process(target=target, args=(*args, ready, results))
    consumer.start()
    if not ready.wait(START_TIMEOUT_S):
        consumer.kill()
        raise RuntimeError(f"the consumer process ({target.__name__}) did not start")
    return consumer, results


def collect(consumer: Any, results: Any, total: int) -> dict[int, float]:
    """A consumer process's arrival times, once it has them all (or gave up)."""
    received: dict[int, float] = results.get(timeout=START_TIMEOUT_S + total * PACE_S * 4)
    consumer.join(timeout=10)
    return received


def paced_sends(
    send: Callable[[bytes], object], calls: int, server_pid: int, what: str
) -> tuple[dict[int, float], list[float], ServerCpu]:
    """WARMUP_CALLS, then ``calls`` sends of numbered BODY_B bodies, PACE_S apart: each counted send's start (by its
    number) and round trip, and the server process's CPU a message over the counted ones."""
    sent_at: dict[int, float] = {}
    round_trips = []
    for seq in range(calls + WARMUP_CALLS):
        if seq == WARMUP_CALLS:
            cpu_s, threads = process_cpu_s(server_pid), thread_cpu_s(server_pid)
        body = seq.to_bytes(8, "big") + bytes(BODY_B - 8)
        t0 = time.perf_counter()
        send(body)
        t1 = time.perf_counter()
        if seq >= WARMUP_CALLS:
            sent_at[seq] = t0
            round_trips.append(t1 - t0)
        time.sleep(PACE_S)
    cpu = ServerCpu(what, (process_cpu_s(server_pid) - cpu_s) / calls * 1e6,
                    cpu_by_role(threads, thread_cpu_s(server_pid), calls))
    return sent_at, round_trips, cpu


def arrivals(sent_at: dict[int, float], received: dict[int, float], what: str) -> list[float]:
    """Each message's time from its send's start to its arrival; every message must have arrived."""
    missing = [seq for seq in sent_at if seq not in received]
    if missing:
        raise RuntimeError(f"{len(missing)} messages never reached {what}'s consumer, e.g. {missing[:5]}")
    return [received[seq] - t0 for seq, t0 in sent_at.items()]


def timed_calls(fn: Any, calls: int, pace_s: float) -> list[float]:
    for _ in range(WARMUP_CALLS):
        fn()
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
        if pace_s:
            time.sleep(pace_s)
    return samples


# ---- Sluice's hops --------------------------------------------------------------------------------------------


def store_hops(calls: int) -> tuple[list[float], list[float]]:
    """(put, dispatch) in this process: put_message's own time, and its return to the arrival listener's call."""
    from broker.store.message_store import MessageStore
    from broker.store.store_config import StoreConfig

    arrived = threading.Event()
    arrived_at = [0.0]

    def on_arrival(topic: str, queue_id: int, max_offset: int) -> None:
        arrived_at[0] = time.perf_counter()
        arrived.set()

    with tempfile.TemporaryDirectory() as tmp:
        store = MessageStore(StoreConfig(store_path=tmp))
        store.add_arrival_listener(on_arrival)
        store.start()
        try:
            body = os.urandom(BODY_B)
            puts, dispatches = [], []
            for i in range(calls + WARMUP_CALLS):
                arrived.clear()
                t0 = time.perf_counter()
                assert store.put_message(TOPIC, 0, body).ok
                t1 = time.perf_counter()
                if not arrived.wait(START_TIMEOUT_S):
                    raise RuntimeError("the dispatcher never reported the put")
                if i >= WARMUP_CALLS:
                    puts.append(t1 - t0)
                    dispatches.append(arrived_at[0] - t1)
        finally:
            store.shutdown()
    return puts, dispatches


def held_pull_consumer(endpoint: str, count: int, ready: Any, results: Any) -> None:
    """In its own process: long-polling pulls of queue 0 until ``count`` messages came; their arrival times."""
    from broker.client import PullConsumer

    received: dict[int, float] = {}
    with PullConsumer(endpoint, "hops") as consumer:
        consumer.pull(TOPIC, 0, 0, max_msgs=1)  # connected and routed before the first send
        ready.set()
        offset = 0
        deadline = time.monotonic() + START_TIMEOUT_S + count * PACE_S * 4
        while len(received) < count and time.monotonic() < deadline:
            result = consumer.pull(TOPIC, 0, offset, max_msgs=100, timeout_ms=1000)
            now = time.perf_counter()
            for m in result.messages:
                received[int.from_bytes(m.body[:8], "big")] = now
            offset = result.next_begin_offset
    results.put(received)


def wait_push_ready(consumer: Any, timeout_s: float) -> None:
    """Until a PushConsumer owns its queue (or ``timeout_s``), then a moment for its first pull to be held, so that
    the first message measured does not wait for the consumer's start."""
    deadline = time.monotonic() + timeout_s
    while not consumer.assigned_message_queues() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # its first pull held


def push_listener_consumer(endpoint: str, count: int, ready: Any, results: Any) -> None:
    """In its own process: a PushConsumer of PUSH_TOPIC until ``count`` messages reached its listener; the times
    they did."""
    from broker.client import FIRST, PushConsumer

    received: dict[int, float] = {}
    done = threading.Event()

    def listener(messages: list[Any]) -> None:  # returns nothing: consumed
        now = time.perf_counter()
        for m in messages:
            received[int.from_bytes(m.body[:8], "big")] = now
        if len(received) >= count:
            done.set()

    with PushConsumer(endpoint, "hops-push", {PUSH_TOPIC: "*"}, listener, consume_from=FIRST) as consumer:
        wait_push_ready(consumer, START_TIMEOUT_S)
        ready.set()
        done.wait(START_TIMEOUT_S + count * PACE_S * 4)
    results.put(dict(received))


@dataclass
class BrokerRuns:
    sends: list[float]  # paced sends' round trips
    end_to_end: list[float]  # their start to the held pull's return in the consumer process
    back_to_back: list[float]  # sends one right after another
    cpu: ServerCpu  # the broker process's, over the paced sends
    push_end_to_end: list[float]  # paced sends' start to a PushConsumer's listener in the consumer process
    push_cpu: ServerCpu


def broker_hops(calls: int) -> BrokerRuns:
    """Against a broker process, two paced runs: one read by held pulls (``PullConsumer.pull``), one by a
    PushConsumer's listener, each in a consumer process (time.perf_counter is CLOCK_MONOTONIC on Linux, shared by
    processes); and sends back to back."""
    from broker.client import Admin, Message, Producer
    from broker.server.process import BrokerProcess

    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp) / "store").start()
        try:
            with Admin(broker.endpoint) as admin:
                admin.create_topic(TOPIC, queues=1)
                admin.create_topic(PUSH_TOPIC, queues=1)
            assert broker.proc is not None
            consumer, results = start_consumer(held_pull_consumer, broker.endpoint, calls + WARMUP_CALLS)
            with Producer(broker.endpoint) as producer:
                sent_at, sends, cpu = paced_sends(
                    lambda body: producer.send(Message(TOPIC, body), queue_id=0), calls, broker.proc.pid, "sluice"
                )
                received = collect(consumer, results, calls + WARMUP_CALLS)
                back_to_back = timed_calls(lambda: producer.send(Message(TOPIC, bytes(BODY_B)), queue_id=0), calls, 0)
                consumer, results = start_consumer(push_listener_consumer, broker.endpoint, calls + WARMUP_CALLS)
                push_sent_at, _, push_cpu = paced_sends(
                    lambda body: producer.send(Message(PUSH_TOPIC, body), queue_id=0), calls, broker.proc.pid,
                    "sluice, push",
                )
                push_received = collect(consumer, results, calls + WARMUP_CALLS)
        finally:
            broker.stop()
    return BrokerRuns(sends, arrivals(sent_at, received, "the broker"), back_to_back, cpu,
                      arrivals(push_sent_at, push_received, "the broker"), push_cpu)


# ---- report ---------------------------------------------------------------------------------------------------


def measure(calls: int) -> tuple[list[Hop], list[ServerCpu]]:
    grpc_floor = grpc_call_floor(calls, PACE_S)
    grpc_floor_b2b = grpc_call_floor(calls, 0)
    tcp_floor = tcp_round_trip_floor(calls, PACE_S)
    tcp_floor_b2b = tcp_round_trip_floor(calls, 0)
    wake_floor = thread_wakeup_floor(calls)
    relays = {what: relay_floor(calls, what) for what in RELAYS}
    relay = relays["relay"][0]
    puts, dispatches = store_hops(calls)
    runs = broker_hops(calls)
    sends, end_to_end = runs.sends, runs.end_to_end
    send_p50 = float(np.percentile(sends, 50))
    delivery = [e - send_p50 for e in end_to_end]
    grpc_p50 = float(np.percentile(grpc_floor, 50))
    hops = [
        hop_of("send, paced", "sluice", sends),
        hop_of("send, paced", "grpc", grpc_floor),
        hop_of("send, paced", "tcp", tcp_floor),
        hop_of("send, back to back", "sluice", runs.back_to_back),
        hop_of("send, back to back", "grpc", grpc_floor_b2b),
        hop_of("send, back to back", "tcp", tcp_floor_b2b),
        hop_of("store put", "sluice", puts),
        hop_of("dispatch: put to visible", "sluice", dispatches),
        hop_of("dispatch: put to visible", "thread", wake_floor),
        hop_of("delivery: answer to the held pull", "sluice", delivery),
        hop_of("delivery: answer to the held pull", "relay", [e - grpc_p50 for e in relay]),
        hop_of("delivery: to a PushConsumer", "sluice", [e - send_p50 for e in runs.push_end_to_end]),
        hop_of("end to end", "sluice", end_to_end),
        hop_of("end to end", "sluice, push", runs.push_end_to_end),
        *(hop_of("end to end", what, arrived) for what, (arrived, _) in relays.items()),
    ]
    return hops, [runs.cpu, runs.push_cpu, *(cpu for _, cpu in relays.values())]


def print_hops(hops: list[Hop], cpu: list[ServerCpu]) -> None:
    print(f"{'hop':<36} {'what':<13} {'p50 ms':>8} {'p99 ms':>8}")
    for h in hops:
        print(f"{h.hop:<36} {h.what:<13} {h.p50_ms:8.3f} {h.p99_ms:8.3f}")
    for c in cpu:
        roles = ", ".join(f"{role} {us:.0f}" for role, us in c.by_thread.items())
        print(f"{'server CPU a paced message':<36} {c.what:<13} {c.us_per_msg:8.0f} us  ({roles})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=CALLS, help="samples per hop")
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error("--calls must be at least 1")
    load_before = os.getloadavg()[0]
    hops, cpu = measure(args.calls)
    print_hops(hops, cpu)
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / "hops.json"
    record = {"date": time.strftime("%Y-%m-%d"), "calls": args.calls, "body_b": BODY_B,
              "load_average": [load_before, os.getloadavg()[0]], "hops": [asdict(h) for h in hops],
              "server_cpu": [asdict(c) for c in cpu]}
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
