"""Ctrl-C for commands that run a while (``send``, ``consume --follow``, ``broker``): stop cleanly, say what was done.

The first SIGINT only asks the command to stop at its next safe point (after the batch being sent is answered,
after the message being printed), so its summary is exact: what was acknowledged was stored, nothing is in doubt.
A second SIGINT raises KeyboardInterrupt at once, for a command stuck on a broker that does not answer; the
command then says what may be in doubt. Either way the command exits with 130 (128 + SIGINT, the shell's
convention) and no traceback.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType, TracebackType
from typing import Any

INTERRUPTED_EXIT = 130  # 128 + SIGINT


class StopOnInterrupt:
    """``with StopOnInterrupt() as stop:`` ... ``if stop.requested: break``. Main thread only (signal handlers)."""

    def __init__(self, notice: str = "") -> None:
        self._event = threading.Event()
        self._previous: Any = None
        self._notice = notice  # said at the first Ctrl-C: what the command finishes before it stops

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout_s: float) -> bool:
        return self._event.wait(timeout_s)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._event.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the second Ctrl-C interrupts at once
        if self._notice:
            sys.stderr.write(f"\n{self._notice} (Ctrl-C again to stop at once)\n")

    def __enter__(self) -> StopOnInterrupt:
        self._previous = signal.signal(signal.SIGINT, self._on_signal)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        signal.signal(signal.SIGINT, self._previous)
