"""Sluice in a container for other projects' integration tests, as ``testcontainers`` starts Kafka or Redpanda.

    from broker.testing import SluiceContainer

    with SluiceContainer() as sluice:           # the image `make image` builds, or $SLUICE_IMAGE
        endpoint = sluice.get_endpoint()        # "host:port", for Producer(endpoint) or option("endpoints", ...)

Needs the ``testing`` extra (``pip install 'sluice[testing]'``, which brings ``testcontainers``) and a Docker
engine. ``SluiceContainer`` is a ``testcontainers`` ``DockerContainer``: ``with_env``, ``with_network``,
``with_network_aliases`` and the rest work as for any other container.

What it does beyond a plain container:

* runs the broker image's ``sluice broker`` with ``--flush`` and any further broker arguments (``broker_args``);
* waits until the broker has printed its ``ready`` line (it accepts requests from then on), and fails with the
  container's log when the broker exits first or is not ready within ``start_timeout_s``;
* publishes the broker port on a free host port and ``get_endpoint()`` names it as the client and the Spark
  connector take it: by default as testcontainers does for every container (all interfaces, the host it
  reports, which also works when the tests themselves run in a container); ``bind_host="127.0.0.1"`` keeps a
  local engine's port off the network;
* crash and restart helpers for tests of an application's own recovery: ``kill()`` (SIGKILL, as a power cut of
  the process), ``terminate()`` (SIGTERM, a clean shutdown), ``restart()`` (the same container, the same store);
  with ``volume=`` the store lives on a named volume, which outlives the container.

The store is in the container (its anonymous volume, removed with it) unless ``volume`` names one.

``SluiceCluster`` starts a cluster (docs/cluster.md): a name server and several brokers on one Docker network, for
tests of producers, consumers and Spark jobs against several brokers and of a broker's crash and return:

    from broker.testing import SluiceCluster

    with SluiceCluster(brokers=2) as cluster:
        namesrv = cluster.namesrv_address()     # for Producer(namesrv=...) or option("namesrv", ...)
        cluster.kill_broker(0)                  # docker kill: sends go on to the other broker
        cluster.restart_broker(0)               # the same container and store, back in the routes
"""

from __future__ import annotations

import json
import os
import re
import socket
import string
import time
from typing import Any, Self

from broker.client import Admin
from broker.errors import InvalidArgumentError, ServiceNotAvailableError

try:
    import docker.errors
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.network import Network
except ImportError as e:  # the optional extra is missing: say how to get it, not just which module
    raise ImportError(f"broker.testing needs testcontainers ({e}): pip install 'sluice[testing]'") from e

DEFAULT_IMAGE = "sluice-broker:latest"  # what `make image` (scripts/build-image.sh) tags
IMAGE_ENV = "SLUICE_IMAGE"  # overrides the default image, e.g. a tag pushed to a registry
BROKER_PORT = 10911  # the image's `sluice broker --listen 0.0.0.0:10911`
NAMESRV_PORT = 9876  # RocketMQ's name server port
STORE_DIR = "/var/lib/sluice"  # the image's store volume
# `sluice broker` prints one line with the word "ready" per start, once it accepts requests ("already" is not it).
READY_LINE = re.compile(r"\bready\b")
START_TIMEOUT_S = 60.0  # a first start on a busy machine: the container, Python and the store's recovery
POLL_INTERVAL_S = 0.1
LOG_TAIL_CHARS = 4000  # of the container's log, in a failure's message


class _ReadyLineContainer(DockerContainer):
    """A Sluice process in a container that prints one ``ready`` line per start: start, restart, kill, terminate."""

    what = "process"  # names it in errors
    start_timeout_s = START_TIMEOUT_S
    _starts = 0

    def _image_present(self) -> bool:
        try:
            self.get_docker_client().client.images.get(self.image)
        except docker.errors.ImageNotFound:
            return False
        return True

    # ------------------------------------------------------------------------------------------------ lifecycle
    def start(self) -> Self:
        """Create and start the container, then wait until the process is ready."""
        try:
            super().start()
        except docker.errors.APIError as e:  # a missing image is pulled first, and that fails for a local tag
            if self._image_present():
                raise
            raise ServiceNotAvailableError(
                f"no image {self.image!r} here and none could be pulled ({e.explanation}); build it in a Sluice "
                f"checkout with `make image`, or set {IMAGE_ENV} to an image you have"
            ) from None
        self._starts = 1
        self._wait_ready()
        return self

    def restart(self) -> Self:
        """Start the stopped (killed or terminated) container again, on the same store, and wait until it is
        ready. Docker may publish the port on another host port: ask ``get_endpoint()`` again."""
        self.get_wrapped_container().start()
        self._starts += 1
        self._wait_ready()
        return self

    def kill(self) -> None:
        """SIGKILL the process and wait until the container has exited: no shutdown runs, as in a power cut of the
        process (the page cache survives; what a SYNC flush acknowledged is on disk)."""
        container = self.get_wrapped_container()
        container.kill(signal="SIGKILL")
        container.wait(timeout=int(self.start_timeout_s))

    def terminate(self, timeout_s: int = 20) -> None:
        """SIGTERM (the broker finishes in-flight calls, flushes and saves offsets), SIGKILL after ``timeout_s``."""
        self.get_wrapped_container().stop(timeout=timeout_s)

    def exit_code(self) -> int:
        container = self.get_wrapped_container()
        container.reload()
        return int(container.attrs["State"]["ExitCode"])

    def log_text(self) -> str:
        """The container's output so far (stdout and stderr, interleaved)."""
        return bytes(self.get_wrapped_container().logs(stdout=True, stderr=True)).decode(errors="replace")

    def network_ip(self, network: str) -> str:
        """The container's address on a Docker network it is attached to (it may change when it restarts)."""
        container = self.get_wrapped_container()
        container.reload()
        ip = container.attrs["NetworkSettings"]["Networks"].get(network, {}).get("IPAddress")
        if not ip:
            raise ServiceNotAvailableError(f"the {self.what} container has no address on network {network}")
        return str(ip)

    def _wait_ready(self) -> None:
        """Until the log holds one ``ready`` line per start; fails with the log's tail if the process exits first."""
        container = self.get_wrapped_container()
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            log = self.log_text()
            if sum(bool(READY_LINE.search(line)) for line in log.splitlines()) >= self._starts:
                return
            container.reload()
            if container.status in ("exited", "dead"):
                raise ServiceNotAvailableError(
                    f"the {self.what} container exited before it was ready:\n{log[-LOG_TAIL_CHARS:]}"
                )
            if time.monotonic() > deadline:
                raise ServiceNotAvailableError(
                    f"the {self.what} was not ready within {self.start_timeout_s} s:\n{log[-LOG_TAIL_CHARS:]}"
                )
            time.sleep(POLL_INTERVAL_S)


class SluiceContainer(_ReadyLineContainer):
    """One Sluice broker in a container; ``get_endpoint()`` is its ``host:port`` once started."""

    what = "broker"

    def __init__(
        self,
        image: str | None = None,
        *,
        flush: str = "async",
        broker_args: tuple[str, ...] = (),
        volume: str | None = None,
        bind_host: str | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
        **kwargs: Any,
    ) -> None:
        """``image``: default $SLUICE_IMAGE, else ``sluice-broker:latest``. ``flush``: ``async`` or ``sync``.
        ``broker_args``: more ``sluice broker`` arguments (``--config`` needs the file in the container, e.g.
        through a volume). ``volume``: a Docker volume (or host directory, writable by uid 10001) for the store.
        ``bind_host``: the host interface to publish the port on, and the host ``get_endpoint()`` names (default:
        every interface, and the host testcontainers reports). ``kwargs`` go to ``DockerContainer``."""
        if flush not in ("async", "sync"):
            raise InvalidArgumentError(f"flush={flush!r}; use 'async' or 'sync'")
        super().__init__(image or os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE, **kwargs)
        self.flush = flush
        self.volume = volume
        self.start_timeout_s = start_timeout_s
        self.with_command(["--flush", flush, *broker_args])
        self.bind_host = bind_host
        if bind_host is None:
            self.with_exposed_ports(BROKER_PORT)
        else:  # (interface, None): a free port Docker picks on that interface; docker-py takes the tuple
            self.ports[f"{BROKER_PORT}/tcp"] = (bind_host, None)  # type: ignore[assignment]
        if volume is not None:
            self.with_volume_mapping(volume, STORE_DIR, "rw")
        self._starts = 0

    # ------------------------------------------------------------------------------------------------ access
    def get_endpoint(self) -> str:
        """``host:port`` of the broker as seen from this process, for ``Producer(endpoint)``, ``PullConsumer``,
        ``sluice --endpoint`` or the Spark connector's ``endpoints`` option. Asked of Docker each time: a
        restarted container may be published on another port."""
        if self.bind_host is None:
            return f"{self.get_container_host_ip()}:{self.get_exposed_port(BROKER_PORT)}"
        container = self.get_wrapped_container()
        container.reload()
        bindings = container.attrs["NetworkSettings"]["Ports"].get(f"{BROKER_PORT}/tcp") or []
        if not bindings:
            raise ServiceNotAvailableError(f"the broker port is not published (container {container.status})")
        host = "127.0.0.1" if self.bind_host in ("", "0.0.0.0") else self.bind_host
        return f"{host}:{int(bindings[0]['HostPort'])}"


class SluiceNameServerContainer(_ReadyLineContainer):
    """``sluice namesrv`` in a container of the broker image, listening on ``NAMESRV_PORT``, with
    ``--allow-anonymous-registration`` (a test cluster; docs/security.md): with ``$SLUICE_ROOT_ACCESS_KEY`` and
    ``$SLUICE_ROOT_SECRET_KEY`` given (``with_env``) registration is authenticated all the same."""

    what = "name server"

    def __init__(
        self, image: str | None = None, *, namesrv_args: tuple[str, ...] = (), start_timeout_s: float = START_TIMEOUT_S,
        **kwargs: Any,
    ) -> None:
        super().__init__(image or os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE,
                         entrypoint=["sluice", "namesrv", "--listen", f"0.0.0.0:{NAMESRV_PORT}",
                                     "--allow-anonymous-registration"], **kwargs)
        self.with_command(list(namesrv_args))
        self.start_timeout_s = start_timeout_s


MAX_CLUSTER_BROKERS = 8  # each broker preallocates its own store files (~1.5 GB by default): a test machine holds few
NAMESRV_ALIAS = "namesrv"  # the name server's host name on the cluster's network, for the brokers
REACH_TIMEOUT_S = 5.0  # a connect from this machine to a container on a local bridge network answers at once
BROKER_CONFIG_ENV = "SLUICE_BROKER_CONFIG"  # broker settings (JSON), written to a --config file in the container
# The broker's advertised address is its IP on the network, looked up at every start: Docker may give a restarted
# container another one. `hostname -i` lists the container's addresses from /etc/hosts; the first is the network's.
# The config file is written under umask 077 (in a subshell: the broker keeps the image's umask): it may hold
# auth_root_secret_key, and the broker refuses to start with such a file that others can read.
BROKER_ENTRYPOINT = [
    "sh", "-c",
    f'ip=$(hostname -i); '
    f'if [ -n "${BROKER_CONFIG_ENV}" ]; then (umask 077; printf %s "${BROKER_CONFIG_ENV}" >/tmp/broker.json); '
    f'set -- --config /tmp/broker.json "$@"; fi; exec sluice broker --store {STORE_DIR} '
    f'--listen 0.0.0.0:{BROKER_PORT} --advertise "${{ip%% *}}:{BROKER_PORT}" "$@"',
    "sluice-broker",
]


class SluiceCluster:
    """A Sluice cluster in containers: one name server and ``brokers`` brokers on one new Docker network.

    Layout. A user-defined bridge network (testcontainers ``Network``); the name server on it with the alias
    ``namesrv``; brokers ``broker-a``, ``broker-b``, ... (``broker_name(i)``, id 0: each a master of its own group,
    in cluster ``cluster``) register with ``namesrv:9876`` through the network's DNS. Each broker advertises its own
    IP on the network, looked up when it starts, so that one address serves every client: this machine's producers,
    consumers and Spark jobs, and the other brokers (a transaction's coordinator calls its participants).

    Reaching it. Clients ask the name server (``namesrv_address()``, its IP on the network) for routes, then connect
    to the brokers' IPs. A Linux host routes to a local bridge network's addresses through the bridge interface;
    Docker Desktop and remote engines do not, and ``start()`` fails saying so. Each broker's port is also published
    on 127.0.0.1 (``broker(i).get_endpoint()``) for a client of that one broker.

    Crash and return. ``kill_broker(i)`` is ``docker kill`` (SIGKILL). The name server keeps the dead broker's
    routes until it expires (``--broker-expire-ms``, 120 s); producers avoid a broker they cannot reach for 30 s and
    send non-ordered messages to the others. ``restart_broker(i)`` starts the same container on the same store
    (its volume), waits until it is ready and until the name server lists it again at its current address.

    ``stop()`` removes the containers, their anonymous volumes and the network. Without Ryuk (the testcontainers
    reaper), only ``stop()`` or the ``with`` block's end removes them.
    """

    def __init__(
        self, brokers: int = 2, image: str | None = None, *, cluster: str = "DefaultCluster", flush: str = "async",
        broker_args: tuple[str, ...] = (), broker_config: dict[str, Any] | None = None,
        namesrv_args: tuple[str, ...] = (), labels: dict[str, str] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        """``broker_args``: more ``sluice broker`` arguments for every broker; ``broker_config``: every broker's
        settings file (docs/operations.md), e.g. ``{"store": {"mapped_file_size_commit_log": 64 << 20}}`` for
        small stores; ``namesrv_args``: more ``sluice namesrv`` arguments (``--broker-expire-ms``); ``labels``: on
        every container and the network."""
        if not 1 <= brokers <= MAX_CLUSTER_BROKERS:
            raise InvalidArgumentError(f"brokers={brokers}; a cluster here has 1 to {MAX_CLUSTER_BROKERS}")
        self.start_timeout_s = start_timeout_s
        self.network = Network(docker_network_kw={"labels": dict(labels or {})})
        self._network_created = False
        self.namesrv = SluiceNameServerContainer(image, namesrv_args=namesrv_args, start_timeout_s=start_timeout_s,
                                                 labels=dict(labels or {}))
        self.namesrv.with_network(self.network).with_network_aliases(NAMESRV_ALIAS)
        self.brokers: list[SluiceContainer] = []
        for i in range(brokers):
            args = ("--namesrv", f"{NAMESRV_ALIAS}:{NAMESRV_PORT}", "--cluster", cluster,
                    "--broker-name", self.broker_name(i), *broker_args)
            b = SluiceContainer(image, flush=flush, broker_args=args, bind_host="127.0.0.1", labels=dict(labels or {}),
                                start_timeout_s=start_timeout_s, entrypoint=BROKER_ENTRYPOINT)
            if broker_config:
                b.with_env(BROKER_CONFIG_ENV, json.dumps(broker_config))
            self.brokers.append(b.with_network(self.network))

    @staticmethod
    def broker_name(i: int) -> str:
        return f"broker-{string.ascii_lowercase[i]}"

    # ------------------------------------------------------------------------------------------------ lifecycle
    def start(self) -> Self:
        """The network, the name server, then the brokers; returns once every broker is in the name server's table."""
        self.network.create()
        self._network_created = True
        self.namesrv.start()
        address = self.namesrv_address()
        try:  # a clear error now rather than route lookups that time out
            socket.create_connection((address.rsplit(":", 1)[0], NAMESRV_PORT), REACH_TIMEOUT_S).close()
        except OSError as e:
            raise ServiceNotAvailableError(
                f"this machine cannot reach the name server at {address} on Docker network {self.network.name} ({e}):"
                " SluiceCluster needs a Linux Docker engine on this machine (Docker Desktop and remote engines do not "
                "route to container addresses)"
            ) from None
        for b in self.brokers:
            b.start()
        for i in range(len(self.brokers)):
            self._wait_registered(i)
        return self

    def kill_broker(self, i: int) -> None:
        """``docker kill`` broker ``i`` (SIGKILL) and wait until its container has exited."""
        self.brokers[i].kill()

    def restart_broker(self, i: int) -> None:
        """Start the killed or stopped broker ``i`` again on its store; returns once the name server lists it at its
        address (Docker may have given the container another one)."""
        self.brokers[i].restart()
        self._wait_registered(i)

    def stop(self) -> None:
        """Remove every container with its anonymous volume, then the network; tries each whatever the others do."""
        try:
            for c in [*self.brokers, self.namesrv]:
                try:
                    c.stop(force=True, delete_volume=True)
                except docker.errors.NotFound:
                    pass
        finally:
            if self._network_created:
                self.network.remove()
                self._network_created = False

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------------------ access
    def namesrv_address(self) -> str:
        """``host:port`` of the name server, reachable from this machine and from the cluster's network."""
        return f"{self.namesrv.network_ip(self.network.name)}:{NAMESRV_PORT}"

    def broker(self, i: int) -> SluiceContainer:
        """Broker ``i``'s container (``broker_name(i)``)."""
        return self.brokers[i]

    def broker_address(self, i: int) -> str:
        """``host:port`` broker ``i`` advertises: its IP on the network now."""
        return f"{self.brokers[i].network_ip(self.network.name)}:{BROKER_PORT}"

    def _wait_registered(self, i: int) -> None:
        name, want = self.broker_name(i), self.broker_address(i)
        deadline = time.monotonic() + self.start_timeout_s
        seen: dict[str, str] = {}
        with Admin(namesrv=self.namesrv_address()) as admin:
            while True:
                seen = {b.broker_name: b.address for b in admin.cluster_info().masters()}
                if seen.get(name) == want:
                    return
                if time.monotonic() > deadline:
                    raise ServiceNotAvailableError(
                        f"{name} is not registered at {want} after {self.start_timeout_s} s (the name server lists "
                        f"{seen}):\n{self.brokers[i].log_text()[-LOG_TAIL_CHARS:]}"
                    )
                time.sleep(POLL_INTERVAL_S)
