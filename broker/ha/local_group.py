"""A replicated broker group on this machine, for tests and benchmarks: an etcd, a name server and N replicas of
one broker group in controller mode (or a classic master and slaves), each a child process with its own store.

Replicas get broker ids 1..N and fixed ports (client and replication), so a replica restarted after a kill comes
back where clients and its peers look for it. ``master_id()`` asks etcd which replica is master.

Everything listens on 127.0.0.1 unless told otherwise: ``hosts`` gives a replica another listen address and
``prefixes`` a command its broker runs under (``ip netns exec NAME``, for a replica in a network namespace of its
own, whose PID stays the broker's), ``service_host`` the address etcd and the name server listen on (one the
replicas can reach). Replication endpoints off loopback need ``ha_secret_file`` in ``settings``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import deque
from pathlib import Path
from typing import Any

from broker.errors import BrokerError, ServiceNotAvailableError
from broker.ha.controller import GroupState
from broker.ha.etcd_client import Etcd
from broker.ha.etcd_process import EtcdProcess, free_port
from broker.namesrv.local_cluster import NameServerProcess
from broker.private_file import write_private
from broker.server.process import BrokerProcess

# Small files: a fresh store allocates a few MiB instead of 1.4 GB (tests start many).
SMALL_STORE = {
    "mapped_file_size_commit_log": 64 << 20, "mapped_file_size_consume_queue": 30_000 * 20,
    "max_hash_slot_num": 16_384, "max_index_num": 65_536,
}
START_WAIT_S = 60.0
PAUSE_WAIT_S = 5.0  # a stop takes effect within a scheduling round; past this the caller goes on regardless
OUTPUT_LINES = 3000  # of each replica's log kept for a failing test (a thread dump of a master runs to hundreds)


class ReplicaGroup:
    def __init__(
        self, root: Path, replicas: int = 3, *, broker_name: str = "broker-a", cluster: str = "DefaultCluster",
        controller: bool = True, settings: dict[str, Any] | None = None, store: dict[str, Any] | None = None,
        flush: str = "async", log_level: str = "WARNING", register_interval_ms: int = 500,
        broker_expire_ms: int = 3000, hosts: dict[int, str] | None = None,
        prefixes: dict[int, list[str]] | None = None, service_host: str = "127.0.0.1",
    ) -> None:
        self.root = root
        self.broker_name, self.cluster = broker_name, cluster
        self.controller = controller
        self.flush, self.log_level = flush, log_level
        self.register_interval_ms = register_interval_ms
        self.etcd = EtcdProcess(root / "etcd", host=service_host) if controller else None
        self.namesrv_proc = NameServerProcess(listen=f"{service_host}:0", broker_expire_ms=broker_expire_ms,
                                              log_level=log_level)
        self.ids = list(range(1, replicas + 1))
        self.hosts = {i: (hosts or {}).get(i, "127.0.0.1") for i in self.ids}
        self.prefixes = {i: (prefixes or {}).get(i, []) for i in self.ids}
        # free here; a replica in a network namespace of its own finds every port free
        self.ports = {i: free_port() for i in self.ids}
        self.ha_ports = {i: free_port() for i in self.ids}
        self.settings = dict(settings or {})
        self.store = {**SMALL_STORE, **(store or {})}
        self.brokers: dict[int, BrokerProcess] = {}

    @property
    def namesrv(self) -> str:
        return self.namesrv_proc.address

    def _config(self, broker_id: int) -> Path:
        ha_listen = f"{self.hosts[broker_id]}:{self.ha_ports[broker_id]}"
        data: dict[str, Any] = {"store": self.store, "ha_listen": ha_listen, **self.settings}
        if self.controller:
            assert self.etcd is not None
            data["controller"] = self.etcd.url
        elif broker_id == self.ids[0]:
            data.setdefault("role", "SYNC_MASTER")
        else:
            data["role"] = "SLAVE"
            data["ha_master_address"] = f"{self.hosts[self.ids[0]]}:{self.ha_ports[self.ids[0]]}"
        if not data.get("role") and not self.controller:  # a broker without replication: no endpoint either
            data.pop("ha_listen", None)
            data.pop("role", None)
        path = self.root / f"replica-{broker_id}.json"
        write_private(path, json.dumps(data).encode())  # settings may hold auth_root_secret_key
        return path

    def start(self) -> ReplicaGroup:
        try:
            if self.etcd is not None:
                self.etcd.start()
            self.namesrv_proc.start()
            for broker_id in self.ids:
                self.start_replica(broker_id)
        except BaseException:
            self.close()
            raise
        return self

    def start_replica(self, broker_id: int) -> BrokerProcess:
        classic_id = 0 if not self.controller and broker_id == self.ids[0] else broker_id
        args = ["--namesrv", self.namesrv, "--cluster", self.cluster, "--broker-name", self.broker_name,
                "--broker-id", str(classic_id), "--register-interval-ms", str(self.register_interval_ms)]
        proc = BrokerProcess(self.root / f"replica-{broker_id}", listen=self.endpoint(broker_id),
                             flush=self.flush, config=self._config(broker_id), log_level=self.log_level,
                             extra_args=args)
        proc.args = [*self.prefixes[broker_id], *proc.args]
        proc.output = deque(maxlen=OUTPUT_LINES)
        self.brokers[broker_id] = proc  # before it starts: a watcher may act on its process while it starts
        deadline = time.monotonic() + START_WAIT_S
        while True:  # a port of a killed replica may linger a moment
            try:
                proc.start()
                break
            except ServiceNotAvailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        return proc

    def endpoint(self, broker_id: int) -> str:
        return f"{self.hosts[broker_id]}:{self.ports[broker_id]}"

    def state(self) -> GroupState | None:
        """The group's state in etcd (controller mode), None when there is none yet or etcd does not answer."""
        if self.etcd is None:
            return None
        etcd = Etcd([(self.etcd.host, self.etcd.client_port)])
        try:
            kv = etcd.get(f"/sluice/{self.cluster}/{self.broker_name}/state")
            master = etcd.get(f"/sluice/{self.cluster}/{self.broker_name}/master")
        except BrokerError:
            return None
        finally:
            etcd.close()
        if kv is None or master is None:
            return None
        return GroupState.from_kv(kv)

    def master_id(self) -> int | None:
        if self.etcd is None:
            return self.ids[0]
        state = self.state()
        return state.master if state is not None else None

    def wait_master(self, timeout_s: float = 30.0, other_than: int | None = None) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            m = self.master_id()
            if m is not None and m != other_than and self.running(m):
                return m
            time.sleep(0.05)
        raise AssertionError(f"no master (other than {other_than}) within {timeout_s} s")

    def log_end(self, broker_id: int) -> int:
        """The replica's commit-log end, from its stats (-1 when it does not answer)."""
        from broker.client import Admin

        try:
            with Admin(self.endpoint(broker_id)) as admin:
                return int(admin.stats().get("store_commit_log_max_offset", -1))
        except BrokerError:
            return -1

    def running(self, broker_id: int) -> bool:
        p = self.brokers.get(broker_id)
        return p is not None and p.proc is not None and p.proc.poll() is None

    def kill(self, broker_id: int) -> None:
        self.brokers[broker_id].kill()

    def stop(self, broker_id: int) -> None:
        self.brokers[broker_id].stop()

    def pause(self, broker_id: int) -> None:
        """SIGSTOP the replica and return once every thread of it has stopped: the signal only asks, and on a
        loaded machine a thread already running (say, acknowledging a fetch) goes on until it is next scheduled."""
        proc = self.brokers[broker_id].proc
        assert proc is not None
        proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + PAUSE_WAIT_S
        while time.monotonic() < deadline and not _all_threads_stopped(proc.pid):
            time.sleep(0.005)

    def resume(self, broker_id: int) -> None:
        proc = self.brokers[broker_id].proc
        assert proc is not None
        proc.send_signal(signal.SIGCONT)

    def restart(self, broker_id: int) -> BrokerProcess:
        if self.running(broker_id):
            self.brokers[broker_id].stop()
        return self.start_replica(broker_id)

    def logs(self, lines: int = 40) -> str:
        """The last lines of every replica's log, for a failing test's message."""
        return "\n".join(f"--- replica {rid}\n" + "\n".join(list(p.output)[-lines:]) for rid, p in self.brokers.items())

    def close(self) -> None:
        for p in self.brokers.values():
            if p.proc is not None and p.proc.poll() is None:
                p.proc.send_signal(signal.SIGCONT)
                p.kill()
        if self.namesrv_proc.running:
            self.namesrv_proc.kill()
        if self.etcd is not None:
            self.etcd.kill()

    def __enter__(self) -> ReplicaGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (state T in /proc/PID/task/TID/stat); True when it is gone."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for tid in tasks:
        try:
            state = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # the thread ended meanwhile
        if state not in ("T", "t"):
            return False
    return True
