"""``sluice send``: messages from ``--body``/``--size`` or one per stdin line, in batches spread over the queues.

Without ``--queue`` each batch is spread over the topic's queues from a random first queue, as the Python client's
``Producer.send_batch`` does (a single message goes to the next queue in turn). Ctrl-C stops after the batch being
sent is answered (broker/cli/interrupt.py) and reports how many messages were sent and acknowledged.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from broker.cli.interrupt import INTERRUPTED_EXIT, StopOnInterrupt
from broker.cli.output import emit
from broker.cli.profile import client_args
from broker.client.route import MessageQueue
from broker.errors import InvalidArgumentError

PROGRESS_MIN_COUNT = 1000  # sends of at least this many messages show a progress bar
SEND_CHUNK = 1000  # messages per SendBatch call
MAX_LISTED_RESULTS = 20  # the table lists each message's result up to this many; more only get the summary


def parse_properties(items: Sequence[str]) -> dict[str, str]:
    props = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InvalidArgumentError(f"--property {item!r} must look like name=value")
        props[name] = value
    return props


def send_bodies(args: argparse.Namespace) -> tuple[int, Callable[[int], bytes]]:
    """How many messages to send, and the body of message i."""
    count = 1 if args.count is None else args.count
    if args.body is not None:
        raw = args.body.encode()
        return count, lambda i: raw
    if args.size is not None:
        filler = (b"sluice" * (args.size // 6 + 1))[: args.size]
        return count, lambda i: filler
    lines = [line.rstrip(b"\n") for line in sys.stdin.buffer]  # bodies are bytes: any encoding passes through
    return len(lines), lines.__getitem__


def cmd_send(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from broker.client import Message, Producer

    count, body_of = send_bodies(args)  # before Ctrl-C is caught: an interrupted stdin read stops at once
    props = parse_properties(args.property or [])
    keys = args.keys.split(",") if args.keys else ()
    results: list[Any] = []
    in_flight = 0
    started = time.perf_counter()
    notice = "stopping after the batch being sent is answered"
    target: dict[str, Any] = {}  # where every message goes: spread (nothing), a queue id, or a broker's queue
    if args.broker is not None:
        if args.queue is None:
            raise InvalidArgumentError("--broker names the broker of --queue; give both (or neither, to spread)")
        target["queue"] = MessageQueue(args.topic, args.broker, args.queue)
    elif args.queue is not None:
        target["queue_id"] = args.queue
    with Producer(**client_args(args)) as producer, StopOnInterrupt(notice) as stop:
        bar = tqdm(total=count, unit="msg", file=sys.stderr, disable=count < PROGRESS_MIN_COUNT or args.json)
        try:
            for start in range(0, count, SEND_CHUNK):
                if stop.requested:
                    break
                msgs = [Message(args.topic, body_of(i), tags=args.tags, keys=keys, properties=props)
                        for i in range(start, min(start + SEND_CHUNK, count))]
                in_flight = len(msgs)
                if len(msgs) == 1:
                    results.append(producer.send(msgs[0], **target))
                else:
                    results += producer.send_batch(msgs, **target)
                in_flight = 0
                bar.update(len(msgs))
        except KeyboardInterrupt:  # a second Ctrl-C, during a call: its messages may or may not be stored
            pass
        finally:
            bar.close()
        interrupted = stop.requested
    elapsed = time.perf_counter() - started
    data = {"sent": len(results) + in_flight, "acknowledged": len(results), "seconds": round(elapsed, 3),
            "results": [{"status": r.status.value, "msg_id": r.msg_id, "queue_id": r.queue_id,
                         "queue_offset": r.queue_offset, "broker_name": r.broker_name, "uniq_key": r.uniq_key}
                        for r in results]}
    if interrupted:
        data["interrupted"] = True
    if args.json or len(results) <= MAX_LISTED_RESULTS:
        emit(args, data, [[r.status.value, r.msg_id, queue_name(r), r.queue_offset] for r in results],
             ["status", "msg_id", "queue", "queue_offset"])
    if interrupted:
        doubt = f"; {in_flight} more were being sent and may or may not be stored" if in_flight else ""
        print(f"interrupted: {len(results) + in_flight} of {count} messages sent to {args.topic}, {len(results)} "
              f"acknowledged (stored){doubt}", file=sys.stderr)
        return INTERRUPTED_EXIT
    if not args.json:
        rate = len(results) / elapsed if elapsed > 0 else 0.0
        print(f"sent {len(results)} messages to {args.topic} in {elapsed:.2f} s ({rate:,.0f} msg/s)")
    return 0


def queue_name(r: Any) -> str:
    """``broker/queue`` in a cluster, the queue id with one broker."""
    return f"{r.broker_name}/{r.queue_id}" if r.broker_name else str(r.queue_id)
