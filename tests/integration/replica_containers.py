"""A replicated broker group in containers, for the integration suite: etcd, a name server and N replicas of one
broker group in controller mode, each in its own container on one user-defined Docker network (testcontainers'
``Network``). The host reaches every container at its address on that network (a Linux bridge), so clients on
the host use exactly the addresses the brokers register with the name server, as clients on other machines would.

Every container runs the broker image:

* etcd: there is no etcd image without a registry, and installing etcd-server into a derived image would need the
  Debian mirror during every image build. The host's etcd binary (Debian's etcd-server, which
  ``broker.ha.etcd_process.ensure_etcd`` installs when missing) is copied into the container before it starts
  instead. It is a Go binary linked against glibc only, and the broker image's base is the same Debian release as
  the host. Copying (rather than bind-mounting) also works with an engine on another machine.
* the name server: ``sluice namesrv``, with a short broker expiry so a killed master leaves the routes quickly.
* the replicas: ``SluiceContainer`` with a replication config (controller, secret, small store files) copied in.
  Each registers its container address (the listen address is 0.0.0.0, so the broker advertises the address its
  hostname resolves to, which Docker sets to the container's address on the network).

Containers refer to each other by address, not by network alias: the engine's embedded DNS depends on its
iptables rules, which engines started with ``--iptables=false`` (scripts/ensure-docker.sh falls back to that) lack.
The image's health check (a `sluice stats` process every 10 s) is turned off: it would only cost CPU here.
"""

from __future__ import annotations

import json
import secrets
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker.errors
from sluice_containers import LABEL, SESSION
from testcontainers.core.container import DockerContainer
from testcontainers.core.network import Network

from broker.errors import BrokerError, ServiceNotAvailableError
from broker.ha.controller import GroupState
from broker.ha.etcd_client import Etcd
from broker.ha.etcd_process import ensure_etcd
from broker.testing import BROKER_PORT, STORE_DIR, SluiceContainer
from tests.support.waiting import wait_until

ETCD_PORT = 2379
NAMESRV_PORT = 9876
HA_PORT = 10912  # each replica's replication endpoint, in its own container
CONFIG_DIR = "/etc/sluice-ha"
ETCD_BIN = "/usr/local/bin/etcd"
ETCD_DATA_DIR = "/var/lib/sluice/etcd"  # on the image's volume, writable by its user
NO_HEALTHCHECK = {"test": ["NONE"]}
# Small files: each replica allocates some 20 MiB instead of 1.4 GB (the engine's disk may be small); a commit-log
# file still holds several times what the test sends.
SMALL_STORE = {
    "mapped_file_size_commit_log": 16 << 20, "mapped_file_size_consume_queue": 30_000 * 20,
    "max_hash_slot_num": 16_384, "max_index_num": 65_536,
}
START_TIMEOUT_S = 90.0  # a container start on a busy 2-core machine: Python, gRPC and the store's recovery
POLL_S = 0.1
LOG_TAIL_CHARS = 3000
# Docker copies files in owned by root, and the broker runs as the image's user, which could not read a root-owned
# 0600 file; the broker refuses a secret file others can read. So the secret is copied in as a staging file and
# each replica's entrypoint makes its own private copy (a deployment mounts the secret owned by the broker's user,
# mode 0600).
SECRET_STAGED = f"{CONFIG_DIR}/group.secret.in"
SECRET_FILE = "/tmp/group.secret"
REPLICA_ENTRYPOINT = [
    "sh", "-c",
    f'(umask 077; cp {SECRET_STAGED} {SECRET_FILE}) && exec sluice broker --store {STORE_DIR} '
    f'--listen 0.0.0.0:{BROKER_PORT} "$@"',
    "sluice-broker",
]


def network_ip(container: DockerContainer, network: Network) -> str:
    """The container's address on ``network``."""
    wrapped = container.get_wrapped_container()
    wrapped.reload()
    ip = wrapped.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
    if not ip:
        raise ServiceNotAvailableError(f"container {wrapped.short_id} has no address on {network.name}")
    return str(ip)


def log_text(container: DockerContainer) -> str:
    return bytes(container.get_wrapped_container().logs(stdout=True, stderr=True)).decode(errors="replace")


def _running(container: DockerContainer) -> bool:
    wrapped = container.get_wrapped_container()
    wrapped.reload()
    return bool(wrapped.status == "running")


class ContainerReplicaGroup:
    """etcd, a name server and ``replicas`` brokers (ids 1..N) of group ``broker_name`` in controller mode."""

    def __init__(
        self, image: str, *, replicas: int = 3, broker_name: str = "broker-a", cluster: str = "DefaultCluster",
        settings: dict[str, Any] | None = None, register_interval_ms: int = 500, broker_expire_ms: int = 3000,
    ) -> None:
        self.image = image
        self.broker_name, self.cluster = broker_name, cluster
        self.settings = dict(settings or {})
        self.register_interval_ms = register_interval_ms
        self.broker_expire_ms = broker_expire_ms
        self.ids = list(range(1, replicas + 1))
        self.network = Network(docker_network_kw={"labels": {LABEL: SESSION}})
        self.etcd: DockerContainer | None = None
        self.namesrv_container: DockerContainer | None = None
        self.replicas: dict[int, SluiceContainer] = {}
        self.ips: dict[str, str] = {}  # "etcd", "namesrv", "replica-<id>" -> address on the network
        self.secret = secrets.token_hex(32).encode()  # one per group: replicas prove it to each other

    # ------------------------------------------------------------------------------------------------ start
    def start(self) -> ContainerReplicaGroup:
        try:
            self.network.create()
            self._start_etcd()
            self._start_namesrv()
            # The replicas start at once: each spends most of its start-up in Python imports and waiting for etcd.
            self.replicas = {broker_id: self._replica(broker_id) for broker_id in self.ids}
            with ThreadPoolExecutor(len(self.ids)) as pool:
                list(pool.map(SluiceContainer.start, self.replicas.values()))
            for broker_id, replica in self.replicas.items():
                self.ips[f"replica-{broker_id}"] = network_ip(replica, self.network)
        except BaseException:
            self.close()
            raise
        return self

    def _container(self, entrypoint: list[str], command: list[str]) -> DockerContainer:
        container = DockerContainer(
            self.image, entrypoint=entrypoint, labels={LABEL: SESSION}, healthcheck=NO_HEALTHCHECK
        ).with_command(command)
        return container.with_network(self.network)

    def _start_etcd(self) -> None:
        binary = Path(ensure_etcd()).resolve().read_bytes()
        client_url = f"http://0.0.0.0:{ETCD_PORT}"
        etcd = self._container([ETCD_BIN], [
            "--name", "sluice", "--data-dir", ETCD_DATA_DIR, "--listen-client-urls", client_url,
            "--advertise-client-urls", client_url, "--log-level", "error",
        ]).with_copy_into_container(binary, ETCD_BIN, 0o755)
        self.etcd = etcd
        etcd.start()
        ip = network_ip(etcd, self.network)
        self.ips["etcd"] = ip

        def healthy() -> bool:
            if not _running(etcd):
                raise ServiceNotAvailableError(f"etcd exited:\n{log_text(etcd)[-LOG_TAIL_CHARS:]}")
            try:
                with urllib.request.urlopen(f"http://{ip}:{ETCD_PORT}/health", timeout=1) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_until(healthy, "etcd to answer", timeout_s=START_TIMEOUT_S)

    def _start_namesrv(self) -> None:
        namesrv = self._container(["sluice", "namesrv"], [
            "--listen", f"0.0.0.0:{NAMESRV_PORT}", "--broker-expire-ms", str(self.broker_expire_ms),
            "--allow-anonymous-registration",  # a test network of its own; the brokers run without --auth
        ])
        self.namesrv_container = namesrv
        namesrv.start()
        self.ips["namesrv"] = network_ip(namesrv, self.network)

        def ready() -> bool:
            if not _running(namesrv):
                raise ServiceNotAvailableError(f"the name server exited:\n{log_text(namesrv)[-LOG_TAIL_CHARS:]}")
            return " ready " in f" {log_text(namesrv)} "

        wait_until(ready, "the name server to be ready", timeout_s=START_TIMEOUT_S)

    def _replica_config(self) -> bytes:
        config = {
            "controller": f"etcd://{self.ips['etcd']}:{ETCD_PORT}", "ha_listen": f"0.0.0.0:{HA_PORT}",
            "ha_secret_file": SECRET_FILE, "store": SMALL_STORE, **self.settings,
        }
        return json.dumps(config).encode()

    def _replica(self, broker_id: int) -> SluiceContainer:
        args = ("--config", f"{CONFIG_DIR}/replica.json", "--namesrv", self.namesrv, "--cluster", self.cluster,
                "--broker-name", self.broker_name, "--broker-id", str(broker_id),
                "--register-interval-ms", str(self.register_interval_ms))
        replica = SluiceContainer(
            self.image, broker_args=args, bind_host="127.0.0.1", start_timeout_s=START_TIMEOUT_S,
            labels={LABEL: SESSION}, healthcheck=NO_HEALTHCHECK, entrypoint=REPLICA_ENTRYPOINT,
        )
        replica.with_network(self.network)
        replica.with_copy_into_container(self._replica_config(), f"{CONFIG_DIR}/replica.json")
        replica.with_copy_into_container(self.secret, SECRET_STAGED)
        return replica

    # ------------------------------------------------------------------------------------------------ access
    @property
    def namesrv(self) -> str:
        return f"{self.ips['namesrv']}:{NAMESRV_PORT}"

    def endpoint(self, broker_id: int) -> str:
        """The replica's client address on the network (what it registers with the name server)."""
        return f"{self.ips[f'replica-{broker_id}']}:{BROKER_PORT}"

    def state(self) -> GroupState | None:
        """The group's state in etcd; None when there is none yet, no live master, or etcd does not answer."""
        etcd = Etcd([(self.ips["etcd"], ETCD_PORT)], timeout_s=2)
        prefix = f"/sluice/{self.cluster}/{self.broker_name}/"
        try:
            kv, master = etcd.get(prefix + "state"), etcd.get(prefix + "master")
        except BrokerError:
            return None
        finally:
            etcd.close()
        if kv is None or master is None:
            return None
        return GroupState.from_kv(kv)

    def running(self, broker_id: int) -> bool:
        return _running(self.replicas[broker_id])

    def wait_master(self, timeout_s: float, other_than: int | None = None) -> int:
        """The id of the master etcd names, once it is a running replica other than ``other_than``."""
        found: list[int] = []

        def elected() -> bool:
            state = self.state()
            if state is None or state.master == other_than or not self.running(state.master):
                return False
            found.append(state.master)
            return True

        wait_until(elected, f"a master other than {other_than}", timeout_s=timeout_s)
        return found[-1]

    def wait_in_sync(self, count: int, timeout_s: float) -> None:
        def enough() -> bool:
            state = self.state()
            return state is not None and len(state.in_sync) >= count

        wait_until(enough, f"{count} replicas in sync", timeout_s=timeout_s)

    def docker_kill(self, broker_id: int) -> None:
        """``docker kill`` (SIGKILL) of the replica's container, returning once it has exited."""
        self.replicas[broker_id].kill()

    def logs(self) -> str:
        """The tail of every container's log, for a failing test's message."""
        parts = []
        for name, container in [("etcd", self.etcd), ("namesrv", self.namesrv_container),
                                *((f"replica-{i}", r) for i, r in self.replicas.items())]:
            if container is not None and container._container is not None:
                try:
                    parts.append(f"--- {name}\n{log_text(container)[-LOG_TAIL_CHARS:]}")
                except docker.errors.NotFound:
                    parts.append(f"--- {name}: gone")
        return "\n".join(parts)

    def close(self) -> None:
        for container in [*self.replicas.values(), self.namesrv_container, self.etcd]:
            if container is not None and container._container is not None:
                try:
                    container.stop(force=True, delete_volume=True)
                except docker.errors.NotFound:
                    pass
        try:
            self.network.remove()
        except (docker.errors.NotFound, AssertionError):  # never created (AssertionError: testcontainers' check)
            pass

    def __enter__(self) -> ContainerReplicaGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
