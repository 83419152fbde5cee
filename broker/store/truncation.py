"""Cutting a store back: a replica whose log diverged from its new master's keeps only what both agree on
(broker/ha/divergence.py), and one whose log is older than its master's first file starts again from nothing.

Crash-safe by an intent file, ``truncate.json`` in the store directory, written (atomically, synced) before
anything is cut and removed only once everything is cut and on disk. The cut itself is made by start-up, inside
recovery (``recover(..., pending=...)``), so a crash at any point is finished by the next start the same way:

* ``{"truncateTo": X}``: the commit log ends at X (later files deleted, the rest of X's file zeroed); recovery then
  drops consume-queue units pointing at or past X (as after any shortened log), rebuilds the index files holding
  entries at or past X, and re-dispatches; the checkpoint's offsets are brought down to X so that a later crash
  re-checks and re-dispatches what is written after X.
* ``{"resetTo": M}``: every commit-log file, consume queue, index file and deletion point is discarded; the log is
  empty and continues at M (a file boundary: the master's first byte) with the next replicated bytes.

RocketMQ's slave truncation was not crash-safe (apache/rocketmq 10666): a crash during it left a log whose queues
and index disagreed with it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from broker import json_file  # the module: json_file imports broker.store.directory (a cycle)
from broker.store.directory import fsync_directory

log = logging.getLogger(__name__)

INTENT_FILE = "truncate.json"


@dataclass(frozen=True)
class Truncation:
    offset: int  # where the log ends (truncate), or where it continues (reset)
    reset: bool


def _parse(raw: dict[str, Any]) -> Truncation:
    reset = "resetTo" in raw
    t = Truncation(int(raw["resetTo" if reset else "truncateTo"]), reset)
    if t.offset < 0:
        raise ValueError(f"offset {t.offset} is negative")
    return t


def intent_path(store_path: str) -> str:
    return os.path.join(store_path, INTENT_FILE)


def request(store_path: str, truncation: Truncation) -> None:
    """Record the intent (on disk before this returns); the next start of the store carries it out."""
    key = "resetTo" if truncation.reset else "truncateTo"
    json_file.write_json_atomic(intent_path(store_path), {key: truncation.offset})
    log.warning("store %s: %s at commit-log offset %d at its next start", store_path,
                "reset to start again" if truncation.reset else "truncate", truncation.offset)


def pending(store_path: str) -> Truncation | None:
    return json_file.load_json(intent_path(store_path), _parse)


def done(store_path: str) -> None:
    """The intent is carried out and on disk: forget it (and its backup)."""
    path = intent_path(store_path)
    for p in (path, f"{path}.bak"):
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
    fsync_directory(store_path)
