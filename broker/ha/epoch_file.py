"""The epoch file: which master epoch wrote which part of this replica's commit log (Kafka's leader-epoch
checkpoint, RocketMQ 5's EpochFileCache).

``ha/epochs.json`` in the store directory holds ``{"epochs": [[epoch, start_offset], ...]}``, oldest first: from
``start_offset`` on (up to the next entry's start) the log was written under ``epoch``. Epochs and start offsets
both strictly grow. It is replaced atomically (json_file.write_json_atomic), so a crash leaves the old list or the
new one.

* A master appends ``(its epoch, its log end)`` when it takes office, before it writes anything.
* A slave appends ``(epoch, offset)`` when the first bytes of a newer epoch reach it (every chunk names the epoch
  its bytes were written under).
* Truncating the log to ``offset`` drops the entries that start at or past it (``truncate_from``); start-up drops
  those that start past the recovered end (``clamp_to``).

``end_offset_for(epoch)`` answers Kafka's OffsetsForLeaderEpoch: the end of the newest epoch not newer than
``epoch`` on this replica, which is where a replica returning from that epoch stops agreeing with this one
(KIP-101, RIP-44); broker/ha/divergence.py uses it.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from broker.json_file import load_json, write_json_atomic

log = logging.getLogger(__name__)

EPOCH_FILE = "epochs.json"
# One entry per master epoch a replica saw data from: elections are rare (each costs seconds), so even a decade of
# daily failovers is a few thousand entries. Beyond this the oldest entries go (they name data long expired).
MAX_EPOCH_ENTRIES = 10_000


@dataclass(frozen=True)
class EpochEntry:
    epoch: int
    start_offset: int


def _parse(raw: dict[str, Any]) -> list[EpochEntry]:
    entries = [EpochEntry(int(e), int(s)) for e, s in raw["epochs"]]
    for prev, nxt in itertools.pairwise(entries):
        if not (nxt.epoch > prev.epoch and nxt.start_offset >= prev.start_offset):
            raise ValueError(f"epoch entries are not in order: {prev} then {nxt}")
    if any(e.epoch < 0 or e.start_offset < 0 for e in entries):
        raise ValueError("an epoch or start offset is negative")
    return entries


class EpochFile:
    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, EPOCH_FILE)
        self._lock = threading.Lock()
        self._entries: list[EpochEntry] = load_json(self.path, _parse) or []

    @property
    def entries(self) -> list[EpochEntry]:
        with self._lock:
            return list(self._entries)

    @property
    def last_epoch(self) -> int:
        """The newest epoch this log holds data (or a master's start) of; 0 when none."""
        with self._lock:
            return self._entries[-1].epoch if self._entries else 0

    def epoch_at(self, offset: int) -> int:
        """The epoch that wrote the byte at ``offset`` (0 when the file says nothing about it)."""
        with self._lock:
            found = 0
            for e in self._entries:
                if e.start_offset <= offset:
                    found = e.epoch
                else:
                    break
            return found

    def next_start_after(self, offset: int) -> int | None:
        """The start offset of the first entry that begins after ``offset`` (a chunk must not cross it)."""
        with self._lock:
            for e in self._entries:
                if e.start_offset > offset:
                    return e.start_offset
            return None

    def append(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` writes from ``start_offset`` on; a repeat of the last epoch is a no-op.
        ValueError for an epoch older than the last (a stale master's bytes must have been refused before)."""
        with self._lock:
            if self._entries and epoch == self._entries[-1].epoch:
                return
            if self._entries and (epoch < self._entries[-1].epoch or start_offset < self._entries[-1].start_offset):
                raise ValueError(f"epoch {epoch} at {start_offset} does not follow {self._entries[-1]}")
            entries = [*self._entries, EpochEntry(epoch, start_offset)][-MAX_EPOCH_ENTRIES:]
            self._save(entries)
            log.info("epoch %d starts at commit-log offset %d", epoch, start_offset)

    def truncate_from(self, offset: int) -> None:
        """Forget the entries starting at or past ``offset`` (the log is cut there)."""
        self._keep(lambda e: e.start_offset < offset)

    def clamp_to(self, end: int) -> None:
        """Forget entries starting past the log's end (start-up, after recovery found where the log ends)."""
        self._keep(lambda e: e.start_offset <= end)

    def reset(self) -> None:
        """Forget everything (the log was discarded to restart from the master's first file)."""
        self._keep(lambda e: False)

    def _keep(self, keep: Any) -> None:
        with self._lock:
            kept = [e for e in self._entries if keep(e)]
            if kept != self._entries:
                self._save(kept)

    def _save(self, entries: list[EpochEntry]) -> None:
        write_json_atomic(self.path, {"epochs": [[e.epoch, e.start_offset] for e in entries]})
        self._entries = entries

    def end_offset_for(self, epoch: int, log_end: int) -> tuple[int, int]:
        """(the newest epoch <= ``epoch`` this log has, where it ends here); (-1, -1) when it has none.

        An epoch ends where the next one starts, or at the log's end when it is the newest (Kafka's
        OffsetsForLeaderEpoch answer)."""
        with self._lock:
            entries = self._entries
            for i in range(len(entries) - 1, -1, -1):
                if entries[i].epoch <= epoch:
                    end = entries[i + 1].start_offset if i + 1 < len(entries) else log_end
                    return entries[i].epoch, min(end, log_end)
            return -1, -1
