"""A small file system that really fills: a tmpfs mounted for one test (the tests run as root), and a filler that
takes whatever room is left, as another process on the same disk would."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

CHUNK = 64 * 1024  # the filler writes this much at a time once a single reservation no longer fits


@contextlib.contextmanager
def tmpfs(path: Path, size_mib: int) -> Iterator[Path]:
    """Mount a ``size_mib`` MiB tmpfs at ``path`` for the block; unmounted (lazily, should a file stay open) after."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path: Path, leave: int = 0, name: str = "filler") -> Path:
    """Write a file in ``path`` until the file system has at most ``leave`` bytes free (0: until ENOSPC)."""
    filler = path / name
    with open(filler, "ab", buffering=0) as f:
        room = free_bytes(path) - leave
        if room > CHUNK:
            os.posix_fallocate(f.fileno(), os.fstat(f.fileno()).st_size, room - CHUNK)
        try:
            while free_bytes(path) > leave:
                f.write(b"\0" * min(CHUNK, max(4096, free_bytes(path) - leave)))
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
    return filler
