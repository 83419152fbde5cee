"""A call the broker's server ended unanswered (CANCELLED without the broker's response code: a master fenced by a
partition restarts in place, and its server's stop cancels the calls in flight) is an unknown outcome, as a call
without an answer is: BrokerUnreachableError with request_sent, which the sink resends under a new attempt and the
readers ask again. It stopped a soak's Spark query four times as a plain BrokerError (docs/soak.md). A call this
process cancelled itself stays a plain error: its caller meant it."""

from __future__ import annotations

import grpc
import pytest

from broker.errors import BrokerError, BrokerUnreachableError, ServiceNotAvailableError
from broker.proto.status import RESPONSE_CODE_KEY, error_from_rpc


class EndedCall(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """What a failed unary call raises: its status, its details, its trailers."""

    def __init__(self, code: grpc.StatusCode, details: str, trailers: tuple[tuple[str, str], ...] = ()) -> None:
        self._code, self._details, self._trailers = code, details, trailers

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailers

    def initial_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: object) -> bool:
        return False


@pytest.mark.parametrize("details", ["CANCELLED", "Cancelled", "Received RST_STREAM with error code 8"])
def test_a_call_the_server_cancelled_is_an_unknown_outcome(details: str) -> None:
    error = error_from_rpc(EndedCall(grpc.StatusCode.CANCELLED, details))
    assert isinstance(error, BrokerUnreachableError) and error.request_sent
    assert "may or may not have been carried out" in error.message


@pytest.mark.parametrize("details", ["Locally cancelled by application!", "Channel closed!"])
def test_a_call_cancelled_here_stays_a_plain_error(details: str) -> None:
    error = error_from_rpc(EndedCall(grpc.StatusCode.CANCELLED, details))
    assert not isinstance(error, ServiceNotAvailableError) and isinstance(error, BrokerError)


def test_the_broker_s_own_answer_wins_over_the_status() -> None:
    """A refusal the broker made carries its response code: that is what the caller gets, whatever the status."""
    error = error_from_rpc(EndedCall(grpc.StatusCode.CANCELLED, "no such group", ((RESPONSE_CODE_KEY, "26"),)))
    assert not isinstance(error, BrokerUnreachableError)
