"""Atomic JSON config files: write a temp file, fsync it, rename over the old one, fsync the directory.

A reader (or a restart after SIGKILL) sees either the old file or the new one, never a torn mix. The previous
version is kept as ``NAME.bak`` so a file damaged by something outside the broker can be recovered by hand.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from broker.errors import CorruptionError

log = logging.getLogger(__name__)

MAX_CONFIG_BYTES = 64 * 1024 * 1024  # a config file is read whole into memory: refuse anything absurd


def write_json_atomic(path: str, data: Any) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    raw = json.dumps(data, indent=2, sort_keys=True).encode("utf-8")
    assert len(raw) <= MAX_CONFIG_BYTES, (path, len(raw))
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    if os.path.exists(path):
        # Keep the last good version beside the new one (a hard link costs no copy).
        bak = f"{path}.bak"
        if os.path.exists(bak):
            os.unlink(bak)
        os.link(path, bak)
    os.replace(tmp, path)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_json(path: str) -> Any | None:
    """The file's content, or None when it does not exist; CorruptionError naming the file if it is not JSON."""
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return None
    if size > MAX_CONFIG_BYTES:
        raise CorruptionError(f"config file is {size} bytes, over {MAX_CONFIG_BYTES}", path, 0)
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return json.loads(raw)
    except ValueError as e:
        raise CorruptionError(
            f"not valid JSON ({e}); restore it from {os.path.basename(path)}.bak or delete it to start empty",
            path,
            getattr(e, "pos", 0),
        ) from None
