"""The README's testcontainers example, taken from README.md and run as a user's pytest file would be: its own
pytest process, `SluiceContainer()` with no arguments finding the image through ``$SLUICE_IMAGE``.

It leaves no container behind (``with`` removes it), and the broker it started answered from the host.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import docker
import pytest

pytestmark = pytest.mark.integration

RUN_TIMEOUT_S = 300


def containers_of(client: docker.DockerClient, image: str) -> set[str]:
    return {c.id for c in client.containers.list(all=True, filters={"ancestor": image})}


def test_the_readme_testcontainers_example_passes(
    readme_block: Callable[..., str], broker_image: str, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    example = tmp_path / "test_readme_example.py"
    example.write_text(readme_block("Sluice in your tests"))
    before = containers_of(docker_client, broker_image)
    env = {**os.environ, "SLUICE_IMAGE": broker_image, "TESTCONTAINERS_RYUK_DISABLED": "true"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(example)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )
    assert proc.returncode == 0, f"{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    assert "1 passed" in proc.stdout, proc.stdout
    assert containers_of(docker_client, broker_image) == before, "the example's container was left behind"
