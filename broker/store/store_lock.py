"""StoreLock: the ``lock`` file that keeps a second broker process off a store directory.

An exclusive flock, held from ``MessageStore.start`` to shutdown: two processes appending to one commit log would
interleave entries and each overwrite the other's checkpoint. The kernel drops the lock when the process dies, so a
crash leaves nothing to clean up.
"""

from __future__ import annotations

import fcntl
import os

from broker.errors import StoreLockedError


class StoreLock:
    def __init__(self, store_path: str, lock_path: str) -> None:
        self.store_path = store_path
        self.lock_path = lock_path
        self._fd = -1

    def take(self) -> None:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLockedError(
                f"store {self.store_path} is locked by another broker process (lock file "
                f"{self.lock_path}); stop it or use another store directory"
            ) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1
