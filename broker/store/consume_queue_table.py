"""ConsumeQueueTable: every consume queue of the store, by (topic, queue id), created on first use.

Readers look queues up without a lock: the table's dict is replaced, never changed in place, when a queue is added
or removed, so a lookup sees the old or the new dict whole.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from broker.store.consume_queue import ConsumeQueue
from broker.store.directory import fsync_directory


class ConsumeQueueTable:
    """Every consume queue, by (topic, queue id); created on first use."""

    def __init__(
        self,
        root: str,
        file_size: int,
        sync: Callable[[int], None],
        sync_dir: Callable[[str], None] = fsync_directory,
        allocate: Callable[[int, int, int], None] = os.posix_fallocate,
    ) -> None:
        self.root = root
        self.file_size = file_size
        self._sync = sync
        self._sync_dir = sync_dir
        self._allocate = allocate  # reserves consume-queue blocks as units are written
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self.lock = threading.Lock()

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            with self.lock:
                cq = self.queues.get((topic, queue_id))
                if cq is None:
                    cq = ConsumeQueue(
                        self.root, topic, queue_id, self.file_size, self._sync, self._sync_dir, self._allocate
                    )
                    self.queues = {**self.queues, (topic, queue_id): cq}
        return cq

    def remove_topic(self, topic: str) -> list[ConsumeQueue]:
        return self.remove(lambda key: key[0] == topic)

    def remove(self, which: Callable[[tuple[str, int]], bool]) -> list[ConsumeQueue]:
        """Take the queues whose (topic, queue id) ``which`` accepts out of the table; the caller destroys them."""
        with self.lock:
            gone = {k: cq for k, cq in self.queues.items() if which(k)}  # asked once per key: it may read files
            self.queues = {k: cq for k, cq in self.queues.items() if k not in gone}
        return list(gone.values())
