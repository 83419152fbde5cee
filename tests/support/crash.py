"""The moments crash tests kill a process at: random, and repeatable from the seed a failing run printed."""

from __future__ import annotations

import os
import random
import time


def crash_seed(test: str) -> int:
    """The seed of a test's kill moments: SLUICE_CRASH_SEED when set, else the clock; printed to replay a failure."""
    seed = int(os.environ.get("SLUICE_CRASH_SEED") or time.time_ns() % 2**32)
    print(f"{test}: SLUICE_CRASH_SEED={seed}")
    return seed


def crash_rng(test: str) -> random.Random:
    """A random.Random seeded with ``crash_seed(test)``."""
    return random.Random(crash_seed(test))
