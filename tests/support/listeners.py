"""Push consumers' listeners for tests: what a consumer was given, for the test to wait on and compare."""

from __future__ import annotations

import threading

from broker.client import ConsumeStatus, ReceivedMessage


class BodyRecorder:
    """A listener that records every body it is given, in the order given (a redelivery again), and consumes it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bodies: list[bytes] = []

    def __call__(self, msgs: list[ReceivedMessage]) -> ConsumeStatus:
        with self.lock:
            self.bodies += [m.body for m in msgs]
        return ConsumeStatus.CONSUME_SUCCESS
