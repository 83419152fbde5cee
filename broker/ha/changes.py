"""A generation counter that replication streams wait on: bumped whenever there is something new to send (bytes
written, the confirmed offset moved, config files changed, a stream ended). Reading the generation before looking
and waiting for it to change afterwards loses no wake-up between the two."""

from __future__ import annotations

import threading


class Changes:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.generation = 0

    def notify(self) -> None:
        with self._cond:
            self.generation += 1
            self._cond.notify_all()

    def wait(self, seen: int, timeout_s: float) -> None:
        with self._cond:
            if self.generation == seen:
                self._cond.wait(timeout_s)
