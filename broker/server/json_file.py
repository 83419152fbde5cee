"""Config files under ``config/``: written atomically (temp file, fsync, rename, directory fsync), the previous
version kept as ``.bak`` and read back when the main file is missing or unreadable, as RocketMQ's ConfigManager.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Any) -> None:
    """Replace ``path`` with ``data`` so a crash leaves either the old or the new file, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=2, sort_keys=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    if path.exists():
        # Keep the previous version: a hard link is atomic and costs no copy.
        bak = path.with_name(path.name + ".bak")
        bak.unlink(missing_ok=True)
        try:
            os.link(path, bak)
        except OSError:  # a file system without hard links: copy instead
            shutil.copyfile(path, bak)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def read_json(path: Path) -> Any | None:
    """The file's content, else its ``.bak``'s, else None when neither exists or parses."""
    for candidate in (path, path.with_name(path.name + ".bak")):
        try:
            return json.loads(candidate.read_text())
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            log.error("config file %s is unreadable (%s); trying its backup", candidate, e)
    return None
