"""FaultInjector: the one place the store's own code lets tests make a disk operation fail.

Tests use it to prove behaviour that real disks show rarely (a failed fsync must neither advance the flushed
position nor acknowledge a SYNC_FLUSH send: apache/rocketmq issues 2706, 3129). It is not a mock: the store
runs unchanged and only the chosen system call raises.
"""

from __future__ import annotations

import errno
import os
import threading


class FaultInjector:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fsync_failures = 0
        self.fsync_calls = 0

    def fail_next_fsyncs(self, count: int = 1) -> None:
        """Make the next ``count`` fdatasync calls raise OSError(EIO) instead of syncing."""
        with self._lock:
            self._fsync_failures = count

    def fdatasync(self, fd: int) -> None:
        with self._lock:
            self.fsync_calls += 1
            fail = self._fsync_failures > 0
            if fail:
                self._fsync_failures -= 1
        if fail:
            raise OSError(errno.EIO, "injected fdatasync failure")
        os.fdatasync(fd)
