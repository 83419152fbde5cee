"""Shared by every suite: a run that skipped, deselected-by-skip or xfailed any test does not pass.

A skipped test proves nothing, and CI counts the run's exit status only: so a skip anywhere (a ``skip`` marker, a
``pytest.skip`` in a fixture or at module level, a collection-time ``importorskip``) turns a green run red, with
the skipped ids listed. ``xfail_strict`` (pyproject) makes an unexpected pass fail too; an expected failure is
reported here like a skip.
"""

from __future__ import annotations

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
