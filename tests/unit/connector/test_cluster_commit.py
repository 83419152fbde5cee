"""The exactly-once sink's commit calls (connector/cluster_commit.py) ride out what a failover and a full disk answer:
a decision or an end done on a master its replicas did not confirm (FLUSH_SLAVE_TIMEOUT) is asked again, a live
broker's "not now" (its disk full) is waited out up to the failover wait, and a broker that does not answer is
given up on after the short retries, as before. Each case stopped a soak's Spark query before (docs/soak.md)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from broker.errors import (
    BrokerError,
    BrokerUnreachableError,
    FlushSlaveTimeoutError,
    InvalidArgumentError,
    ServiceNotAvailableError,
)
from connector import cluster_commit

SHORT_WAIT_S = 1.0


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_commit, "RETRY_DELAYS_S", (0.0, 0.01, 0.01))
    monkeypatch.setattr(cluster_commit, "FAILOVER_WAIT_S", SHORT_WAIT_S)


def failing(errors: Iterator[BrokerError], answer: str = "COMMITTED") -> tuple[Callable[[], str], list[float]]:
    """A call raising each of ``errors`` in turn, then answering; the times it was made."""
    calls: list[float] = []

    def call() -> str:
        calls.append(time.monotonic())
        error = next(errors, None)
        if error is not None:
            raise error
        return answer

    return call, calls


def test_an_end_its_replicas_did_not_confirm_is_asked_again() -> None:
    call, calls = failing(iter([FlushSlaveTimeoutError("EndTransaction was done on the master, but its in-sync "
                                                       "replicas did not confirm it in time")] * 4))
    assert cluster_commit._retried(call) == "COMMITTED"
    assert len(calls) == 5  # past the short retries too: a master that is being replaced answers so for seconds


def test_a_full_disk_is_waited_out_up_to_the_failover_wait() -> None:
    full = ServiceNotAvailableError("disk is over 90% full; writes resume once expired files are deleted or space "
                                    "is freed")
    call, calls = failing(iter([full] * 20))
    assert cluster_commit._retried(call) == "COMMITTED"
    assert len(calls) == 21

    forever, tried = failing(iter([full] * 10_000))
    with pytest.raises(ServiceNotAvailableError, match="disk is over 90% full"):
        cluster_commit._retried(forever)
    assert tried[-1] - tried[0] >= SHORT_WAIT_S  # the last error, once the wait is over


def test_a_broker_that_does_not_answer_is_given_up_after_the_short_retries() -> None:
    down = BrokerUnreachableError("connection refused", request_sent=False)
    call, calls = failing(iter([down] * 100))
    with pytest.raises(BrokerUnreachableError):
        cluster_commit._retried(call)  # no router: nothing says a master is moving
    assert len(calls) == len(cluster_commit.RETRY_DELAYS_S)


def test_a_refusal_that_is_not_for_now_is_raised_at_once() -> None:
    call, calls = failing(iter([InvalidArgumentError("expected_messages must be >= 0")]))
    with pytest.raises(InvalidArgumentError):
        cluster_commit._retried(call)
    assert len(calls) == 1
