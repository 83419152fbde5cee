"""Replication metrics on the broker's Prometheus endpoint (gauges read when scraped).

* ``sluice_ha_role`` {role}: 1 for this replica's role (MASTER, SLAVE, or NONE before etcd names one).
* ``sluice_ha_epoch``: the master epoch this replica serves under or follows.
* ``sluice_ha_in_sync_replicas``: master only, the size of its in-sync set (itself included).
* ``sluice_ha_confirmed_offset``: the group's confirmed offset as this replica knows it.
* ``sluice_ha_replica_lag_bytes`` {replica}: master only, log bytes each replica lacks.
* ``sluice_ha_replica_lag_ms`` {replica}: master only, time since each replica was last caught up.
* ``sluice_ha_lag_bytes``: a slave's own distance behind its master (-1 while it follows none).
* ``sluice_ha_elections_total``: elections this replica won since it started.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.server.metrics import BrokerMetrics, Labels

if TYPE_CHECKING:
    from broker.ha.manager import ReplicationManager


def register_replication_metrics(metrics: BrokerMetrics, manager: ReplicationManager) -> None:
    def role() -> list[tuple[Labels, float]]:
        return [((("role", manager.role or "NONE"),), 1.0)]

    def in_sync_size() -> list[tuple[Labels, float]]:
        in_sync = manager.in_sync
        return [((), float(len(in_sync.members)))] if manager.is_master() and in_sync is not None else []

    def lags(index: int) -> list[tuple[Labels, float]]:
        return [((("replica", str(r[0])),), float(r[index])) for r in manager.replica_lags()]

    metrics.add_gauge("sluice_ha_role", "This replica's role (1 for the current one)", role)
    metrics.add_gauge("sluice_ha_epoch", "Master epoch served or followed",
                      lambda: [((), float(manager.status().epoch))])
    metrics.add_gauge("sluice_ha_in_sync_replicas", "Replicas in the master's in-sync set, itself included",
                      in_sync_size)
    metrics.add_gauge("sluice_ha_confirmed_offset", "The group's confirmed commit-log offset (high watermark)",
                      lambda: [((), float(manager.status().confirmed_offset))])
    metrics.add_gauge("sluice_ha_replica_lag_bytes", "Commit-log bytes each replica lacks (master only)",
                      lambda: lags(1))
    metrics.add_gauge("sluice_ha_replica_lag_ms", "Milliseconds since each replica was caught up (master only)",
                      lambda: lags(2))
    metrics.add_gauge("sluice_ha_lag_bytes", "A slave's distance behind its master in bytes (-1: following none)",
                      lambda: [((), float(manager.status().lag_bytes))] if not manager.is_master() else [])
    metrics.add_gauge("sluice_ha_elections_total", "Elections this replica won since it started",
                      lambda: [((), float(manager.elections))])
