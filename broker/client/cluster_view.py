"""What `sluice cluster list` shows of replicated groups, from the name servers' registrations
(GetBrokerClusterInfo): each broker's role, master epoch, whether it is in its group's in-sync set and how far
behind its master it is, and per group its master, epoch and in-sync members.

``broker_rows`` gives one JSON-ready dict per broker (the ``--json`` form: ``role``, ``epoch``, ``in_sync``,
``lag_bytes`` beside the name, id and address); ``group_rows`` one per broker group (the table form).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from broker.proto import namesrv_pb2 as npb


def broker_rows(info: npb.BrokerClusterInfo) -> list[dict[str, Any]]:
    return [
        {"cluster": b.cluster, "broker_name": b.broker_name, "broker_id": b.broker_id, "address": b.address,
         "role": b.role, "epoch": b.epoch, "in_sync": b.in_sync or b.role == "MASTER",
         "lag_bytes": 0 if b.role == "MASTER" else b.lag_bytes, "ha_address": b.ha_address,
         "topics": b.topic_count, "commit_log_max_offset": b.runtime.commit_log_max_offset}
        for b in info.brokers
    ]


@dataclass
class GroupRow:
    cluster: str
    broker_name: str
    master: str = ""  # address of the registered master (broker id 0), "" when none is live
    epoch: int = 0
    in_sync: list[str] = field(default_factory=list)  # addresses
    lag_bytes: dict[str, int] = field(default_factory=dict)  # slave address -> bytes behind


def group_rows(info: npb.BrokerClusterInfo) -> list[GroupRow]:
    groups: dict[tuple[str, str], GroupRow] = {}
    for row in broker_rows(info):
        g = groups.setdefault((row["cluster"], row["broker_name"]), GroupRow(row["cluster"], row["broker_name"]))
        if row["role"] == "MASTER" and row["broker_id"] == 0:
            g.master, g.epoch = row["address"], max(g.epoch, row["epoch"])
        else:
            g.lag_bytes[row["address"]] = row["lag_bytes"]
        if row["in_sync"]:
            g.in_sync.append(row["address"])
    return [groups[k] for k in sorted(groups)]
