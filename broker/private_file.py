"""Files that hold secrets: readable by their owner only, from their first byte, and refused when they are not.

Which files: the broker's users (``config/users.json``, json_file.py with mode 0600), the receipt-handle secret of
the pop and timer services (``write_private``), a config file holding ``auth_root_secret_key``, and the replication
group's ``ha_secret_file``. The broker writes the first two itself; the last two are the operator's, and a broker
refuses to start with one that group or others can read (``refuse_if_shared``), as ssh refuses such a private key:
a secret other users of the machine can read is no secret, and a broker that started would hide that.

A file is created with mode 0600 by ``os.open`` (the process's umask can only narrow it) and its mode set again with
``fchmod`` before any byte is written, so that a temp file a crash left behind with another mode holds no new secret
with that mode. Then fsync, rename over the old file, fsync of the directory: after a crash, the old file or the
new one.
"""

from __future__ import annotations

import os
import stat

from broker.errors import InvalidArgumentError
from broker.store.directory import fsync_directory

PRIVATE_MODE = 0o600
SHARED_BITS = 0o077  # any permission for group or others


def refuse_if_shared(path: str | os.PathLike[str], what: str, info: os.stat_result) -> None:
    """InvalidArgumentError naming the file and its mode when ``info`` (the file's status, from the descriptor it is
    read through) lets group or others read or change it. ``what``: the file and the secret it holds, for the
    message ("config file", "holds auth_root_secret_key")."""
    if stat.S_ISREG(info.st_mode) and info.st_mode & SHARED_BITS:
        mode = stat.S_IMODE(info.st_mode)
        raise InvalidArgumentError(
            f"{what} {os.fspath(path)} holds a secret but its permissions {mode:04o} are open to other users; "
            f"refusing to use it. A secret others can read is no secret (ssh refuses such key files too): "
            f"chmod 600 {os.fspath(path)}"
        )


def check_private(path: str | os.PathLike[str], what: str) -> None:
    """``refuse_if_shared`` for the file at ``path``; nothing when there is none."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return
    refuse_if_shared(path, what, info)


def write_private(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data``, mode 0600 from the first byte (module docstring)."""
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_MODE)
    try:
        os.fchmod(fd, PRIVATE_MODE)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(directory)
