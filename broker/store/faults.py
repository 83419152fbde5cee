"""FaultInjector: the one place the store's own code lets tests make a disk operation fail.

Tests use it to prove behaviour that real disks show rarely (a failed fsync must neither advance the flushed
position nor acknowledge a SYNC_FLUSH send: apache/rocketmq issues 2706, 3129). It is not a mock: the store
runs unchanged and only the chosen system call raises.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable

from broker.store.directory import fsync_directory


class FaultInjector:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fsync_failures = 0
        self._fail_kind: str | None = None
        self._fsync_delay_s = 0.0
        self._allocate_error: tuple[int, str] | None = None
        self.fsync_calls = 0
        self.fsync_counts: dict[str, int] = {}  # per kind of file

    def fail_next_fsyncs(self, count: int = 1, kind: str | None = "commitlog") -> None:
        """Make the next ``count`` syncs of ``kind`` (None: any; "commitlog-dir" etc. for directories) raise
        OSError(EIO)."""
        with self._lock:
            self._fsync_failures = count
            self._fail_kind = kind

    def fail_allocations(self, errno_value: int | None, kind: str = "commitlog") -> None:
        """Make creating ``kind`` files fail with ``errno_value`` (e.g. ENOSPC: a full disk) until set to None."""
        with self._lock:
            self._allocate_error = None if errno_value is None else (errno_value, kind)

    def allocator(self, kind: str) -> Callable[[int, int, int], None]:
        """The posix_fallocate function for one kind of file."""

        def allocate(fd: int, offset: int, length: int) -> None:
            err = self._allocate_error
            if err is not None and err[1] == kind:
                raise OSError(err[0], f"injected fallocate failure: {os.strerror(err[0])}")
            os.posix_fallocate(fd, offset, length)

        return allocate

    def syncer(self, kind: str) -> Callable[[int], None]:
        """The fdatasync function for one kind of file: commitlog, consumequeue, index, checkpoint."""
        return lambda fd: self.fdatasync(fd, kind)

    def dir_syncer(self, kind: str) -> Callable[[str], None]:
        """The directory fsync for one kind of file's directories; counted and failed as kind ``{kind}-dir``."""
        return lambda path: self.fsync_dir(path, f"{kind}-dir")

    def delay_fsyncs(self, seconds: float) -> None:
        """Make every fdatasync take at least ``seconds`` longer (a slow disk), until set back to 0."""
        self._fsync_delay_s = seconds

    def fdatasync(self, fd: int, kind: str = "") -> None:
        self._before_sync(kind, "fdatasync")
        os.fdatasync(fd)

    def fsync_dir(self, path: str, kind: str) -> None:
        self._before_sync(kind, "directory fsync")
        fsync_directory(path)

    def _before_sync(self, kind: str, what: str) -> None:
        """Count a sync of ``kind``; delay it or raise the injected failure if one is due."""
        with self._lock:
            self.fsync_calls += 1
            self.fsync_counts[kind] = self.fsync_counts.get(kind, 0) + 1
            fail = self._fsync_failures > 0 and self._fail_kind in (None, kind)
            if fail:
                self._fsync_failures -= 1
        if self._fsync_delay_s:
            time.sleep(self._fsync_delay_s)
        if fail:
            raise OSError(errno.EIO, f"injected {what} failure")
