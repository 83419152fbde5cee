"""The spark extra pins pandas to what PySpark supports, so that no Spark run warns about it."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def test_pandas_is_pinned_below_3_and_pyspark_does_not_warn() -> None:
    """Every Spark run warned "PySpark does not yet fully support pandas >= 3.0.0" (the extra allowed pandas 3)."""
    spark_extra = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["spark"]
    (pandas,) = [Requirement(r) for r in spark_extra if Requirement(r).name == "pandas"]
    assert not pandas.specifier.contains("3.0.0") and pandas.specifier.contains("2.2.0"), pandas
    from pyspark.sql.pandas.utils import require_minimum_pandas_version

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        require_minimum_pandas_version()  # what every pandas/Arrow code path of PySpark calls first
    assert [str(w.message) for w in caught] == []
