"""The master's config files reach its slaves (RocketMQ's SlaveSynchronize, pushed with the log instead of pulled
every 10 s): topics, subscription groups, consumer offsets, delay-queue and timer progress, the transaction
checker's state, the snapshot of the pop record (broker/semantics/pop_log.py), and the users with their access
control entries, so that a promoted slave serves the same topics
and groups from the same offsets to the same users, and does not deliver timer messages a second time.

Master: every ``ha_metadata_sync_ms`` (and at once when asked, e.g. after an offset commit) it saves what is dirty
(consumer offsets), then looks at each file (size and modification time first, bytes only when those changed);
a file whose bytes changed gets the next version. File times come from a coarse clock (a jiffy), so two commits'
files of one size written within one tick look alike: as git does with "racily clean" files, size and time are
trusted only when the file is older than the last look by RACY_NS, and the bytes are compared otherwise (an
acknowledged commit must not be missed). Each slave stream sends the files changed since what that slave
last applied. Slave: each file received is checked (a JSON object), written atomically into its config directory,
and the broker's managers reload it; the slave then reports the version it applied (so a SYNC_MASTER's offset
commit can wait until every in-sync replica holds it).

A version is a number one master process counts from zero, so it means something only within one replication
session: a slave starts each session at version 0 (``MetadataSink.new_session``) and is sent every file of that
master, and the master counts a replica's version from its session's reports only. Were a slave to carry its
version from one master to the next (the old master's count, one a commit, runs far ahead of the new one's), the
new master would send it nothing and take it for holding every commit; elected at the next failover, it would
serve the first master's offsets, lower than those the second acknowledged.

Delay and timer progress and the transaction checker's scan positions name entries of the log (deliveries made,
decisions taken), and a file reaches a slave with the first chunk of a fetch, possibly ahead of the log bytes it
names. Their writers add the commit log's end when they saved (``LOG_END_KEY``), and a slave keeps such a copy in
memory until its own log reaches that end: a promoted slave then acts on a copy its log bears out, and at worst
delivers again what the newer copy named. (Taken as it came, a copy ahead of the log would have a promoted slave
skip deliveries whose copies its log does not hold: those messages would be lost.) The version the slave reports
counts a waiting copy as applied: nothing waits for those files on the master.

The slave never writes these files itself: a slave refuses offset commits (the client keeps them until a master
answers), and the services that change delay progress and transaction state run on the master only. So nothing a
slave holds is overwritten by an older copy (RocketMQ issue 1094: a slave's sync overwrote newer offsets).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.json_file import MAX_CONFIG_BYTES, write_json_atomic

log = logging.getLogger(__name__)

SYNCED_FILES = ("topics.json", "subscriptionGroup.json", "consumerOffset.json", "delayOffset.json",
                "transactionState.json", "users.json", "timerProgress.json", "popState.json")
PRIVATE_FILES = ("users.json", "popState.json")  # they hold secrets: mode 0600 and no backup (broker/auth/accounts.py)
LOG_END_KEY = "log_end"  # in a synced file: the writer's commit-log end when it saved (see above)
# A file's time must be this much older than the moment its stat was taken for an unchanged stat to prove unchanged
# bytes: file times tick by a jiffy (up to 10 ms) on Linux file systems; a second is ample and costs only
# re-reading the files changed in the last second.
RACY_NS = 1_000_000_000
# What one metadata message may carry: every synced file at its largest would not fit a gRPC message.
MAX_METADATA_BYTES = 64 * 1024 * 1024


@dataclass
class _File:
    version: int = 0
    stat: tuple[int, int, int] = (0, -1, 0)  # (mtime ns, size, inode) when last read
    looked_ns: int = 0  # wall-clock time of that stat
    raw: bytes = b""


class MetadataSource:
    """The master's side: versions of its config files."""

    def __init__(self, config_dir: str, save_dirty: Callable[[], None] = lambda: None) -> None:
        self.config_dir = config_dir
        self.save_dirty = save_dirty
        self._lock = threading.Lock()
        self._files = {name: _File() for name in SYNCED_FILES}
        self.version = 0

    def refresh(self) -> int:
        """Save what is dirty, take in changed files; the current version."""
        try:
            self.save_dirty()
        except OSError as e:  # the next pass tries again; the slaves keep the previous copy meanwhile
            log.warning("could not save consumer offsets for the slaves: %s", e)
        with self._lock:
            for name, f in self._files.items():
                path = os.path.join(self.config_dir, name)
                looked = time.time_ns()
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    continue
                stat = (st.st_mtime_ns, st.st_size, st.st_ino)
                settled = stat[0] < f.looked_ns - RACY_NS  # no later write could carry the same time (docstring)
                if (stat == f.stat and settled) or st.st_size > MAX_CONFIG_BYTES:
                    continue
                try:
                    with open(path, "rb") as fh:
                        raw = fh.read()
                except OSError as e:
                    log.warning("could not read %s for the slaves: %s", path, e)
                    continue
                f.stat, f.looked_ns = stat, looked
                if raw != f.raw:
                    self.version += 1
                    f.raw, f.version = raw, self.version
            return self.version

    def changes_since(self, version: int) -> tuple[int, dict[str, bytes]]:
        """(current version, files changed after ``version``), within MAX_METADATA_BYTES (the rest next time)."""
        with self._lock:
            out: dict[str, bytes] = {}
            size = 0
            newest = version
            for name, f in sorted(self._files.items(), key=lambda kv: kv[1].version):
                if f.version <= version:
                    continue
                if out and size + len(f.raw) > MAX_METADATA_BYTES:
                    break
                out[name] = f.raw
                size += len(f.raw)
                newest = f.version
            return newest, out


class MetadataSink:
    """The slave's side: writes what the master sent and has the managers reload it. Used from the slave fetcher's
    thread only."""

    def __init__(self, config_dir: str, replace: Callable[[str, dict[str, Any]], bool],
                 log_end: Callable[[], int]) -> None:
        self.config_dir = config_dir
        # (file name, content) -> True when the broker's manager of that file replaced it (under its own lock, so
        # that no persist of its older table lands after); False: a file no running manager owns, written here
        self.replace = replace
        self.log_end = log_end  # this slave's commit-log end
        self.version = 0
        self.waiting: dict[str, tuple[int, dict[str, Any]]] = {}  # name -> (log end it needs, content)

    def new_session(self) -> None:
        """A session with a master begins: its versions are counted afresh (module docstring), so ask for every file.
        Copies waiting for the log stay until that master's copy replaces them."""
        self.version = 0

    def apply(self, version: int, files: dict[str, bytes]) -> None:
        for name, raw in files.items():
            if name not in SYNCED_FILES:
                log.warning("master sent config file %r, which is not synchronised; ignored", name[:80])
                continue
            try:
                data = json.loads(raw)
            except ValueError as e:
                log.error("master sent %s that is not JSON (%s); keeping this slave's copy", name, e)
                continue
            if not isinstance(data, dict):
                log.error("master sent %s holding a JSON %s; keeping this slave's copy", name, type(data).__name__)
                continue
            self.waiting.pop(name, None)  # a newer copy replaces one still waiting
            needs = data.get(LOG_END_KEY)
            if isinstance(needs, int) and needs > self.log_end():
                self.waiting[name] = (needs, data)
                continue
            self._write(name, data)
        self.version = max(self.version, version)

    def catch_up(self) -> None:
        """Write the copies that waited for this log to reach their end (after each fetch)."""
        if not self.waiting:
            return
        end = self.log_end()
        for name, (needs, data) in list(self.waiting.items()):
            if needs <= end:
                del self.waiting[name]
                self._write(name, data)

    def _write(self, name: str, data: dict[str, Any]) -> None:
        if not self.replace(name, data):
            private = name in PRIVATE_FILES
            write_json_atomic(os.path.join(self.config_dir, name), data, mode=0o600 if private else 0o644,
                              backup=not private)
