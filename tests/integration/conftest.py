"""Fixtures of the integration suite: the broker image, broker containers (``broker.testing.SluiceContainer``, the
class users start Sluice with in their own tests) and their volumes.

The suite runs against the real image built from the current source (scripts/build-image.sh, cached by a hash
of the source, so once per run at most). scripts/ensure-docker.sh, which scripts/test.sh runs before the
suite, installs and starts a Docker engine when the machine has none.

These tests are never skipped: without Docker the fixtures FAIL with what to do, and a run in which any test of
this directory was skipped ends with a non-zero exit status (tests/conftest.py, for every suite).

Testcontainers' reaper (Ryuk) image cannot be pulled on machines without a registry: sluice_containers disables it,
and every container and volume is removed by the fixture that made it, whatever the test's outcome.

Where the rest goes: Spark `readStream`/`writeStream` against the container (test_spark_container.py) and the
exactly-once topic-to-topic job across a broker container restart (test_jobs_container.py) use the same
`broker` / `broker_factory` fixtures: `broker.get_endpoint()` is the "host:port" to give the connector's
`endpoints` option, `broker.kill()` + `broker.restart()` a crash on the same volume, `check_store(...)` the store's
oracle.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
from sluice_containers import LABEL, SESSION, BrokerFactory, remove, remove_stale

from broker.testing import SluiceContainer

REPO = Path(__file__).resolve().parents[2]
INTEGRATION_DIR = Path(__file__).resolve().parent
IMAGE_BUILD_TIMEOUT_S = 900


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.integration)


# ---- the engine and the image -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as e:
        pytest.fail(
            f"no Docker engine answers ({e}). Run `bash scripts/ensure-docker.sh` (as root it installs and starts one),"
            " or start Docker; the integration suite does not skip.",
            pytrace=False,
        )
    remove_stale(client)
    yield client
    client.close()


@pytest.fixture(scope="session")
def broker_image(docker_client: docker.DockerClient) -> str:
    """The broker image tag for the current source; built by scripts/build-image.sh when not cached."""
    proc = subprocess.run(
        ["bash", "scripts/build-image.sh"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=IMAGE_BUILD_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"building the broker image failed:\n{proc.stderr[-4000:]}", pytrace=False)
    tag = proc.stdout.strip().splitlines()[-1]
    docker_client.images.get(tag)  # raises if the script lied
    return tag


@pytest.fixture
def broker_factory(docker_client: docker.DockerClient, broker_image: str) -> Iterator[BrokerFactory]:
    """Makes brokers (each on its own new volume unless one is given); removes them and their volumes after."""
    made: list[SluiceContainer] = []
    volumes: list[str] = []

    def make(flush: str = "async", volume: str | None = None, extra_args: tuple[str, ...] = ()) -> SluiceContainer:
        if volume is None:
            volume = f"sluice-it-{SESSION}-{len(volumes)}"
            docker_client.volumes.create(volume, labels={LABEL: SESSION})
            volumes.append(volume)
        broker = SluiceContainer(  # published on loopback only: nothing outside this machine reaches it
            broker_image, flush=flush, broker_args=extra_args, volume=volume, bind_host="127.0.0.1",
            labels={LABEL: SESSION},
        )
        made.append(broker)
        return broker.start()

    yield make
    for broker in made:
        remove(broker)
    for name in volumes:
        try:
            docker_client.volumes.get(name).remove(force=True)
        except docker.errors.NotFound:
            pass


@pytest.fixture
def broker(broker_factory: BrokerFactory) -> SluiceContainer:
    """A fresh broker container (ASYNC_FLUSH) on a new volume."""
    return broker_factory()
