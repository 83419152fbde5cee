"""``sluice consume``: print a topic's messages (one pull thread per queue), then commit what was printed.

Only what was printed is committed: messages pulled but not printed (``--max``, Ctrl-C) stay unconsumed for the
group. ``--tags`` filters by tag expression, ``--sql`` by an SQL92 selector over the properties (evaluated by the
broker). Ctrl-C stops after the message being printed, commits, reports and exits with 130.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
from typing import Any

from broker.cli.interrupt import INTERRUPTED_EXIT, StopOnInterrupt
from broker.cli.output import message_dict, message_line
from broker.cli.profile import client_args
from broker.client.route import MessageQueue
from broker.errors import BrokerError

PULL_BATCH = 256  # messages per pull
FOLLOW_HOLD_MS = 1000  # --follow: how long the broker holds a pull that finds nothing (and so how fast Ctrl-C ends)
PRINT_POLL_S = 0.2  # the printing loop looks for Ctrl-C and finished pull threads this often
JOIN_S = 3.0  # a pull thread still waiting on the broker after this is left behind (daemon)
BUFFERED_MESSAGES = 4 * PULL_BATCH  # pulled and waiting to be printed (a pull thread waits while this is full)


def start_offsets(consumer: Any, topic: str, origin: str) -> dict[MessageQueue, int]:
    """Each queue's first offset to print, on every broker of the topic."""
    ranges = consumer.queue_ranges(topic)
    committed = consumer.committed_by_queue(topic) if origin == "committed" else {}
    return {
        q: committed.get(q, lo) if origin == "committed" else (lo if origin == "earliest" else hi)
        for q, (lo, hi) in ranges.items()
    }


def cmd_consume(args: argparse.Namespace) -> int:
    from broker.client import PullConsumer, PullStatus

    with (
        PullConsumer(group=args.group, **client_args(args)) as consumer,
        StopOnInterrupt() as interrupt,
    ):
        offsets = start_offsets(consumer, args.topic, args.origin)
        start = dict(offsets)
        out: queue.Queue[Any] = queue.Queue(BUFFERED_MESSAGES)
        stop = threading.Event()
        lock = threading.Lock()
        unprinted: dict[MessageQueue, int] = dict.fromkeys(offsets, 0)
        printed_next: dict[MessageQueue, int] = {}
        failures: list[BrokerError] = []

        def drain(mq: MessageQueue) -> None:
            try:
                pull_queue(mq)
            except BrokerError as e:  # a bad filter expression, a refused group: reported once, nothing committed
                failures.append(e)
                stop.set()

        def pull_queue(mq: MessageQueue) -> None:
            while not stop.is_set():
                with lock:
                    offset = offsets[mq]
                r = consumer.pull(mq, offset, max_msgs=PULL_BATCH, timeout_ms=FOLLOW_HOLD_MS if args.follow else 0,
                                  tags=args.tags, sql=args.sql)
                with lock:
                    offsets[mq] = r.next_begin_offset
                    unprinted[mq] += len(r.messages)
                for m in r.messages:
                    while not stop.is_set():
                        try:
                            out.put((mq, m), timeout=PRINT_POLL_S)
                            break
                        except queue.Full:
                            continue
                if r.status is PullStatus.NO_NEW_MSG and not args.follow:
                    return

        threads = [threading.Thread(target=drain, args=(q,), daemon=True) for q in sorted(offsets)]
        for t in threads:
            t.start()
        printed = 0
        try:
            while (any(t.is_alive() for t in threads) or not out.empty()) and (not args.max or printed < args.max):
                if interrupt.requested:
                    break
                try:
                    mq, m = out.get(timeout=PRINT_POLL_S)
                except queue.Empty:
                    continue
                text = json.dumps(message_dict(m, mq.broker_name), sort_keys=True) if args.json else message_line(
                    m, mq.broker_name
                )
                print(text, flush=True)
                printed += 1
                with lock:
                    unprinted[mq] -= 1
                    printed_next[mq] = m.queue_offset + 1
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=JOIN_S)
        if failures:
            raise failures[0]
        if not args.no_commit:
            with lock:
                done = {q: o if unprinted[q] == 0 else printed_next.get(q, start[q]) for q, o in offsets.items()}
            consumer.commit_offsets(done)
        interrupted = interrupt.requested
    committed = "" if args.no_commit else f"; group {args.group} committed after the last printed message"
    if interrupted:
        print(f"interrupted: consumed {printed} messages{committed}", file=sys.stderr)
        return INTERRUPTED_EXIT
    if not args.json:
        print(f"consumed {printed} messages", file=sys.stderr)
    return 0
