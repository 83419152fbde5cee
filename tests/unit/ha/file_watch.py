"""Act the moment a file appears in a directory (Linux inotify, through ctypes).

A fault test that must kill a broker *while* it does something short (a replica's truncation keeps its intent file
for about 40 ms on this machine) cannot poll for it: a 50 ms poll misses the window, and a kill sent after a poll
saw the file may land after the work ended. inotify tells of the file's arrival at once, and the test then looks
whether the file outlived the kill, which says whether the work was cut short.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import struct
import time
from collections.abc import Callable

IN_CREATE = 0x100
IN_MOVED_TO = 0x80  # an atomic write (temp file, then rename) arrives this way
IN_NONBLOCK = 0o4000
EVENT_HEAD = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; the name follows
READ_BYTES = 64 * 1024

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class FileWatch:
    """Watches ``directory`` for ``name`` from construction on (so a process started afterwards cannot create it
    unseen) until closed."""

    def __init__(self, directory: str | os.PathLike[str], name: str) -> None:
        self.path = os.path.join(directory, name)
        self._name = os.fsencode(name)
        self._fd = _libc.inotify_init1(IN_NONBLOCK)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if _libc.inotify_add_watch(self._fd, os.fsencode(directory), IN_CREATE | IN_MOVED_TO) < 0:
            err = ctypes.get_errno()
            os.close(self._fd)
            raise OSError(err, f"inotify_add_watch {directory}")

    def __enter__(self) -> FileWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)

    def act_when_created(self, action: Callable[[], None], timeout_s: float) -> bool:
        """Run ``action`` as soon as the file is created or renamed into place (AssertionError when it is not within
        ``timeout_s``); whether the file is still there once ``action`` has returned."""
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            if not select.select([self._fd], [], [], remaining)[0]:
                continue
            data = os.read(self._fd, READ_BYTES)
            pos = 0
            while pos < len(data):
                _, _, _, length = EVENT_HEAD.unpack_from(data, pos)
                start = pos + EVENT_HEAD.size
                if data[start : start + length].rstrip(b"\0") == self._name:
                    action()
                    return os.path.exists(self.path)
                pos = start + length
        raise AssertionError(f"{self.path} did not appear within {timeout_s} s")
