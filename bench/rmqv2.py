"""RocketMQ 5 clients against Sluice: `python -m bench.rmqv2` prints a table and writes bench/results/rmqv2.json.

Against one broker subprocess in a fresh temporary store (ASYNC_FLUSH), in the same run:

* send rate, one 100 B message per call from one thread: the official Python client's ``Producer.send`` (the
  apache.rocketmq.v2 service) beside Sluice's ``Producer.send`` (sluice.v1);
* receive rate, batches of 32 with an ack per message: the official ``SimpleConsumer`` (ReceiveMessage +
  AckMessage, which acks one message per call) beside Sluice's ``PopConsumer`` (PopMessage + one AckMessage per
  batch) and ``PullConsumer`` (PullMessage, committing the offset with the next pull);
* the pop path's cost per message against pull: the broker process's CPU time (user + system, from /proc) per
  message consumed, Sluice's PopConsumer against its PullConsumer over the same messages.

The machine's load average is recorded with the figures: on a shared 2-core machine they move with it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer
from rocketmq import Message as RmqMessage
from rocketmq import Producer as RmqProducer

from broker.client import Admin, Message, PopConsumer, Producer, PullConsumer
from broker.server.process import BrokerProcess

RESULTS = Path(__file__).resolve().parent / "results" / "rmqv2.json"
BODY = b"x" * 100
BATCH = 32


def broker_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(pid: int, work: Callable[[], int]) -> tuple[float, float, int]:
    """(wall s, broker CPU s, messages) of ``work``, which returns how many messages it handled."""
    cpu, started = broker_cpu_s(pid), time.perf_counter()
    n = work()
    return time.perf_counter() - started, broker_cpu_s(pid) - cpu, n


def official_send(endpoint: str, topic: str, n: int) -> int:
    p = RmqProducer(ClientConfiguration(endpoint, Credentials(), request_timeout=10), (topic,))
    p.startup()
    try:
        for _ in range(n):
            m = RmqMessage()
            m.topic, m.body = topic, BODY
            p.send(m)
    finally:
        p.shutdown()
    return n


def sluice_send(endpoint: str, topic: str, n: int) -> int:
    with Producer(endpoint) as p:
        for _ in range(n):
            p.send(Message(topic, BODY))
    return n


def official_receive(endpoint: str, topic: str, n: int) -> int:
    c = SimpleConsumer(ClientConfiguration(endpoint, Credentials(), request_timeout=10), "bench-official",
                       {topic: FilterExpression()}, await_duration=1)
    c.startup()
    got = 0
    try:
        while got < n:
            for m in c.receive(BATCH, 30):
                c.ack(m)
                got += 1
    finally:
        c.shutdown()
    return got


def sluice_pop(endpoint: str, topic: str, n: int) -> int:
    got = 0
    with PopConsumer(endpoint, "bench-pop") as c:
        while got < n:
            batch = c.receive(topic, BATCH, invisible_ms=30_000, wait_ms=1000)
            c.ack_all(batch)
            got += len(batch)
    return got


def sluice_pull(endpoint: str, topic: str, queues: int, n: int) -> int:
    got = 0
    with PullConsumer(endpoint, "bench-pull") as c:
        offsets = dict.fromkeys(range(queues), 0)
        while got < n:
            for q, offset in offsets.items():
                r = c.pull(topic, q, offset, max_msgs=BATCH, commit_offset=offset)
                got += len(r.messages)
                offsets[q] = r.next_begin_offset
    return got


def run(n: int, queues: int) -> dict[str, Any]:
    logging.getLogger("rocketmq-python-client").setLevel(logging.WARNING)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sluice-bench-rmqv2-") as tmp:  # noqa: SIM117
        with BrokerProcess(Path(tmp) / "store") as proc, Admin(proc.endpoint) as admin:
            assert proc.proc is not None
            pid, ep = proc.proc.pid, proc.endpoint
            for t in ("Official", "Sluice"):
                admin.create_topic(t, queues)

            def row(case: str, client: str, result: tuple[float, float, int]) -> None:
                wall, cpu, count = result
                rows.append({"case": case, "client": client, "messages": count, "msgs_per_s": count / wall,
                             "broker_cpu_us_per_msg": cpu / count * 1e6})

            row("send", "official Python client 5.1.2 (apache.rocketmq.v2)",
                timed(pid, lambda: official_send(ep, "Official", n)))
            row("send", "Sluice Producer (sluice.v1)", timed(pid, lambda: sluice_send(ep, "Sluice", n)))
            row("receive+ack", "official SimpleConsumer (ReceiveMessage, AckMessage)",
                timed(pid, lambda: official_receive(ep, "Official", n)))
            row("receive+ack", "Sluice PopConsumer (PopMessage, AckMessage)",
                timed(pid, lambda: sluice_pop(ep, "Sluice", n)))
            row("receive", "Sluice PullConsumer (PullMessage)",
                timed(pid, lambda: sluice_pull(ep, "Sluice", queues, n)))
    pop = next(r for r in rows if r["client"].startswith("Sluice PopConsumer"))
    pull = next(r for r in rows if r["client"].startswith("Sluice PullConsumer"))
    return {
        "benchmark": "rmqv2", "messages": n, "body_bytes": len(BODY), "queues": queues, "batch": BATCH,
        "machine": {"cpus": os.cpu_count(), "load_average_1m": os.getloadavg()[0], "python": platform.python_version()},
        "rows": rows,
        "pop_over_pull_broker_cpu": pop["broker_cpu_us_per_msg"] / pull["broker_cpu_us_per_msg"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.rmqv2", description=__doc__)
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--queues", type=int, default=4)
    args = ap.parse_args(argv)
    result = run(args.messages, args.queues)
    print(f"load average {result['machine']['load_average_1m']:.1f}, {args.messages} messages of {len(BODY)} B")
    print(f"{'case':<12} {'client':<56} {'msgs/s':>9} {'broker CPU us/msg':>18}")
    for r in result["rows"]:
        print(f"{r['case']:<12} {r['client']:<56} {r['msgs_per_s']:>9,.0f} {r['broker_cpu_us_per_msg']:>18,.0f}")
    print(f"pop / pull broker CPU per message: {result['pop_over_pull_broker_cpu']:.2f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
