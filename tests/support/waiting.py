"""Polling for a condition that other threads or processes make true: the one way every suite waits."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# Often enough to see a condition that holds only for moments (a replica in sync while a flood of connections makes
# it flap), rarely enough that polling a broker over gRPC does not load the cores the brokers under test share.
INTERVAL_S = 0.02
TIMEOUT_S = 30.0  # the default for a condition a broker meets within seconds on an idle machine


def wait_for(condition: Callable[[], T], what: str = "condition", *, timeout_s: float = TIMEOUT_S,
             interval_s: float = INTERVAL_S) -> T:
    """The first truthy value ``condition()`` returns; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def wait_until(condition: Callable[[], object], what: str = "condition", *, timeout_s: float = TIMEOUT_S,
               interval_s: float = INTERVAL_S) -> float:
    """Poll until ``condition()`` is true; the seconds it took. AssertionError naming ``what`` after ``timeout_s``."""
    started = time.monotonic()
    wait_for(condition, what, timeout_s=timeout_s, interval_s=interval_s)
    return time.monotonic() - started


def became_true(condition: Callable[[], object], *, timeout_s: float, interval_s: float = INTERVAL_S) -> bool:
    """Whether ``condition()`` became true within ``timeout_s``: for a test that reacts to a timeout itself."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval_s)
    return False
