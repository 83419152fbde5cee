"""How hard the Spark crash loops push: a short pass in `make test`, the full loops in `make test-crash`.

Every killed run costs a driver start-up (a JVM and a SparkSession: 30-60 s on 2 cores), so the number of kills,
not the number of messages, sets these tests' time. The short pass still kills the driver part-way through, still
crashes a broker under the query, and still checks every message once; the full run (``SLUICE_LONG_CRASHES=1``)
kills more often over more data, for the random kill points to cover more of a batch's life.
"""

from __future__ import annotations

import os

LONG = os.environ.get("SLUICE_LONG_CRASHES") == "1"


def crash_scale(short: int, long: int) -> int:
    """``long`` under ``SLUICE_LONG_CRASHES=1``, else ``short``."""
    return long if LONG else short
