"""DiskReserve: a few MiB the store holds on its own file system so that a full disk cannot hide stored messages.

A message is acknowledged once it is in the commit log, whose files are allocated whole; its consume-queue unit
and index entry are written just after, by the dispatcher, into space taken as they fill. If another process takes
the last free byte in between, those writes fail, and messages already acknowledged stay invisible to readers until
space returns. The reserve is a preallocated file (``STORE/reserve``): when dispatch meets ENOSPC the store deletes
it, and the dispatcher retries at once in the room it leaves. It is made again once the disk has room.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

RESERVE_FILE = "reserve"


class DiskReserve:
    def __init__(self, store_path: str, size: int) -> None:
        """``size`` 0: no reserve."""
        self.path = os.path.join(store_path, RESERVE_FILE)
        self.size = size

    @property
    def held(self) -> bool:
        return os.path.exists(self.path)

    def make(self) -> bool:
        """Take the reserve (again); False when the disk has no room for it (tried again later)."""
        if self.size == 0 or self.held:
            return True
        tmp = self.path + ".tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.posix_fallocate(fd, 0, self.size)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)  # whole or absent: a half-allocated reserve would promise room it lacks
        except OSError as e:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            log.warning("disk reserve %s (%d bytes) not taken: %s; tried again once the disk has room", self.path,
                        self.size, e)
            return False
        return True

    def release(self) -> bool:
        """Give the reserve's space back to the file system; False if it was not held."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return False
        log.warning("disk full: released the %d-byte disk reserve so that messages already stored become readable",
                    self.size)
        return True
