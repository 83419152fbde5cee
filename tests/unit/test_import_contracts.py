"""The import contracts of pyproject.toml ([tool.importlinter], run by `make lint`): kept by the tree, and broken
by a forbidden import, so a room that reaches upwards fails the lint rather than passing unnoticed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")
PACKAGES = ("broker", "connector", "streaming_jobs")


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}  # the tree's packages, not the installed ones
    return subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=120)


def copy_tree(target: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, target / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", target / "pyproject.toml")
    return target


def test_the_tree_keeps_every_contract() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


# A module added where it may not import what it imports: (file, its line, the contract named, the import shown)
VIOLATIONS = {
    "the store importing the server": (
        "broker/store/upward.py", "from broker.server import broker_service",
        "The store (commit log, queues, index) knows no semantics",
        "broker.store.upward -> broker.server.broker_service",
    ),
    "the broker importing the connector": (
        "broker/client/spark.py", "import connector.options", None, "broker.client.spark -> connector.options",
    ),
    "the client importing the store": (
        "broker/client/inside.py", "from broker.store import message_store",
        "The client and the connector know the broker only by its format and wire",
        "broker.client.inside -> broker.store.message_store",
    ),
    "the format importing the semantics": (
        "broker/format/upward.py", "from broker.semantics import delay",
        "broker.format, the message format every room shares, imports only broker.errors",
        "broker.format.upward -> broker.semantics.delay",
    ),
    "the store importing the remoting front": (
        "broker/store/wire.py", "from broker.remoting import codes",
        "Only the server, name server and command-line wiring and the client import",
        "broker.store.wire -> broker.remoting.codes",
    ),
    "the remoting front reaching into the store": (
        "broker/remoting/shortcut.py", "from broker.store import message_store",
        "The remoting front (broker/remoting) translates to the broker's processors",
        "broker.remoting.shortcut -> broker.store.message_store",
    ),
    "an operation taking a protocol's messages": (
        "broker/server/pop_processor.py", "from broker.proto import sluice_pb2",
        "The operations every protocol front calls",
        "broker.server.pop_processor -> broker.proto.sluice_pb2",
    ),
}


@pytest.mark.parametrize("case", VIOLATIONS)
def test_a_forbidden_import_breaks_its_contract(case: str, tmp_path: Path) -> None:
    module, line, contract, shown = VIOLATIONS[case]
    tree = copy_tree(tmp_path)
    (tree / module).write_text(f"{line}  # noqa: F401\n")
    result = lint_imports(tree)
    assert result.returncode != 0
    if contract is not None:
        assert contract in result.stdout
    assert "BROKEN" in result.stdout and shown in result.stdout
