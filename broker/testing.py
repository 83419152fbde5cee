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

The store is in the container (its anonymous volume, removed with it) unless ``volume`` names one. A later cluster
helper (a name server and several brokers on one Docker network) builds on the same class: each broker is a
``SluiceContainer`` with its own ``broker_args``.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any, Self

from broker.errors import InvalidArgumentError, ServiceNotAvailableError

try:
    import docker.errors
    from testcontainers.core.container import DockerContainer
except ImportError as e:  # the optional extra is missing: say how to get it, not just which module
    raise ImportError(f"broker.testing needs testcontainers ({e}): pip install 'sluice[testing]'") from e

DEFAULT_IMAGE = "sluice-broker:latest"  # what `make image` (scripts/build-image.sh) tags
IMAGE_ENV = "SLUICE_IMAGE"  # overrides the default image, e.g. a tag pushed to a registry
BROKER_PORT = 10911  # the image's `sluice broker --listen 0.0.0.0:10911`
STORE_DIR = "/var/lib/sluice"  # the image's store volume
# `sluice broker` prints one line with the word "ready" per start, once it accepts requests ("already" is not it).
READY_LINE = re.compile(r"\bready\b")
START_TIMEOUT_S = 60.0  # a first start on a busy machine: the container, Python and the store's recovery
POLL_INTERVAL_S = 0.1
LOG_TAIL_CHARS = 4000  # of the container's log, in a failure's message


class SluiceContainer(DockerContainer):
    """One Sluice broker in a container; ``get_endpoint()`` is its ``host:port`` once started."""

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

    def _image_present(self) -> bool:
        try:
            self.get_docker_client().client.images.get(self.image)
        except docker.errors.ImageNotFound:
            return False
        return True

    # ------------------------------------------------------------------------------------------------ lifecycle
    def start(self) -> Self:
        """Create and start the container, then wait until the broker is ready."""
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
        """SIGKILL the broker and wait until the container has exited: no shutdown runs, as in a power cut of the
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

    def log_text(self) -> str:
        """The container's output so far (stdout and stderr, interleaved)."""
        return bytes(self.get_wrapped_container().logs(stdout=True, stderr=True)).decode(errors="replace")

    def _wait_ready(self) -> None:
        """Until the log holds one ``ready`` line per start; fails with the log's tail if the broker exits first."""
        container = self.get_wrapped_container()
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            log = self.log_text()
            if sum(bool(READY_LINE.search(line)) for line in log.splitlines()) >= self._starts:
                return
            container.reload()
            if container.status in ("exited", "dead"):
                raise ServiceNotAvailableError(
                    f"the broker container exited before it was ready:\n{log[-LOG_TAIL_CHARS:]}"
                )
            if time.monotonic() > deadline:
                raise ServiceNotAvailableError(
                    f"the broker was not ready within {self.start_timeout_s} s:\n{log[-LOG_TAIL_CHARS:]}"
                )
            time.sleep(POLL_INTERVAL_S)
