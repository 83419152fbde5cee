"""Component tests of controller mode on in-process brokers and a real etcd: a diverged replica truncated to the
divergence point (the divergence built on purpose), a stale master fenced, replicas refusing a stale epoch."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.address import free_fixed_port
from broker.client import Message, Producer
from broker.errors import BrokerError, SendOutcomeUnknownError
from broker.ha.controller import GroupState
from broker.ha.etcd_client import Etcd
from broker.ha.etcd_process import EtcdProcess
from broker.server.broker_controller import BrokerController
from tests.support.replicas import broker, brokers, caught_up, commit_log_bytes
from tests.support.waiting import wait_until


def _replica(tmp_path: Path, etcd: EtcdProcess, broker_id: int, ports: tuple[int, int] = (0, 0), /,
             **settings: object) -> BrokerController:
    """``ports``: (client, replication); a replica restarted on its ports needs both drawn outside the ephemeral
    range (free_fixed_port), or an outgoing connection may hold one of them meanwhile."""
    client, ha = ports
    ha_listen = {"ha_listen": f"127.0.0.1:{ha}"} if ha else {}
    return broker(tmp_path / f"r{broker_id}", controller=etcd.url, broker_id=broker_id, ha_lease_ttl_s=2,
                  listen=f"127.0.0.1:{client}", **ha_listen, **settings)  # type: ignore[arg-type]


# Replica 2 stays in the in-sync set while it hears nothing (so it may be elected), and writes it does not confirm
# time out fast; one replica in sync is enough to write, so the new master takes writes before replica 1 is back.
LONG_LAG = {"ha_max_lag_ms": 60_000, "ha_ack_timeout_ms": 700, "min_insync_replicas": 1}


def _master(bs: list[BrokerController]) -> BrokerController:
    masters = [b for b in bs if b.replication is not None and b.replication.is_master()]
    assert len(masters) <= 1, "two masters at once"
    if not masters:
        raise AssertionError("no master")
    return masters[0]


def _has_master(bs: list[BrokerController]) -> bool:
    try:
        _master(bs)
        return True
    except AssertionError:
        return False


def test_a_diverged_replica_is_truncated_to_the_divergence_point(tmp_path: Path, etcd: EtcdProcess) -> None:
    with brokers() as bs:
        a_ports = (free_fixed_port(), free_fixed_port())  # replica 1 comes back on them
        a = _replica(tmp_path, etcd, 1, a_ports, **LONG_LAG)
        bs.append(a)
        wait_until(lambda: _has_master([a]), "replica 1 elected")
        b = _replica(tmp_path, etcd, 2, **LONG_LAG)
        bs.append(b)
        assert a.replication is not None and b.replication is not None and a.store is not None
        wait_until(lambda: len(a.replication.in_sync.members) == 2, "replica 2 in sync")  # type: ignore[union-attr]
        with Producer(endpoint=a.address, timeout_s=2, attempt_timeout_s=1) as p:
            for i in range(50):
                p.send(Message("T", f"both-{i}".encode(), keys=f"both-{i}"), queue_id=0)
            wait_until(lambda: caught_up(a, b), "replica 2 to hold everything")
            agreed = b.store.max_phys_offset()  # type: ignore[union-attr]
            b.replication.slave_fetcher.stop()  # replica 2 hears nothing more of epoch 1
            for i in range(3):  # appended by replica 1 only: its log runs ahead of the group's
                with pytest.raises(SendOutcomeUnknownError):
                    p.send(Message("T", f"only-a-{i}".encode(), keys=f"only-a-{i}"), queue_id=0)
        diverged = a.store.max_phys_offset()
        assert diverged > agreed
        a.shutdown()  # its lease is revoked: replica 2, in sync, takes epoch 2 at the agreed offset
        bs.remove(a)
        wait_until(lambda: b.replication is not None and b.replication.is_master(), "replica 2 elected")
        assert b.replication is not None and b.replication.epoch == 2
        with Producer(endpoint=b.address, timeout_s=5) as p:
            for i in range(20):
                p.send(Message("T", f"epoch-2-{i}".encode()), queue_id=0)
        a = _replica(tmp_path, etcd, 1, a_ports, **LONG_LAG)  # returns from epoch 1
        bs.append(a)
        wait_until(lambda: caught_up(b, a) and a.store is not None and a.store.max_phys_offset() > agreed,
                   "replica 1 truncated and caught up")
        assert commit_log_bytes(a) == commit_log_bytes(b)
        assert a.store is not None and b.store is not None
        assert a.replication is not None
        assert [(e.epoch, e.start_offset) for e in a.replication.epochs.entries] == [(1, 0), (2, agreed)]
        assert a.store.query_by_key("T", "only-a-0", confirmed_only=False) == []  # the cut entries are gone
        assert len(a.store.query_by_key("T", "both-49")) == 1
        assert a.store.check() == [] and b.store.check() == []


def test_a_stale_master_is_fenced(tmp_path: Path, etcd: EtcdProcess) -> None:
    """etcd names a newer epoch (another replica won an election this master did not see): the master stops
    acknowledging and rejoins as a replica; a replica that knows the newer epoch refuses the stale master."""
    with brokers() as bs:
        a = _replica(tmp_path, etcd, 1, min_insync_replicas=1)
        bs.append(a)
        wait_until(lambda: _has_master([a]), "replica 1 elected")
        with Producer(endpoint=a.address, timeout_s=2) as p:
            p.send(Message("T", b"before"))
        client = Etcd([("127.0.0.1", etcd.client_port)])
        try:
            state = GroupState.from_kv(client.get("/sluice/DefaultCluster/g/state"))  # type: ignore[arg-type]
            newer = GroupState(state.epoch + 1, 7, frozenset({7}), "127.0.0.1:1", "127.0.0.1:2")
            client.put("/sluice/DefaultCluster/g/state", newer.to_json())
            client.put("/sluice/DefaultCluster/g/master", {"brokerId": 7, "epoch": newer.epoch})
        finally:
            client.close()
        wait_until(lambda: a.replication is not None and not a.replication.is_master(), "replica 1 fenced")
        with Producer(endpoint=a.address, timeout_s=2) as p, pytest.raises(BrokerError):
            p.send(Message("T", b"after"))
        wait_until(lambda: a.replication is not None and a.replication.known_epoch() >= 2, "the new epoch known")


def test_a_replica_refuses_a_master_older_than_the_epoch_it_knows(tmp_path: Path, etcd: EtcdProcess) -> None:
    with brokers() as bs:
        a = _replica(tmp_path, etcd, 1, min_insync_replicas=1)
        bs.append(a)
        wait_until(lambda: _has_master([a]), "replica 1 elected")
        b = _replica(tmp_path, etcd, 2, min_insync_replicas=1)
        bs.append(b)
        assert a.replication is not None and b.replication is not None
        wait_until(lambda: len(a.replication.in_sync.members) == 2, "replica 2 in sync")  # type: ignore[union-attr]
        b.replication.learned_epoch(9)  # it heard of epoch 9 (say, before a partition healed)
        b.replication.slave_fetcher.reconnect()
        # its next Hello names epoch 9: the master of epoch 1 learns it is stale and steps down
        wait_until(lambda: a.replication is not None and not a.replication.is_master(), "the stale master fenced")
