"""``sluice cluster list``: every live broker as the name servers know it."""

from __future__ import annotations

import argparse
import time

from broker.cli.output import emit
from broker.cli.profile import client_args
from broker.errors import InvalidArgumentError


def cmd_cluster(args: argparse.Namespace) -> int:
    from broker.client import Admin

    if not args.namesrv and args.endpoint:
        raise InvalidArgumentError("`sluice cluster` asks the name servers: give --namesrv (or $SLUICE_NAMESRV)")
    with Admin(**client_args(args)) as admin:
        info = admin.cluster_info()
    now_ms = int(time.time() * 1000)
    rows = [[b.cluster, b.broker_name, b.broker_id, b.role, b.address, b.topic_count,
             f"{max(0, now_ms - b.last_update_ms) / 1000:.1f}s ago", f"{b.put_messages_per_s:,.0f}"]
            for b in info.brokers]
    emit(args, info.as_json(), rows, ["cluster", "broker", "id", "role", "address", "topics", "registered", "put/s"])
    return 0
