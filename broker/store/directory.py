"""Directories made durable: a new file or directory exists after a power loss only once its parent is fsynced.

fdatasync of a file writes its data and the metadata needed to read that data back, but not the directory entry
that names the file (POSIX says nothing about it; ext4 in data=ordered mode happens to commit the entry with the
file's first sync, other file systems and mount options do not). A SYNC_FLUSH send into a freshly rolled commit-log
file would then be acknowledged although, after a power loss, the file holding it could be missing: recovery would
see a log that ends one file early. So every directory whose entries changed (a file or subdirectory created in
it) is fsynced before anything in those new files counts as flushed.

Directories are fsynced with ``fsync``, not ``fdatasync``: a directory's entries are its data, but whether
``fdatasync`` writes them is up to the file system.
"""

from __future__ import annotations

import errno
import logging
import os

log = logging.getLogger(__name__)


def fsync_directory(path: str) -> None:
    """fsync the directory ``path`` so that the entries created in it survive a power loss. Raises OSError.

    A file system that cannot fsync a directory at all (EINVAL or ENOTSUP: some FUSE and network mounts) makes
    its entries durable some other way or not at all; that is logged once and not an error, as PostgreSQL does,
    so such a mount does not turn the store read-only at its first new file."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in _UNSUPPORTED:
            raise
        if path not in _warned:
            _warned.add(path)
            log.warning(
                "directory fsync is not supported for %s (%s); new files there rely on the file system", path, e
            )
    finally:
        os.close(fd)


_UNSUPPORTED = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP})
_warned: set[str] = set()


def make_dirs(path: str) -> list[str]:
    """``os.makedirs(path, exist_ok=True)``; return the directories whose entries it changed, outermost first:
    the parent of each directory it created. Those must be fsynced (``fsync_directory``) before files inside the
    new directories are counted as durable."""
    missing: list[str] = []
    p = os.path.abspath(path)
    while not os.path.isdir(p):
        missing.append(p)
        parent = os.path.dirname(p)
        assert parent != p, f"no existing ancestor of {path}"  # the root always exists
        p = parent
    os.makedirs(path, exist_ok=True)
    return [os.path.dirname(d) for d in reversed(missing)]
