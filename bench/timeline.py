"""One message's time, hop by hop, measured in place: each message of a paced run stamped as it passes each step.

    python -m bench.timeline [--rates 1000,250] [--count 2500]

``bench.hops`` times each hop apart (in a process of its own, or back to back); this times the same path as
``bench.peers``' latency rows (a synchronous ``Producer.send`` at a fixed rate, a PushConsumer's listener in another
process) with every step of every message stamped where it happens. The broker runs in a process that wraps a
few of its methods to note ``time.monotonic_ns()`` (the system-wide CLOCK_MONOTONIC, so stamps compare across
processes); the consumer's process wraps its stream's answer. The steps of a message at queue offset ``i``:

=====================  ==========================================================================================
behind schedule        the message's scheduled time -> ``Producer.send`` called (the send before it still running)
client to handler      ``Producer.send`` called -> the broker's SendMessage handler starts (the client's stream,
                       gRPC on both sides, the hand-off to a server thread, the request's parsing and the gates)
checks before put      handler start -> ``MessageStore.put_message`` called (request checks, dedup, topic checks)
store put              ``put_message`` (encode, append, wake the dispatcher)
put to pass            ``put_message`` returned -> the dispatcher's pass starts (woken by the append, it waits for
                       the sending thread to answer the send: the broker's Python threads share one CPU and one GIL)
dispatch pass          pass start -> the held pulls told of the message (consume-queue unit, index)
held pull answers      told -> the held pull's handler returns with the message (wake, read, encode)
answer to consumer     handler returned -> the consumer's stream hands the answer to its worker (gRPC both sides)
to the listener        -> the listener is called (decoding, the PushConsumer's own steps)
end to end             the scheduled send time -> the listener (what ``bench.peers`` reports): the sum of the above
handler after put      beside the path: ``put_message`` returned -> the handler returns (the send's answer)
send round trip        beside the path: ``Producer.send`` called -> returned
=====================  ==========================================================================================

Prints p50 / p90 / p99 of each step and its mean over the slowest 1% of messages (what makes the p99), and writes
bench/results/timeline.json. Stamping costs each step about a microsecond; other load on the machine skews every
figure. At a low rate each step runs after an idle gap (caches and the CPU cold), which is what the rate is for.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.hops import start_consumer, wait_push_ready
from bench.peers.pacing import paced
from bench.peers.settings import SERVER_START_TIMEOUT_S
from bench.peers.sluice import SluiceBroker

RESULTS_DIR = Path(__file__).resolve().parent / "results"
RATES_PER_S = (1000, 250)
COUNT = 2500
WARMUP_MSGS = 300  # connection set-up, first route, the consumer's first pulls: not counted
BODY_B = 100
TOPIC = "timeline"
STEPS = (
    "behind schedule", "client to handler", "checks before put", "store put", "put to pass", "dispatch pass",
    "held pull answers", "answer to consumer", "to the listener", "end to end", "handler after put", "send round trip",
)

Stamp = tuple[Any, ...]
Send = tuple[int, int, int, int]  # (queue offset, due, called, returned), monotonic ns


# ---- the broker's process: a few methods wrapped to stamp, then the broker as `python -m broker` runs it -------
def serve(stamps_path: str, broker_argv: list[str]) -> None:
    from broker.cli.main import main
    from broker.server.broker_service import BrokerService
    from broker.server.pull_hold import PullHoldService
    from broker.store.dispatch_service import DispatchService
    from broker.store.message_store import MessageStore

    stamps: list[Stamp] = []
    now = time.monotonic_ns

    def around(cls: Any, name: str, note: Callable[[tuple[Any, ...], Any, int, int], Stamp | None]) -> None:
        inner = getattr(cls, name)

        def stamped(*args: Any, **kwargs: Any) -> Any:
            t0 = now()
            result = inner(*args, **kwargs)
            noted = note(args, result, t0, now())
            if noted is not None:
                stamps.append(noted)
            return result

        setattr(cls, name, stamped)

    around(BrokerService, "SendMessage", lambda a, r, t0, t1: ("send", list(r.queue_offsets), t0, t1))
    around(BrokerService, "PullMessage",
           lambda a, r, t0, t1: ("pull", a[1].queue_offset, len(r.entry_positions), t0, t1))
    around(MessageStore, "put_message", lambda a, r, t0, t1: ("put", t0, t1))
    around(DispatchService, "run_once", lambda a, r, t0, t1: ("pass", t0))
    around(PullHoldService, "on_arrival", lambda a, r, t0, t1: ("told", a[3], t0))
    try:
        main(broker_argv)
    finally:
        Path(stamps_path).write_text(json.dumps(stamps))


# ---- the consumer's process ---------------------------------------------------------------------------------
def consume(endpoint: str, count: int, ready: Any, out: Any) -> None:
    from broker.client import FIRST, PushConsumer
    from broker.client.call_stream import CallStream

    answers: list[tuple[int, int, int]] = []  # (first offset, messages, time) of each answer with messages
    heard: dict[int, int] = {}
    exchange = CallStream._exchange

    def stamped(self: CallStream, request: Any, timeout_s: float) -> Any:
        response = exchange(self, request, timeout_s)
        if response is not None and len(getattr(response, "entry_positions", ())):
            answers.append((request.queue_offset, len(response.entry_positions), time.monotonic_ns()))
        return response

    CallStream._exchange = stamped  # type: ignore[method-assign]

    def listener(messages: list[Any]) -> None:
        t = time.monotonic_ns()
        for m in messages:
            heard[m.queue_offset] = t

    with PushConsumer(endpoint, "timeline", {TOPIC: "*"}, listener, consume_from=FIRST) as consumer:
        wait_push_ready(consumer, SERVER_START_TIMEOUT_S)
        ready.set()
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S + count / 100
        while len(heard) < count and time.monotonic() < deadline:
            time.sleep(0.01)
    out.put({"answers": answers, "heard": heard})


# ---- the run --------------------------------------------------------------------------------------------------
def run_rate(rate_per_s: int, count: int, workdir: Path) -> dict[str, np.ndarray]:
    """Each step's time in us, one value a message past the warm-up."""
    from broker.client import Admin, Message, Producer

    stamps_path = workdir / f"stamps-{rate_per_s}.json"
    (workdir / str(rate_per_s)).mkdir()
    broker = SluiceBroker(launcher=[sys.executable, "-m", "bench.timeline", "--serve", str(stamps_path), "--"])
    try:
        broker.start(workdir / str(rate_per_s))
        with Admin(broker.endpoint) as admin:
            admin.create_topic(TOPIC, queues=1)
        proc, out = start_consumer(consume, broker.endpoint, count)
        sends: list[Send] = []
        with Producer(broker.endpoint) as producer:
            for _, due in paced(rate_per_s, count):
                called = time.monotonic_ns()
                result = producer.send(Message(TOPIC, b"x" * BODY_B), queue_id=0)
                sends.append((result.queue_offset, int(due * 1e9), called, time.monotonic_ns()))
        consumer: dict[str, Any] = out.get(timeout=SERVER_START_TIMEOUT_S + count / 100)
        proc.join(timeout=10)
    finally:
        broker.stop()
    return steps_of(sends, json.loads(stamps_path.read_text()), consumer)


def steps_of(sends: list[Send], stamps: list[Stamp], consumer: dict[str, Any]) -> dict[str, np.ndarray]:
    """Each step's time in us, a message at a time (the producer's sends, the broker's stamps, the consumer's)."""
    handler = {s[1][0]: (s[2], s[3]) for s in stamps if s[0] == "send" and s[1]}
    puts = sorted((s[1], s[2]) for s in stamps if s[0] == "put")
    passes = sorted(s[1] for s in stamps if s[0] == "pass")
    told = sorted((s[2], s[1]) for s in stamps if s[0] == "told")
    told_times = [t for t, _ in told]
    answered: dict[int, int] = {}
    for s in stamps:
        if s[0] == "pull" and s[2]:
            for offset in range(s[1], s[1] + s[2]):
                answered.setdefault(offset, s[4])
    arrived: dict[int, int] = {}
    for first, n, t in consumer["answers"]:
        for offset in range(first, first + n):
            arrived.setdefault(offset, t)
    heard = {int(k): v for k, v in consumer["heard"].items()}
    rows = []
    for offset, due, called, returned in sends:
        if offset < WARMUP_MSGS or not all(offset in d for d in (handler, answered, arrived, heard)):
            continue
        h0, h1 = handler[offset]
        p0, p1 = puts[bisect.bisect_right(puts, (h1, 0)) - 1]
        k = bisect.bisect_left(told_times, p0)
        while k < len(told) and told[k][1] <= offset:
            k += 1
        if k == len(told):
            continue
        t_told = told[k][0]
        t_pass = passes[bisect.bisect_right(passes, t_told) - 1]
        rows.append((called - due, h0 - called, p0 - h0, p1 - p0, t_pass - p1, t_told - t_pass,
                     answered[offset] - t_told, arrived[offset] - answered[offset], heard[offset] - arrived[offset],
                     heard[offset] - due, h1 - p1, returned - called))
    table = np.array(rows, np.float64).reshape(len(rows), len(STEPS)) / 1000
    return {step: table[:, i] for i, step in enumerate(STEPS)}


def summary(steps: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    total = steps["end to end"]
    slowest = np.argsort(total)[-max(1, len(total) // 100) :]
    return {
        step: {"p50_us": float(np.percentile(v, 50)), "p90_us": float(np.percentile(v, 90)),
               "p99_us": float(np.percentile(v, 99)), "slowest_1pct_mean_us": float(v[slowest].mean())}
        for step, v in steps.items()
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        serve(argv[1], argv[3:])
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.timeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default=",".join(map(str, RATES_PER_S)), help="msgs/s, comma list")
    parser.add_argument("--count", type=int, default=COUNT, help="messages a rate (default %(default)s)")
    parser.add_argument("--out", default=str(RESULTS_DIR / "timeline.json"))
    args = parser.parse_args(argv)
    rates = [int(r) for r in args.rates.split(",") if r.strip()]
    if args.count <= WARMUP_MSGS or any(r <= 0 for r in rates):
        parser.error(f"--count must exceed the {WARMUP_MSGS} warm-up messages and rates must be positive")
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "count": args.count,
                               "body_b": BODY_B, "rates": {}}
    with tempfile.TemporaryDirectory(prefix="sluice-timeline-") as tmp:
        for rate in rates:
            steps = run_rate(rate, args.count, Path(tmp))
            if not len(steps["end to end"]):
                raise RuntimeError(f"no message of the {rate}/s run was matched to its stamps; see the broker's log")
            results["rates"][str(rate)] = summary(steps)
            print(f"\n{rate} msgs/s, {len(steps['end to end'])} messages, us:")
            print(f"  {'step':22s} {'p50':>7s} {'p90':>7s} {'p99':>7s}  slowest 1%")
            for step, s in results["rates"][str(rate)].items():
                print(f"  {step:22s} {s['p50_us']:7.0f} {s['p90_us']:7.0f} {s['p99_us']:7.0f}  "
                      f"{s['slowest_1pct_mean_us']:7.0f}")
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
