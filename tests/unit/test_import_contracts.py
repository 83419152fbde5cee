"""The import contracts of pyproject.toml ([tool.importlinter], run by `make lint`): kept by the tree, and broken
by a forbidden import, so a room that reaches upwards fails the lint rather than passing unnoticed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")
PACKAGES = ("broker", "connector", "streaming_jobs")


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}  # the tree's packages, not the installed ones
    return subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def copy_tree(target: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, target / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", target / "pyproject.toml")
    return target


def test_the_tree_keeps_every_contract() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_store_importing_the_server_breaks_its_contract(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path)
    (tree / "broker" / "store" / "upward.py").write_text("from broker.server import service  # noqa: F401\n")
    result = lint_imports(tree)
    assert result.returncode != 0
    assert "The store (commit log, queues, index) knows no semantics" in result.stdout
    assert "BROKEN" in result.stdout and "broker.store.upward -> broker.server.service" in result.stdout


def test_the_broker_importing_the_connector_breaks_its_contract(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path)
    (tree / "broker" / "client" / "spark.py").write_text("import connector.options  # noqa: F401\n")
    result = lint_imports(tree)
    assert result.returncode != 0
    assert "broker.client.spark -> connector.options" in result.stdout


def test_the_client_importing_the_store_breaks_its_contract(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path)
    (tree / "broker" / "client" / "inside.py").write_text("from broker.store import message_store  # noqa: F401\n")
    result = lint_imports(tree)
    assert result.returncode != 0
    assert "The client and the connector know the broker only by its format and wire" in result.stdout
    assert "BROKEN" in result.stdout and "broker.client.inside -> broker.store.message_store" in result.stdout


def test_the_format_importing_the_semantics_breaks_its_contract(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path)
    (tree / "broker" / "format" / "upward.py").write_text("from broker.semantics import delay  # noqa: F401\n")
    result = lint_imports(tree)
    assert result.returncode != 0
    assert "broker.format, the message format every room shares, imports only broker.errors" in result.stdout
    assert "BROKEN" in result.stdout and "broker.format.upward -> broker.semantics.delay" in result.stdout
