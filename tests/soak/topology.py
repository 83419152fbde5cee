"""The processes of a soak: the replicated group (etcd, name server, three replicas in controller mode) and two more
brokers registered with the same name server, one of them on a small file system that a fault can fill.

Inside the soak's network (network.py) each replica of broker-a listens on the address of a namespace of its own,
and etcd and the name server on the outside namespace's, which the replicas reach over the bridge; broker-b,
broker-c and the clients stay on the outside namespace's loopback. Clients find the replicas through the name
server, whose routes carry the addresses the replicas listen on. Off loopback, the replicas share a secret."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import deque
from pathlib import Path
from typing import Any

from broker.client import Admin
from broker.client.namesrv_client import NameServerClient
from broker.errors import BrokerError, ServiceNotAvailableError, TopicNotExistError
from broker.ha.etcd_process import free_port
from broker.ha.local_group import SMALL_STORE, ReplicaGroup
from broker.private_file import write_private
from broker.server.process import BrokerProcess
from tests.soak import network
from tests.support.waiting import wait_until

# Short leases keep each failover a few seconds (as the fault tests do); a quick check-back of open transactions
# resolves those left UNKNOW (or interrupted by a fault) within the run. So many unanswered checks are allowed
# before a rollback that a producer which found no stream to a new master for a while (it lists the masters every
# 30 s) still answers: the broker's default, 15 checks a minute apart, allows as much.
TXN_SETTINGS = {"transaction_timeout_ms": 2000, "transaction_check_interval_ms": 2000, "transaction_check_max": 100}
GROUP_SETTINGS = {"ha_lease_ttl_s": 2, "min_insync_replicas": 2, "ha_max_lag_ms": 3000, "ha_ack_timeout_ms": 3000,
                  **TXN_SETTINGS}
# broker-c's store: 4 MiB commit-log files on a 48 MiB tmpfs, so the filler takes the disk in an instant and the
# store still holds several files of history (as tests/unit/store/test_full_disk_broker.py).
DISK_MIB = 48
DISK_STORE = {"mapped_file_size_commit_log": 4 << 20, "mapped_file_size_consume_queue": 4000 * 20,
              "max_hash_slot_num": 4096, "max_index_num": 16384, "max_message_size": 64 << 10,
              "max_batch_bytes": 256 << 10}
REPLICATED = "broker-a"
EXTRA = ("broker-b", "broker-c")
DISK_BROKER = "broker-c"
RESTART_BROKER = "broker-b"
OUTPUT_LINES = 2000


HA_SECRET_BYTES = 24  # the replication endpoints' shared secret, off loopback (as test_partition.py's)


def is_root() -> bool:
    return os.geteuid() == 0


class Topology:
    def __init__(self, root: Path, log_level: str = "WARNING") -> None:
        self.root = root
        self.log_level = log_level
        self.in_network = network.inside()  # whether a fault can cut a replica's cable
        if self.in_network:
            secret = root / "ha-secret"
            root.mkdir(parents=True, exist_ok=True)
            write_private(secret, os.urandom(HA_SECRET_BYTES).hex().encode())
            self.group = ReplicaGroup(
                root / "group", 3, settings={**GROUP_SETTINGS, "ha_secret_file": str(secret)}, log_level=log_level,
                hosts={rid: network.ADDRESS[ns] for rid, ns in network.REPLICAS.items()},
                prefixes={rid: network.exec_in(ns) for rid, ns in network.REPLICAS.items()},
                service_host=network.ADDRESS[network.OUTSIDE])
        else:
            self.group = ReplicaGroup(root / "group", 3, settings=GROUP_SETTINGS, log_level=log_level)
        self.ports = {name: free_port() for name in EXTRA}
        self.extra: dict[str, BrokerProcess] = {}
        self.disk: Path | None = None  # broker-c's tmpfs, when mounted

    @property
    def namesrv(self) -> str:
        return self.group.namesrv

    def start(self) -> Topology:
        (self.root / "group").mkdir(parents=True, exist_ok=True)
        self.group.start()
        if is_root():
            self.disk = self.root / "disk-c"
            self.disk.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MIB}m", "tmpfs", str(self.disk)], check=True)
        for name in EXTRA:
            self.start_extra(name)
        return self

    def _store_path(self, name: str) -> Path:
        if name == DISK_BROKER and self.disk is not None:
            return self.disk / "store"
        return self.root / name

    def start_extra(self, name: str) -> BrokerProcess:
        store: dict[str, Any] = DISK_STORE if name == DISK_BROKER and self.disk is not None else SMALL_STORE
        config = self.root / f"{name}.json"
        write_private(config, json.dumps({"store": store, **TXN_SETTINGS}).encode())
        args = ["--namesrv", self.namesrv, "--cluster", self.group.cluster, "--broker-name", name, "--broker-id", "0",
                "--register-interval-ms", "500"]
        proc = BrokerProcess(self._store_path(name), listen=f"127.0.0.1:{self.ports[name]}", config=config,
                             log_level=self.log_level, extra_args=args)
        proc.output = deque(maxlen=OUTPUT_LINES)
        self.extra[name] = proc
        deadline = time.monotonic() + 60
        while True:  # the port of a broker just stopped may linger a moment
            try:
                proc.start()
                return proc
            except ServiceNotAvailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def endpoint(self, name: str) -> str:
        if name == REPLICATED:
            return self.group.endpoint(self.group.wait_master(timeout_s=90))
        return f"127.0.0.1:{self.ports[name]}"

    def names(self) -> list[str]:
        return [REPLICATED, *EXTRA]

    def create_topic(self, topic: str, brokers: list[str], queues: int = 4) -> None:
        for name in brokers:
            with Admin(self.endpoint(name)) as admin:
                admin.create_topic(topic, queues, if_not_exists=True)
        ns = NameServerClient([self.namesrv])

        def routed() -> bool:
            try:
                return {q.broker_name for q in ns.route(topic).queue_datas} >= set(brokers)
            except (TopicNotExistError, BrokerError):
                return False

        try:
            wait_until(routed, f"{topic} routed to {brokers}", timeout_s=60)
        finally:
            ns.close()

    def in_sync(self, count: int = 3) -> bool:
        state = self.group.state()
        return state is not None and len(state.in_sync) >= count and self.group.running(state.master)

    def heal(self) -> None:
        """Every cable plugged in, every process running and unpaused, the disk emptied, every replica back in
        sync."""
        for rid in self.group.ids:
            if self.in_network:
                network.cable(rid, up=True)
            proc = self.group.brokers[rid].proc
            if proc is not None and proc.poll() is None:
                self.group.resume(rid)
            else:
                self.group.start_replica(rid)
        if self.disk is not None:
            (self.disk / "filler").unlink(missing_ok=True)
        for name in EXTRA:
            p = self.extra[name]
            if p.proc is None or p.proc.poll() is not None:
                self.start_extra(name)
        wait_until(self.in_sync, "every replica of broker-a back in sync", timeout_s=180, interval_s=0.5)

    def logs(self, lines: int = 60) -> str:
        extra = "\n".join(f"--- {n}\n" + "\n".join(list(p.output)[-lines:]) for n, p in self.extra.items())
        return self.group.logs(lines) + "\n" + extra

    def close(self) -> None:
        for p in self.extra.values():
            if p.proc is not None and p.proc.poll() is None:
                p.kill()
        self.group.close()
        if self.disk is not None:
            subprocess.run(["umount", "-l", str(self.disk)], check=False)
