"""Shared by every suite: a run that skipped, deselected-by-skip or xfailed any test does not pass.

A skipped test proves nothing, and CI counts the run's exit status only: so a skip anywhere (a ``skip`` marker, a
``pytest.skip`` in a fixture or at module level, a collection-time ``importorskip``) turns a green run red, with
the skipped ids listed. ``xfail_strict`` (pyproject) makes an unexpected pass fail too; an expected failure is
reported here like a skip.

Also shared: the README's code blocks (``readme_block``), which the unit and container suites run as written.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

_not_run: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:  # a skip, or an xfail (reported as skipped with ``wasxfail``)
        _not_run.append(report.nodeid)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:  # a whole module skipped while being collected
        _not_run.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _not_run and session.exitstatus == 0:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            tr.ensure_newline()
            tr.write_line(f"FAILED: {len(_not_run)} test(s) skipped or xfailed; every test must run: {_not_run}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ------------------------------------------------------------------------------------------------ README examples
README = Path(__file__).resolve().parents[1] / "README.md"
_CODE_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def readme_block(heading: str, language: str = "python") -> str:
    """The one ``language`` code block under the README's ``## heading``, exactly as a reader copies it."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    blocks = [code for lang, code in _CODE_BLOCK.findall(text[start : end if end >= 0 else None]) if lang == language]
    assert len(blocks) == 1, f"README section {heading!r} has {len(blocks)} {language} blocks, not one"
    return blocks[0]


@pytest.fixture(name="readme_block")
def readme_block_fixture() -> Callable[..., str]:
    """``readme_block(heading)``: a README example, so tests run what users read (the suites share this)."""
    return readme_block
