"""DispatchService: the thread that runs the dispatcher (dispatcher.py) over what the commit log gained.

A pass goes to the end of the log and the thread then sleeps until an append wakes it or ``dispatch_interval_ms``
passes. A pass that fails with an OSError (a full disk, a failing one) is retried after a pause that doubles per
failure in a row; the store refuses writes meanwhile (told through ``on_state``), as acknowledged messages no
consumer can see would only pile up.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable

from broker.store.dispatcher import Dispatcher
from broker.store.flush import ServiceThread

log = logging.getLogger(__name__)

# After a dispatch pass fails with an OSError (ENOSPC creating a consume-queue file...), the next try waits this
# long, doubling per failure in a row up to the maximum.
DISPATCH_BACKOFF_MIN_S = 0.01
DISPATCH_BACKOFF_MAX_S = 1.0


class DispatchService(ServiceThread):
    name = "reput-dispatch"

    def __init__(self, dispatcher: Dispatcher, interval_ms: int, on_state: Callable[[str], None],
                 release_space: Callable[[], bool]) -> None:
        super().__init__()
        self.dispatcher = dispatcher
        self.release_space = release_space  # frees the disk reserve on ENOSPC; True if it did
        self.interval_s = interval_ms / 1000
        self.backoff_s = 0.0  # after an OSError: the pause before the next try, doubled per failure in a row
        self.on_state = on_state  # told why dispatch fails, and "" once a pass succeeds again

    def run_once(self) -> None:
        try:
            self.dispatcher.dispatch_available()
        except OSError as e:
            if e.errno == errno.ENOSPC and self.release_space():
                return  # room was made: the next pass tries again at once
            # A full disk or a failing one lasts: retrying every interval would write an error line each time
            # (a thousand a second, onto that same disk). Puts' wakeups do not cut the pause short; stop() does.
            self.backoff_s = min(max(2 * self.backoff_s, DISPATCH_BACKOFF_MIN_S), DISPATCH_BACKOFF_MAX_S)
            log.error("dispatch failed: %s; retrying in %.2f s", e, self.backoff_s)
            self.on_state(f"consume queues cannot be written ({e}); writes resume once dispatch succeeds")
            self._stop.wait(self.backoff_s)
            return
        if self.backoff_s:
            self.backoff_s = 0.0
            self.on_state("")
        # The pass went to the end of the log: no second look now (it would find nothing, and run before the pulls
        # it just woke, on the same CPU). An append during the pass has set the wake-up, so this returns at once.
        self.wait(self.interval_s)
