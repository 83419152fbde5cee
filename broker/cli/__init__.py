"""``sluice``: run a broker, and the commands a person uses to inspect and drive one.

    sluice broker --store DIR --listen HOST:PORT [--flush async|sync] [--config FILE] [--metrics-port N]
                  [--python-cpus auto|off|LIST]
    sluice topic create|list|delete|describe ...
    sluice send TOPIC [--tags T] [--keys K] [--property k=v] [--count N --size B]   (or lines from stdin)
    sluice consume TOPIC --group G [--from earliest|latest|committed] [--follow] [--tags EXPR]
    sluice query key TOPIC KEY | sluice query id MSGID
    sluice group lag GROUP
    sluice stats

Client commands take ``--endpoint`` (default $SLUICE_ENDPOINT or 127.0.0.1:10911) and ``--json``.
Output goes to stdout (tables, or JSON with --json); errors go to stderr with exit status 1.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from broker.errors import BrokerError, InvalidArgumentError

log = logging.getLogger("sluice")
PROGRESS_MIN_COUNT = 1000  # sends of at least this many messages show a progress bar
SEND_CHUNK = 1000  # messages per SendBatch call from `sluice send`


# ------------------------------------------------------------------------------------------------ output helpers
def table(rows: Sequence[Sequence[object]], headers: Sequence[str]) -> str:
    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def emit(args: argparse.Namespace, data: Any, rows: Sequence[Sequence[object]], headers: Sequence[str]) -> None:
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(table(rows, headers))


def message_dict(m: Any) -> dict[str, Any]:
    try:
        body: dict[str, str] = {"body": m.body.decode("utf-8")}
    except UnicodeDecodeError:
        body = {"body": base64.b64encode(m.body).decode(), "body_encoding": "base64"}
    return {
        "msg_id": m.msg_id, "topic": m.topic, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
        "commitlog_offset": m.commitlog_offset, "tags": m.tags, "keys": m.keys, "properties": m.properties,
        "born_timestamp": m.born_timestamp, "store_timestamp": m.store_timestamp,
        "reconsume_times": m.reconsume_times, **body,
    }  # fmt: skip


def message_line(m: Any) -> str:
    body = m.body.decode("utf-8", "replace")
    body = body if len(body) <= 80 else body[:77] + "..."
    return f"{m.queue_id}:{m.queue_offset}  {m.msg_id}  tags={m.tags or '-'}  keys={','.join(m.keys) or '-'}  {body!r}"


# ------------------------------------------------------------------------------------------------ broker
def cmd_broker(args: argparse.Namespace) -> int:
    from broker.config import BrokerConfig
    from broker.server.allocator import tune_malloc
    from broker.server.broker_controller import BrokerController
    from broker.server.thread_placement import start_placement

    tune_malloc()  # this process is the broker's own: see allocator.py for why and what it costs

    overrides = {"store_path": args.store, "listen": args.listen, "flush_disk_type": args.flush,
                 "metrics_port": args.metrics_port, "python_cpus": args.python_cpus}  # fmt: skip
    config = (
        BrokerConfig.from_file(args.config, **overrides) if args.config else BrokerConfig.from_dict({}, **overrides)
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    controller = BrokerController(config)
    controller.start()
    start_placement(config.python_cpus, stop)  # after start: the threads to place exist (see thread_placement.py)
    metrics = f", metrics on port {controller.metrics_port}" if controller.metrics_port is not None else ""
    print(f"sluice broker ready on {controller.address} (store {config.store_dir}, {config.flush_disk_type}{metrics})",
          flush=True)  # fmt: skip
    while not stop.wait(1.0):
        pass
    controller.shutdown()
    return 0


# ------------------------------------------------------------------------------------------------ topics
def cmd_topic(args: argparse.Namespace) -> int:
    from broker.client import Admin

    with Admin(args.endpoint) as admin:
        if args.action == "create":
            t = admin.create_topic(args.topic, args.queues, if_not_exists=args.if_not_exists)
            emit(args, vars_of(t), [[t.topic, t.read_queue_nums]], ["topic", "queues"])
        elif args.action == "delete":
            admin.delete_topic(args.topic)
            emit(args, {"deleted": args.topic}, [[args.topic, "deleted"]], ["topic", "status"])
        elif args.action == "list":
            topics = admin.list_topics()
            emit(args, [vars_of(t) for t in topics], [[t.topic, t.read_queue_nums, t.perm] for t in topics],
                 ["topic", "queues", "perm"])  # fmt: skip
        else:
            offsets = admin.queue_offsets(args.topic)
            data = {"topic": args.topic, "queues": [{"queue_id": q, "min_offset": lo, "max_offset": hi}
                                                    for q, (lo, hi) in sorted(offsets.items())]}  # fmt: skip
            rows = [[q, lo, hi, hi - lo] for q, (lo, hi) in sorted(offsets.items())]
            emit(args, data, rows, ["queue", "min_offset", "max_offset", "messages"])
    return 0


def vars_of(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in obj.__dataclass_fields__}


# ------------------------------------------------------------------------------------------------ send
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

    count, body_of = send_bodies(args)
    props = parse_properties(args.property or [])
    keys = args.keys.split(",") if args.keys else ()
    results = []
    started = time.perf_counter()
    with Producer(args.endpoint) as producer:
        bar = tqdm(total=count, unit="msg", file=sys.stderr, disable=count < PROGRESS_MIN_COUNT or args.json)
        for start in range(0, count, SEND_CHUNK):
            msgs = [Message(args.topic, body_of(i), tags=args.tags, keys=keys, properties=props)
                    for i in range(start, min(start + SEND_CHUNK, count))]  # fmt: skip
            if len(msgs) == 1:
                results.append(producer.send(msgs[0], queue_id=args.queue))
            else:
                results += producer.send_batch(msgs, queue_id=args.queue)
            bar.update(len(msgs))
        bar.close()
    elapsed = time.perf_counter() - started
    data = {"sent": len(results), "seconds": round(elapsed, 3),
            "results": [{"status": r.status.value, "msg_id": r.msg_id, "queue_id": r.queue_id,
                         "queue_offset": r.queue_offset} for r in results]}  # fmt: skip
    if args.json or len(results) <= 20:
        emit(args, data, [[r.status.value, r.msg_id, r.queue_id, r.queue_offset] for r in results],
             ["status", "msg_id", "queue", "queue_offset"])  # fmt: skip
    if not args.json:
        rate = len(results) / elapsed if elapsed > 0 else 0.0
        print(f"sent {len(results)} messages to {args.topic} in {elapsed:.2f} s ({rate:,.0f} msg/s)")
    return 0


# ------------------------------------------------------------------------------------------------ consume
def start_offsets(consumer: Any, topic: str, origin: str) -> dict[int, int]:
    ranges = consumer.queue_offsets(topic)
    committed = consumer.committed_offsets(topic) if origin == "committed" else {}
    return {
        q: committed.get(q, lo) if origin == "committed" else (lo if origin == "earliest" else hi)
        for q, (lo, hi) in ranges.items()
    }


def cmd_consume(args: argparse.Namespace) -> int:
    from broker.client import PullConsumer, PullStatus

    with PullConsumer(args.endpoint, args.group) as consumer:
        offsets = start_offsets(consumer, args.topic, args.origin)
        start = dict(offsets)
        out: queue.Queue[Any] = queue.Queue()
        stop = threading.Event()
        lock = threading.Lock()
        # Only what was printed may be committed: pulled-but-unprinted messages (--max, Ctrl-C) stay unconsumed.
        unprinted: dict[int, int] = dict.fromkeys(offsets, 0)
        printed_next: dict[int, int] = {}

        failures: list[BrokerError] = []

        def drain(qid: int) -> None:
            try:
                pull_queue(qid)
            except BrokerError as e:  # a bad tag expression, a refused group: reported once, nothing committed
                failures.append(e)
                stop.set()

        def pull_queue(qid: int) -> None:
            while not stop.is_set():
                with lock:
                    offset = offsets[qid]
                r = consumer.pull(args.topic, qid, offset, 256, timeout_ms=1000 if args.follow else 0, tags=args.tags)
                with lock:
                    offsets[qid] = r.next_begin_offset
                    unprinted[qid] += len(r.messages)
                for m in r.messages:
                    out.put(m)
                if r.status is PullStatus.NO_NEW_MSG and not args.follow:
                    return
            return

        threads = [threading.Thread(target=drain, args=(q,), daemon=True) for q in sorted(offsets)]
        for t in threads:
            t.start()
        printed = 0
        try:
            while (any(t.is_alive() for t in threads) or not out.empty()) and (not args.max or printed < args.max):
                try:
                    m = out.get(timeout=0.2)
                except queue.Empty:
                    continue
                print(json.dumps(message_dict(m), sort_keys=True) if args.json else message_line(m), flush=True)
                printed += 1
                with lock:
                    unprinted[m.queue_id] -= 1
                    printed_next[m.queue_id] = m.queue_offset + 1
        except KeyboardInterrupt:
            pass
        stop.set()
        for t in threads:
            t.join(timeout=3)
        if failures:
            raise failures[0]
        if not args.no_commit:
            with lock:
                done = {q: o if unprinted[q] == 0 else printed_next.get(q, start[q]) for q, o in offsets.items()}
            consumer.commit_offsets({(args.topic, q): o for q, o in done.items()})
    if not args.json:
        print(f"consumed {printed} messages", file=sys.stderr)
    return 0


# ------------------------------------------------------------------------------------------------ queries, groups
def cmd_query(args: argparse.Namespace) -> int:
    from broker.client import Admin

    with Admin(args.endpoint) as admin:
        found = admin.query_by_key(args.topic, args.key) if args.kind == "key" else [admin.view_message(args.msg_id)]
    rows = [[m.msg_id, m.queue_id, m.queue_offset, m.tags or "", " ".join(m.keys), len(m.body)] for m in found]
    emit(args, [message_dict(m) for m in found], rows, ["msg_id", "queue", "queue_offset", "tags", "keys", "bytes"])
    return 0


def cmd_group(args: argparse.Namespace) -> int:
    from broker.client import Admin

    with Admin(args.endpoint) as admin:
        lags = admin.consumer_lag(args.group, args.topic or "")
    data = {"group": args.group, "total_lag": sum(x.lag for x in lags), "queues": [vars_of(x) for x in lags]}
    rows = [[x.topic, x.queue_id, x.broker_offset, x.consumer_offset, x.lag] for x in lags]
    emit(args, data, rows, ["topic", "queue", "broker_offset", "consumer_offset", "lag"])
    if not args.json:
        print(f"total lag: {data['total_lag']}")
    return 0


def cmd_tx(args: argparse.Namespace) -> int:
    from broker.client import Admin

    with Admin(args.endpoint) as admin:
        if args.action == "list":
            found = admin.list_transactions(args.prefix, args.status or "")
            rows = [[t.transaction_id, t.producer_group, t.status, t.half_count, t.check_times] for t in found]
            emit(args, [vars_of(t) for t in found], rows, ["transaction", "producer_group", "status", "halves",
                                                             "checks"])  # fmt: skip
            return 0
        commit = args.action == "commit"
        ended = (
            {args.target: admin.end_transaction(args.target, commit)}
            if not args.prefix_mode
            else admin.end_transactions(args.target, commit)
        )
    emit(args, ended, [[k, v] for k, v in sorted(ended.items())], ["transaction", "status"])
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from broker.client import Admin

    with Admin(args.endpoint) as admin:
        values = admin.stats()
    emit(args, values, [[k, f"{v:g}"] for k, v in sorted(values.items())], ["stat", "value"])
    return 0


# ------------------------------------------------------------------------------------------------ parser
LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= minimum, else a usage error saying so (not a silent 1 or 0 messages)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}; give an integer >= {minimum}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    from broker.client.connection import DEFAULT_ENDPOINT, ENDPOINT_ENV

    parser = argparse.ArgumentParser(prog="sluice", description="Sluice: a RocketMQ-style message broker")
    parser.add_argument("--log-level", default="WARNING", type=str.upper, choices=LOG_LEVELS,
                        help="logging level (default WARNING; INFO for `sluice broker`)")  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)

    client = argparse.ArgumentParser(add_help=False)
    endpoint_help = f"broker HOST:PORT[,HOST:PORT] (default ${ENDPOINT_ENV} or {DEFAULT_ENDPOINT})"
    client.add_argument("--endpoint", default=None, help=endpoint_help)
    client.add_argument("--json", action="store_true", help="machine-readable JSON output")

    b = sub.add_parser("broker", help="run a broker in the foreground")
    b.add_argument("--store", default=None, help="store directory (default ~/store)")
    b.add_argument("--listen", default=None, help="HOST:PORT to listen on (default 0.0.0.0:10911; port 0 = any)")
    b.add_argument("--flush", choices=["async", "sync"], default=None, help="disk flush mode (default async)")
    b.add_argument("--config", default=None, help="broker config file (.json or .toml)")
    b.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port")
    b.add_argument(
        "--python-cpus",
        default=None,
        help="CPUs for the broker's Python threads: auto (one CPU, the default), off, or a list like 2,3",
    )
    b.set_defaults(func=cmd_broker, log_level_default="INFO")

    t = sub.add_parser("topic", help="create, list, delete or describe topics")
    tsub = t.add_subparsers(dest="action", required=True)
    tc = tsub.add_parser("create", parents=[client])
    tc.add_argument("topic")
    tc.add_argument("--queues", type=int, default=8)
    tc.add_argument("--if-not-exists", action="store_true")
    tsub.add_parser("list", parents=[client])
    for name in ("delete", "describe"):
        tsub.add_parser(name, parents=[client]).add_argument("topic")
    t.set_defaults(func=cmd_topic)

    s = sub.add_parser("send", parents=[client], help="send messages (--body/--size, or one per stdin line)")
    s.add_argument("topic")
    s.add_argument("--tags", default=None)
    s.add_argument("--keys", default=None, help="comma-separated message keys")
    s.add_argument("--property", action="append", help="name=value (repeatable)")
    s.add_argument("--body", default=None, help="message body text")
    s.add_argument("--count", type=int_at_least(1), default=None, help="number of messages (default 1)")
    s.add_argument("--size", type=int_at_least(0), default=None, help="body size in bytes (generated filler)")
    s.add_argument("--queue", type=int, default=None, help="queue id (default: round-robin)")
    s.set_defaults(func=cmd_send)

    c = sub.add_parser("consume", parents=[client], help="print messages of a topic")
    c.add_argument("topic")
    c.add_argument("--group", required=True)
    c.add_argument("--from", dest="origin", choices=["earliest", "latest", "committed"], default="committed",
                   help="start position (committed falls back to earliest)")  # fmt: skip
    c.add_argument("--follow", action="store_true", help="keep waiting for new messages (Ctrl-C to stop)")
    c.add_argument("--tags", default="*", help="tag expression, e.g. 'TagA || TagB'")
    c.add_argument("--max", type=int, default=0, help="stop after this many messages")
    c.add_argument("--no-commit", action="store_true", help="do not commit the group's offsets at the end")
    c.set_defaults(func=cmd_consume)

    q = sub.add_parser("query", help="find messages by key or id")
    qsub = q.add_subparsers(dest="kind", required=True)
    qk = qsub.add_parser("key", parents=[client])
    qk.add_argument("topic")
    qk.add_argument("key")
    qsub.add_parser("id", parents=[client]).add_argument("msg_id")
    q.set_defaults(func=cmd_query)

    g = sub.add_parser("group", help="consumer groups")
    gsub = g.add_subparsers(dest="action", required=True)
    gl = gsub.add_parser("lag", parents=[client])
    gl.add_argument("group")
    gl.add_argument("--topic", default=None)
    g.set_defaults(func=cmd_group)

    sub.add_parser("stats", parents=[client], help="broker statistics").set_defaults(func=cmd_stats)

    x = sub.add_parser("tx", help="transactions: list, commit or roll back (one id, or every open one by prefix)")
    xsub = x.add_subparsers(dest="action", required=True)
    xl = xsub.add_parser("list", parents=[client])
    xl.add_argument("prefix", nargs="?", default="")
    xl.add_argument("--status", choices=["OPEN", "ENDING", "COMMITTED", "ROLLED_BACK"])
    for name in ("commit", "rollback"):
        xe = xsub.add_parser(name, parents=[client])
        xe.add_argument("target", help="a transaction id (or a prefix with --prefix)")
        xe.add_argument("--prefix", dest="prefix_mode", action="store_true", help="every OPEN transaction by prefix")
    x.set_defaults(func=cmd_tx)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = args.log_level if args.log_level != "WARNING" else getattr(args, "log_level_default", "WARNING")
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)  # fmt: skip
    try:
        return int(args.func(args))
    except BrokerError as e:
        print(f"error: {e.message} [{e.code.name}]", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except OSError as e:  # e.g. a store path that is a file, a port taken: say what, without a traceback
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
