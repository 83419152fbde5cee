"""What the integration suite adds to the public ``broker.testing.SluiceContainer``: labels on everything it makes
(so a killed run's leftovers can be found), commands run inside a broker container, and one-off containers that
run tools (the store's check()) on a stopped broker's volume.

Testcontainers' reaper (Ryuk) image cannot be pulled on machines without a registry, so it is disabled here and
whoever makes a container or volume removes it (the fixtures in conftest.py do, whatever the test's outcome).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import docker
import docker.errors
import pytest
from testcontainers.core.config import testcontainers_config

from broker.testing import STORE_DIR, SluiceContainer

LABEL = "sluice.integration"  # on every container and volume the suite makes
STALE_AFTER_S = 3 * 3600  # leftovers of a killed earlier run (no reaper) older than this are removed
SESSION = uuid.uuid4().hex[:12]

# No reaper: its image can't be pulled here. Both the variable (read by testcontainers and anything it starts) and
# the already-loaded configuration object are set.
os.environ["TESTCONTAINERS_RYUK_DISABLED"] = "true"
testcontainers_config.ryuk_disabled = True


def exec_text(broker: SluiceContainer, *cmd: str, stderr: bool = True) -> tuple[int, str]:
    """Run a command inside the running container (as its user `sluice`): (exit code, stdout[+stderr])."""
    result = broker.get_wrapped_container().exec_run(list(cmd), stdout=True, stderr=stderr)
    return int(result.exit_code), bytes(result.output).decode(errors="replace")


def exec_json(broker: SluiceContainer, *cmd: str) -> Any:
    """Run a `--json` CLI command inside the container and parse its stdout; fails with the output if it exits
    non-zero."""
    code, out = exec_text(broker, *cmd, stderr=False)
    if code != 0:
        pytest.fail(f"{' '.join(cmd)} exited {code}: {exec_text(broker, *cmd)[1][-2000:]}", pytrace=False)
    return json.loads(out)


def remove(broker: SluiceContainer) -> None:
    """Remove the container (not its named volume: the fixture that made the volume removes it)."""
    try:
        broker.stop(force=True, delete_volume=False)
    except docker.errors.NotFound:
        pass


# Runs in a one-off container on a stopped broker's volume: opens the store (recovering it as the broker would
# after a crash), runs its consistency oracle, prints every problem and exits 1 when there is any.
STORE_CHECK_PY = f"""
import sys
from broker.store import MessageStore, StoreConfig
store = MessageStore(StoreConfig(store_path={STORE_DIR!r}))
store.start()
try:
    problems = store.check()
finally:
    store.shutdown()
for p in problems:
    print("PROBLEM", p)
print("check:", len(problems), "problem(s)")
sys.exit(1 if problems else 0)
"""


def run_in_volume(
    client: docker.DockerClient, image: str, volume: str, *cmd: str, timeout_s: float = 120
) -> tuple[int, str]:
    """Run `cmd` in a one-off container of `image` with `volume` on the store path; (exit code, output)."""
    container = client.containers.create(
        image,
        entrypoint=list(cmd[:1]),
        command=list(cmd[1:]),
        volumes={volume: {"bind": STORE_DIR, "mode": "rw"}},
        labels={LABEL: SESSION},
    )
    try:
        container.start()
        status = container.wait(timeout=timeout_s)
        output = bytes(container.logs(stdout=True, stderr=True)).decode(errors="replace")
        return int(status["StatusCode"]), output
    finally:
        container.remove(force=True, v=False)


def check_store(client: docker.DockerClient, image: str, volume: str) -> list[str]:
    """The store's check() on a volume whose broker is stopped: [] when consistent, else the problems."""
    code, output = run_in_volume(client, image, volume, "/opt/sluice/bin/python", "-c", STORE_CHECK_PY)
    problems = [line.removeprefix("PROBLEM ") for line in output.splitlines() if line.startswith("PROBLEM ")]
    assert code == (1 if problems else 0), f"store check exited {code}:\n{output[-4000:]}"
    return problems


BrokerFactory = Callable[..., SluiceContainer]


def remove_stale(client: docker.DockerClient) -> None:
    """Containers and volumes an earlier, killed run could not remove (there is no reaper)."""
    now = time.time()
    for c in client.containers.list(all=True, filters={"label": LABEL}):
        if now - docker_time(c.attrs.get("Created", "")) > STALE_AFTER_S:
            c.remove(force=True, v=True)
    for v in client.volumes.list(filters={"label": LABEL, "dangling": True}):
        if now - docker_time(v.attrs.get("CreatedAt", "")) > STALE_AFTER_S:
            v.remove(force=True)


def docker_time(text: str) -> float:
    """Docker's RFC 3339 timestamps (UTC, nanoseconds) -> epoch seconds; 0 when unreadable."""
    try:
        return datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return 0.0


