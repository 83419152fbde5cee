"""The lock (requirements/lock.txt, requirements/runtime.txt) against pyproject.toml and the running venv.

A fresh clone installs exactly the lock (Makefile); these tests keep the lock honest: it satisfies every range
pyproject.toml declares, the runtime lock is the lock's subset at the same versions, the venv the suite runs in
holds the locked versions, and the committed gRPC stubs carry the locked grpcio-tools' version line.
"""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "lock.txt"
RUNTIME_LOCK = ROOT / "requirements" / "runtime.txt"
# One pin of a lock file: `name==version` and an optional environment marker, before the line's hashes.
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)\s*(?:;\s*(?P<marker>[^\\]+?))?\s*\\?$")


def read_lock(path: Path) -> dict[str, str]:
    """The lock's pins that apply to this interpreter and platform, by canonical name."""
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        match = PIN.match(line)
        if match is None:
            continue
        marker = match["marker"]
        if marker and not Marker(marker).evaluate():
            continue
        name = canonicalize_name(match["name"])
        assert name not in pins, f"{path.name}: {name} pinned twice for this platform"
        pins[name] = match["version"]
    return pins


def project_requirements() -> list[Requirement]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    texts = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        texts += [t for t in extra if not t.startswith("sluice[")]
    return [Requirement(t) for t in texts]


def test_lock_reads_a_pin_per_package() -> None:
    pins = read_lock(LOCK)
    assert len(pins) > 50  # the runtime, every extra and the install tools
    for name in ("grpcio", "grpcio-tools", "protobuf", "pyspark", "ruff", "mypy", "pip", "setuptools", "uv"):
        assert name in pins, f"{name} missing from the lock"


def test_lock_satisfies_every_range_of_pyproject() -> None:
    pins = read_lock(LOCK)
    for requirement in project_requirements():
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in the lock; run `make lock`"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"the lock pins {name}=={pins[name]}, outside pyproject.toml's {requirement}; run `make lock`"
        )


def test_runtime_lock_is_the_locks_subset() -> None:
    pins, runtime = read_lock(LOCK), read_lock(RUNTIME_LOCK)
    with open(ROOT / "pyproject.toml", "rb") as f:
        runtime_names = {canonicalize_name(Requirement(t).name) for t in tomllib.load(f)["project"]["dependencies"]}
    assert runtime_names <= set(runtime)
    for name, pinned in runtime.items():
        assert pins.get(name) == pinned, f"runtime.txt pins {name}=={pinned}, lock.txt {pins.get(name)}"
    assert "pyspark" not in runtime and "pytest" not in runtime  # the image holds the broker's needs alone


def test_every_pin_carries_hashes() -> None:
    for path in (LOCK, RUNTIME_LOCK):
        blocks = re.split(r"\n(?=[A-Za-z0-9])", path.read_text())
        for block in blocks:
            if PIN.match(block.splitlines()[0]):
                assert "--hash=sha256:" in block, f"{path.name}: {block.splitlines()[0]} has no hash"


def test_venv_holds_the_locked_versions() -> None:
    """What `pip freeze` would show equals the lock for every package the lock names (the Makefile installs it)."""
    mismatched: list[str] = []
    for name, pinned in read_lock(LOCK).items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            mismatched.append(f"{name}: locked {pinned}, not installed")
            continue
        if installed != pinned:
            mismatched.append(f"{name}: locked {pinned}, installed {installed}")
    advice = "the venv differs from the lock (run `make venv` after `touch requirements/lock.txt`)"
    assert not mismatched, advice + ":\n" + "\n".join(mismatched)


STUBS = ["sluice_pb2_grpc.py", "namesrv_pb2_grpc.py", "coordinator_pb2_grpc.py", "ha_pb2_grpc.py"]


@pytest.mark.parametrize("stub", STUBS)
def test_committed_stubs_carry_the_locked_generator(stub: str) -> None:
    text = (ROOT / "broker" / "proto" / stub).read_text()
    match = re.search(r"^GRPC_GENERATED_VERSION = '([^']+)'", text, re.MULTILINE)
    assert match is not None, f"{stub} names no generator version"
    assert match[1] == read_lock(LOCK)["grpcio-tools"], f"{stub} was generated by {match[1]}; run `make lock`"


def test_pyproject_asks_for_the_grpcio_the_stubs_need() -> None:
    """The generated stubs refuse a grpcio older than their generator: a user's `pip install` must not get one."""
    text = (ROOT / "broker" / "proto" / "sluice_pb2_grpc.py").read_text()
    match = re.search(r"^GRPC_GENERATED_VERSION = '([^']+)'", text, re.MULTILINE)
    assert match is not None
    grpcio = next(r for r in project_requirements() if canonicalize_name(r.name) == "grpcio")
    lowest = min((s.version for s in grpcio.specifier if s.operator == ">="), default="0")
    assert lowest == match[1], f"pyproject.toml asks for {grpcio}; the stubs need grpcio>={match[1]}"
