"""The short administrative commands: ``sluice topic ...``, ``sluice query key|id``, ``sluice stats``."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from broker.cli.output import emit, message_dict, number, vars_of
from broker.cli.profile import client_args
from broker.errors import InvalidArgumentError


def cmd_topic(args: argparse.Namespace) -> int:
    from broker.client import Admin

    with Admin(**client_args(args)) as admin:
        if args.action == "create":
            t = admin.create_topic(args.topic, args.queues, if_not_exists=args.if_not_exists, cluster=args.cluster,
                                   broker=args.broker)
            if admin.cluster_mode:
                emit(args, asdict(t), [[t.topic, b.broker_name, b.read_queue_nums] for b in getattr(t, "brokers", ())],
                     ["topic", "broker", "queues"])
            else:
                emit(args, vars_of(t), [[t.topic, t.read_queue_nums]], ["topic", "queues"])
        elif args.action == "delete":
            admin.delete_topic(args.topic)
            emit(args, {"deleted": args.topic}, [[args.topic, "deleted"]], ["topic", "status"])
        elif args.action == "list":
            topics = admin.list_topics()
            if admin.cluster_mode:
                emit(args, [asdict(t) for t in topics],
                     [[t.topic, getattr(t, "broker_name", ""), t.read_queue_nums, t.perm] for t in topics],
                     ["topic", "broker", "queues", "perm"])
            else:
                emit(args, [vars_of(t) for t in topics], [[t.topic, t.read_queue_nums, t.perm] for t in topics],
                     ["topic", "queues", "perm"])
        elif admin.cluster_mode:
            described = admin.describe_topic(args.topic)
            rows = [[b.broker_name, q.queue_id, q.min_offset, q.max_offset, q.max_offset - q.min_offset]
                    for b in described.brokers for q in b.queues]
            emit(args, described.as_json(), rows, ["broker", "queue", "min_offset", "max_offset", "messages"])
        else:
            offsets = admin.queue_offsets(args.topic)
            data = {"topic": args.topic, "queues": [{"queue_id": q, "min_offset": lo, "max_offset": hi}
                                                    for q, (lo, hi) in sorted(offsets.items())]}
            rows = [[q, lo, hi, hi - lo] for q, (lo, hi) in sorted(offsets.items())]
            emit(args, data, rows, ["queue", "min_offset", "max_offset", "messages"])
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    from broker.client import Admin

    if args.kind == "key" and args.begin is not None and args.end is not None and args.begin > args.end:
        raise InvalidArgumentError(f"--begin ({args.begin} ms) is after --end ({args.end} ms); swap them")
    with Admin(**client_args(args)) as admin:
        if args.kind == "key":
            found = admin.query_by_key(args.topic, args.key, args.max, args.begin or 0, args.end or 0)
        else:
            found = [admin.view_message(args.msg_id)]
    rows = [[m.msg_id, m.queue_id, m.queue_offset, m.store_timestamp, m.tags or "", " ".join(m.keys), len(m.body)]
            for m in found]
    emit(args, [message_dict(m) for m in found], rows,
         ["msg_id", "queue", "queue_offset", "store_timestamp", "tags", "keys", "bytes"])
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from broker.client import Admin

    with Admin(**client_args(args)) as admin:
        values = admin.stats()
    emit(args, values, [[k, number(v)] for k, v in sorted(values.items())], ["stat", "value"])
    return 0
