"""The README's performance table is the one bench/readme_table.py makes from bench/results: no figure is typed."""

from __future__ import annotations

import pytest

from bench import readme_table


def test_the_readme_table_is_made_from_the_results_files() -> None:
    text = readme_table.README.read_text(encoding="utf-8")
    assert readme_table.replaced(text, readme_table.render()) == text, "run python -m bench.readme_table"


def test_every_row_says_its_date_command_and_target() -> None:
    for make in readme_table.ROWS:
        for measure, result, target, date, command in make():
            assert measure and result and command.startswith("`python -m bench.")
            assert target.endswith(("met", "**not met**")) or "met" in target, target
            assert len(date) == 10 and date[4] == date[7] == "-", date


def test_a_readme_without_the_markers_is_refused() -> None:
    with pytest.raises(ValueError):
        readme_table.replaced("# no table here\n", "| a |")
