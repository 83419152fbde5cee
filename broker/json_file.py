"""The broker's JSON config files (``config/topics.json``, ``consumerOffset.json``, ``subscriptionGroup.json``,
``delayOffset.json``, the transaction checker's state): one JSON object each, replaced atomically.

Writing: a temp file, fsynced, renamed over the old one, then the directory fsynced, so a crash or power loss
leaves the old file or the new one, never a torn mix. The previous version is kept as ``NAME.bak`` (a hard link,
no copy), as RocketMQ's ConfigManager keeps one; not for a file of secrets (``backup=False``, the users file:
broker/auth/accounts.py says why).

Reading, as RocketMQ's ConfigManager: the file, else (missing or unreadable) its ``.bak``, else nothing. One
difference: where RocketMQ starts empty when the file is unreadable and no backup exists, Sluice refuses with a
CorruptionError naming the file. Starting empty would forget every consumer offset, and a group that then starts
from the last offset skips what it had not consumed yet.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from typing import Any, TypeVar

from broker.errors import CorruptionError, InvalidArgumentError
from broker.store.directory import fsync_directory

log = logging.getLogger(__name__)

T = TypeVar("T")

# A config file is read whole into memory: refuse anything absurd. Generous: consumer offsets of thousands of
# groups over hundreds of topics run to tens of MiB, and RocketMQ sets no limit at all.
MAX_CONFIG_BYTES = 1 << 30


def write_json_atomic(path: str | os.PathLike[str], data: dict[str, Any], mode: int = 0o644,
                      backup: bool = True) -> None:
    """Replace ``path`` with ``data``: after a crash, the old file or the new one, never a torn one. ``mode``: the
    file's permissions from its first byte on (0o600 for files that hold secrets). ``backup`` False: no ``.bak`` is
    kept, and one left by an earlier write is removed (a file of secrets: its backup would keep a rotated one)."""
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    raw = json.dumps(data, indent=2, sort_keys=True).encode("utf-8")
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # a temp file left by a crash keeps the mode it was created with
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except OSError:
        os.unlink(tmp)  # a half-written copy (ENOSPC) would keep the space a full disk needs back
        raise
    finally:
        os.close(fd)
    bak = f"{path}.bak"
    if backup and os.path.exists(path):
        if os.path.exists(bak):
            os.unlink(bak)
        try:
            os.link(path, bak)
        except OSError:  # a file system without hard links: copy instead
            shutil.copyfile(path, bak)
    os.replace(tmp, path)
    if not backup:
        try:
            os.unlink(bak)
        except FileNotFoundError:
            pass
    fsync_directory(directory)


def read_json(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The file's object, else its ``.bak``'s (logged), else None when neither exists. CorruptionError naming the
    file when it is unreadable and the backup cannot stand in for it."""
    return load_json(path, dict)


def load_json(path: str | os.PathLike[str], parse: Callable[[dict[str, Any]], T]) -> T | None:
    """``parse`` applied to the file's object, else to its ``.bak``'s (logged), else None when neither exists.

    A file that is not a JSON object, or whose content ``parse`` refuses (KeyError, ValueError, TypeError,
    AttributeError or InvalidArgumentError: a missing field, a number that is not one, a list where a table
    belongs, a setting out of range), counts as unreadable, and the backup is tried. CorruptionError naming the
    file when the backup cannot stand in for it."""
    path = os.fspath(path)
    first: _BadFile | None = None
    for candidate in (path, f"{path}.bak"):
        try:
            data = _read_object(candidate)
            if data is None:
                continue
            try:
                parsed = parse(data)
            except (KeyError, ValueError, TypeError, AttributeError, InvalidArgumentError) as e:
                raise _BadFile(f"does not hold what it should ({type(e).__name__}: {e})", candidate, 0) from None
        except _BadFile as e:
            log.error("config file %s at byte %d: %s", candidate, e.offset, e.reason)
            first = first or e
            continue
        if candidate != path:
            log.error("config file %s is missing or unreadable: using its backup %s", path, candidate)
        return parsed
    if first is not None:
        raise CorruptionError(
            f"config file {first.reason}, and no readable copy of {os.path.basename(path)} or its .bak is left; "
            f"restore one from a backup, or delete both {os.path.basename(path)} and {os.path.basename(path)}.bak "
            "to start with an empty table (for consumer offsets: every group then starts afresh)",
            first.path,
            first.offset,
        )
    return None


class _BadFile(Exception):
    """Why one config file cannot be read: ``reason``, at byte ``offset`` of ``path``."""

    def __init__(self, reason: str, path: str, offset: int) -> None:
        super().__init__(reason)
        self.reason, self.path, self.offset = reason, path, offset


def _read_object(path: str) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it does not exist or is empty (as RocketMQ treats both)."""
    try:
        size = os.path.getsize(path)
        if size > MAX_CONFIG_BYTES:
            raise _BadFile(f"is {size} bytes, over {MAX_CONFIG_BYTES}", path, 0)
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _BadFile(f"cannot be read ({e})", path, 0) from None
    if not raw.strip():
        return None
    try:
        data = json.loads(raw)
    except ValueError as e:  # UnicodeDecodeError included
        raise _BadFile(f"is not valid JSON ({e})", path, getattr(e, "pos", 0) or 0) from None
    if not isinstance(data, dict):
        raise _BadFile(f"holds a JSON {type(data).__name__}, not an object", path, 0)
    return data
