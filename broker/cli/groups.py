"""``sluice group list|lag|reset-offsets``: consumer groups, their lag, and moving their committed offsets."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from broker.cli.output import emit, vars_of
from broker.cli.profile import client_args

if TYPE_CHECKING:
    from broker.client import Admin, ResetTo

RESET_RULE = """\
The group must have no live consumer: a running consumer keeps its offsets in memory and would commit them over
the reset, so the broker refuses (exit status 1, nothing changed) while any push consumer of the group sends
heartbeats, as Kafka refuses to reset an active group. Stop the consumers first; one that stopped without leaving
its group counts as live until consumer_expire_ms (120 s by default) after its last heartbeat. Pull consumers
(`sluice consume`, the Spark source) are not tracked: their next commit wins. The check and the reset are one
step on the broker, so a consumer that starts meanwhile reads the reset offsets.

An offset outside a queue's [min, max] is moved to the nearest end (as Kafka does); a time selects, in each
queue, the first message stored at or after it (the queue's end when there is none). The reset is saved to disk
at once."""


def cmd_group(args: argparse.Namespace) -> int:
    from broker.client import Admin

    with Admin(**client_args(args)) as admin:
        if args.action == "list":
            groups = admin.list_groups()
            emit(args, [vars_of(g) for g in groups],
                 [[g.group, g.online_consumers, ",".join(g.topics) or "-"] for g in groups],
                 ["group", "consumers", "topics"])
            return 0
        if args.action == "reset-offsets":
            return reset_offsets(args, admin)
        if admin.cluster_mode:
            return cluster_lag(args, admin)
        lags = admin.consumer_lag(args.group, args.topic or "")
    data = {"group": args.group, "total_lag": sum(x.lag for x in lags), "queues": [vars_of(x) for x in lags]}
    rows = [[x.topic, x.queue_id, x.broker_offset, x.consumer_offset, x.lag] for x in lags]
    emit(args, data, rows, ["topic", "queue", "broker_offset", "consumer_offset", "lag"])
    if not args.json:
        print(f"total lag: {data['total_lag']}")
    return 0


def cluster_lag(args: argparse.Namespace, admin: Admin) -> int:
    """The group's lag summed over the brokers, with each broker's queues (a broker that did not answer is named,
    and its lag left out of the total)."""
    lag = admin.group_lag(args.group, args.topic or "")
    rows = [[b.broker_name, q.topic, q.queue_id, q.broker_offset, q.consumer_offset, q.lag]
            for b in lag.brokers for q in b.queues]
    emit(args, lag.as_json(), rows, ["broker", "topic", "queue", "broker_offset", "consumer_offset", "lag"])
    if not args.json:
        for b in lag.brokers:
            print(f"broker {b.broker_name}: " + (f"lag {b.lag}" if not b.error else f"unknown ({b.error})"))
        print(f"total lag: {lag.total_lag}" + ("" if lag.complete else " (brokers that did not answer left out)"))
    return 0 if lag.complete else 1


def reset_target(args: argparse.Namespace) -> ResetTo:
    from broker.client import ResetTo

    if args.to_earliest:
        return ResetTo.earliest()
    if args.to_latest:
        return ResetTo.latest()
    if args.to_offset is not None:
        return ResetTo.offset(args.to_offset)
    return ResetTo.timestamp(args.to_datetime if args.to_datetime is not None else args.to_timestamp)


def reset_offsets(args: argparse.Namespace, admin: Admin) -> int:
    done = admin.reset_offsets(args.group, args.topic, reset_target(args), queue_id=args.queue, dry_run=args.dry_run)
    data = {"group": args.group, "topic": args.topic, "dry_run": args.dry_run, "queues": [vars_of(r) for r in done]}
    rows = [[f"{r.broker_name}/{r.queue_id}" if r.broker_name else r.queue_id, "-" if r.previous < 0 else r.previous,
             r.offset, r.min_offset, r.max_offset] for r in done]
    emit(args, data, rows, ["queue", "previous", "offset", "min_offset", "max_offset"])
    if not args.json:
        what = "would be reset (dry run: nothing changed)" if args.dry_run else "reset"
        print(f"{len(done)} queue(s) of {args.topic} for group {args.group} {what}", file=sys.stderr)
    return 0
