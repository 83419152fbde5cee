"""How many long-lived streams one user may hold open at once, each on a gRPC worker thread.

SendStream, PullStream and RocketMQ 5's Telemetry (streams of requests from the client) and the transaction check
stream (``HELD_ANSWER_STREAMS``: one request, answers for the stream's life) each hold a worker for their life.
Their kinds have broker-wide limits (call_stream.py, rmqv2/clients.py, server/check_streams.py), but a user allowed
nothing at all may open the first three (their rights are checked request by request), and two kinds together
reach the whole held-call budget: one credential, leaked or used by a looping client, could then keep every other
user's streams out. So each user holds at most ``1 / USER_SHARE`` of the budget; super users are not counted (they
may stop the broker anyway). Past it a stream is refused when it opens with SYSTEM_BUSY (RocketMQ 5:
TOO_MANY_REQUESTS), before its handler runs; the client falls back to calls or retries later.

An unauthenticated stream is refused by the gate before it gets here and holds nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from broker.errors import SystemBusyError

# A quarter: the streams of at least four users fit at once, and one user's leaves three quarters to the others.
# A client process opens a handful (a producer's SendStream, one Telemetry, a push consumer's PullStream per queue
# it pulls): a quarter of the default budget is 56; a consumer of more queues than that pulls the rest by calls.
USER_SHARE = 4
# Streams of answers to one request that stay open for the client's life (counted like the request streams, which
# are all counted); a RocketMQ 5 receive or pull is a long poll of at most 20 s, and is not.
HELD_ANSWER_STREAMS = frozenset({"/sluice.v1.Broker/TransactionCheckStream"})


class UserStreams:
    """Thread-safe count of the streams each user holds open."""

    def __init__(self, held_budget: int) -> None:
        self.max_per_user = max(1, held_budget // USER_SHARE)
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}

    def hold(self, access_key: str) -> Callable[[], None]:
        """Count one more stream of ``access_key``; SystemBusyError past the limit. Returns its release (once)."""
        with self._lock:
            held = self._held.get(access_key, 0)
            if held >= self.max_per_user:
                raise SystemBusyError(
                    f"user {access_key!r} holds {held} open streams, at most {self.max_per_user} per user (a quarter "
                    "of the broker's held-call budget, grpc_max_workers - grpc_reserved_workers); close unused "
                    "streams or make calls instead"
                )
            self._held[access_key] = held + 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if released:
                    return
                released = True
                left = self._held.get(access_key, 1) - 1
                if left > 0:
                    self._held[access_key] = left
                else:
                    self._held.pop(access_key, None)  # the table holds users with open streams, no more

        return release

    def held(self, access_key: str) -> int:
        with self._lock:
            return self._held.get(access_key, 0)
