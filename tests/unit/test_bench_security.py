"""bench.security's figures: the median of the rounds with their spread, never the best round, and a run of fewer
than three rounds refused (a median of one round is that round)."""

from __future__ import annotations

import pytest

from bench.security import FIGURES, main, median_of, round_ratios

CASE = "send_batch_1KiB"


def rounds(*rates: float) -> list[dict[str, dict[str, float]]]:
    return [{CASE: {"msgs_per_s": r, "broker_cpu_us_per_msg": r / 100, "client_cpu_us_per_msg": r / 1000}}
            for r in rates]


def test_each_figure_is_the_median_of_the_rounds_with_their_spread() -> None:
    m = median_of(rounds(100.0, 300.0, 120.0), CASE)
    assert m["msgs_per_s"] == 120.0  # the best round, 300, is the spread's top, not the figure
    assert (m["msgs_per_s_min"], m["msgs_per_s_max"]) == (100.0, 300.0)
    assert m["broker_cpu_us_per_msg"] == 1.2 and m["client_cpu_us_per_msg"] == 0.12
    assert set(FIGURES) <= set(m)


def test_a_ratio_s_spread_pairs_the_rounds() -> None:
    runs = {"plain": rounds(100.0, 200.0, 100.0), "tls_auth": rounds(90.0, 100.0, 110.0)}
    assert round_ratios(runs, "tls_auth", CASE) == [0.9, 0.5, 1.1]


@pytest.mark.parametrize("rounds_arg", ["1", "2", "11"])
def test_fewer_than_three_rounds_or_too_many_are_refused(rounds_arg: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--rounds", rounds_arg])
    assert e.value.code == 2 and "--rounds must be 3..10" in capsys.readouterr().err
