"""Committed consumer offsets per (group, topic, queue), persisted in ``config/consumerOffset.json``.

The file uses RocketMQ's layout: ``{"offsetTable": {"topic@group": {"queueId": offset}}}``. It is written every
``consumer_offset_persist_interval_ms`` (5 s) and at shutdown, atomically with the previous version kept as
``.bak``. An update of many queues is validated as a whole first, then applied under one lock: all or nothing.

The table holds at most MAX_OFFSETS (group, topic, queue) offsets: each group that commits adds one per queue it
reads, and the whole table is written every few seconds, so commits under made-up group names could otherwise
grow the file and the cost of every write without end. Past it, a commit that would add an offset is refused
(LimitExceededError); offsets already held are updated as ever.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from broker.errors import InvalidArgumentError, LimitExceededError
from broker.format.message import MAX_TOPIC_BYTES, TOPIC_PATTERN
from broker.format.system_topics import MAX_GROUP_CHARS, RETRY_GROUP_TOPIC_PREFIX
from broker.json_file import load_json, write_json_atomic

log = logging.getLogger(__name__)

TOPIC_GROUP_SEPARATOR = "@"  # RocketMQ's ConsumerOffsetManager key: topic@group

QueueKey = tuple[str, int]  # (topic, queue id)
# About 60 bytes each in the file: a table at the bound is some 60 MB, written every persist interval.
MAX_OFFSETS = 1_000_000


def validate_group(group: str) -> None:
    """Groups follow the topic naming rule, and leave room for the %RETRY% prefix. Called before a request does
    anything, so a refused one records nothing (no group, no retry topic)."""
    if not group:
        raise InvalidArgumentError("consumer group is empty; pass a group name (letters, digits, '_', '-')")
    if not TOPIC_PATTERN.fullmatch(group):
        raise InvalidArgumentError(f"group {group[:60]!r} must match ^[%|a-zA-Z0-9_-]+$; rename it")
    if len(group) > MAX_GROUP_CHARS:
        raise InvalidArgumentError(
            f"group {group[:60]!r}... is {len(group)} characters; a group name is at most {MAX_GROUP_CHARS} characters "
            f"(its retry topic {RETRY_GROUP_TOPIC_PREFIX}<group> must fit the {MAX_TOPIC_BYTES}-character topic "
            "limit); use a shorter name"
        )


class ConsumerOffsetManager:
    def __init__(self, config_dir: Path) -> None:
        self.path = config_dir / "consumerOffset.json"
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()  # one writer of the file at a time (they share its temp name)
        self._table: dict[tuple[str, str], dict[int, int]] = {}  # (group, topic) -> queue id -> offset
        self._count = 0  # offsets in the table
        self.max_offsets = MAX_OFFSETS
        self._dirty = False

    def load(self) -> None:
        table = load_json(self.path, self._parse)
        if table is None:
            return
        with self._lock:
            self._table = table
            self._count = sum(len(q) for q in table.values())
        log.info("loaded offsets of %d (group, topic) pairs from %s", len(table), self.path)

    def _parse(self, raw: dict[str, Any]) -> dict[tuple[str, str], dict[int, int]]:
        """``{"offsetTable": {"topic@group": {"queueId": offset}}}``; ValueError etc. when it is not that."""
        table: dict[tuple[str, str], dict[int, int]] = {}
        for key, queues in raw.get("offsetTable", {}).items():
            topic, sep, group = key.partition(TOPIC_GROUP_SEPARATOR)
            if not sep:
                log.error("skipping malformed key %r in %s (expected topic@group)", key, self.path)
                continue
            table[(group, topic)] = {int(qid): int(off) for qid, off in queues.items()}
        return table

    def replace(self, data: dict[str, Any]) -> None:
        """A slave: the master's file replaces this one and is loaded, under the writers' lock (a persist of the
        older table cannot land after it)."""
        with self._write_lock:
            write_json_atomic(self.path, data)
            self.load()

    def persist(self) -> None:
        with self._write_lock:  # snapshot and write under one lock: an older snapshot never overwrites a newer
            with self._lock:
                data = {
                    "offsetTable": {
                        f"{topic}{TOPIC_GROUP_SEPARATOR}{group}": {str(q): off for q, off in sorted(queues.items())}
                        for (group, topic), queues in sorted(self._table.items())
                    }
                }
                self._dirty = False
            try:
                write_json_atomic(self.path, data)
            except OSError:
                self._dirty = True  # not on disk: the next persist pass tries again
                raise

    def persist_if_dirty(self) -> None:
        if self._dirty:
            self.persist()

    def commit(
        self,
        group: str,
        offsets: Mapping[QueueKey, int],
        check: Callable[[str, int, int], None] | None = None,
    ) -> int:
        """Store every offset or none. ``check(topic, queue_id, offset)`` raises for an invalid one; it runs under
        the table's lock, so that an offset checked against a topic that remove_topic then drops is not stored
        after the removal."""
        validate_group(group)
        for (topic, queue_id), offset in offsets.items():
            if offset < 0:
                raise InvalidArgumentError(
                    f"offset {offset} for {topic}/{queue_id} is negative; commit the next offset to consume (>= 0)"
                )
        with self._lock:
            if check is not None:
                for (topic, queue_id), offset in offsets.items():
                    check(topic, queue_id, offset)
            new = sum(1 for topic, queue_id in offsets if queue_id not in self._table.get((group, topic), {}))
            if new and self._count + new > self.max_offsets:
                raise LimitExceededError(
                    f"the broker holds {self._count} committed offsets, its limit of {self.max_offsets}; group "
                    f"{group!r} cannot add {new} more (delete unused topics, whose offsets go with them)"
                )
            for (topic, queue_id), offset in offsets.items():
                self._table.setdefault((group, topic), {})[queue_id] = offset
            self._count += new
            self._dirty = True
        return len(offsets)

    def query(self, group: str, topic: str) -> dict[int, int]:
        with self._lock:
            return dict(self._table.get((group, topic), {}))

    def has_group(self, group: str) -> bool:
        with self._lock:
            return any(g == group for g, _ in self._table)

    def topics_of(self, group: str) -> list[str]:
        with self._lock:
            return sorted(t for g, t in self._table if g == group)

    def groups(self) -> list[tuple[str, str]]:
        """Every (group, topic) with offsets."""
        with self._lock:
            return sorted(self._table)

    def remove_topic(self, topic: str) -> None:
        with self._lock:
            for key in [k for k in self._table if k[1] == topic]:
                self._count -= len(self._table.pop(key))
            self._dirty = True
