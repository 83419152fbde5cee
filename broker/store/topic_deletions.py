"""TopicDeletions: the commit-log offset at which each topic was last deleted, kept on disk.

Deleting a topic destroys its consume queues; its commit-log entries stay until they expire. Entries below a
topic's deletion point belong to a deleted generation: no client reads them by id, offset or key, and recovery's
re-dispatch skips them instead of bringing the topic back (RocketMQ does bring it back). The table is the same dict
the dispatcher reads (``Dispatcher.deleted_before``): loaded at start, grown by deletions, settled after recovery.
"""

from __future__ import annotations

import logging
import os
import threading

from broker import json_file  # the module, not its names: json_file imports broker.store.directory (a cycle)
from broker.errors import MessageIllegalError
from broker.format.message import validate_topic
from broker.store.commit_log import CommitLog
from broker.store.consume_queue_table import ConsumeQueueTable
from broker.store.dispatcher import Dispatcher
from broker.store.store_config import StoreConfig
from broker.store.txn_visibility import TxnVisibility

log = logging.getLogger(__name__)

DELETED_TOPICS_FILE = "deletedTopics.json"  # in config/: {"deletedTopics": {topic: commit-log offset}}


def parse_deleted_topics(data: dict[str, object]) -> dict[str, int]:
    table = data["deletedTopics"]
    if not isinstance(table, dict):
        raise TypeError(f"deletedTopics is a {type(table).__name__}, not a table")
    out = {str(topic): int(offset) for topic, offset in table.items()}
    for topic, offset in out.items():
        try:
            validate_topic(topic)  # it becomes a path when the topic is used again
        except MessageIllegalError as e:
            raise ValueError(e.message) from None
        if offset < 0:
            raise ValueError(f"deletion offset {offset} of topic {topic!r} is negative")
    return out


class TopicDeletions:
    def __init__(self, config: StoreConfig, commit_log: CommitLog, queues: ConsumeQueueTable, dispatcher: Dispatcher,
                 txn_visibility: TxnVisibility) -> None:
        self.config = config
        self.commit_log = commit_log
        self.queues = queues
        self.dispatcher = dispatcher
        self.txn_visibility = txn_visibility
        # topic -> commit-log offset where it was last deleted: entries below belong to a deleted generation. On
        # disk (DELETED_TOPICS_FILE), so recovery's re-dispatch skips them instead of bringing the topic back.
        self.table: dict[str, int] = {}
        self.dispatcher.deleted_before = self.table  # the same dict: loaded at start, grown by deletions
        self._lock = threading.Lock()  # one writer of the file at a time

    def deleted_generation(self, topic: str, commitlog_offset: int) -> bool:
        """Whether the entry of ``topic`` at ``commitlog_offset`` was stored before the topic was last deleted."""
        return commitlog_offset < self.table.get(topic, -1)

    def delete(self, topic: str) -> None:
        """Delete the topic's consume queues and forget its queue offsets; commit-log entries expire as usual.

        A topic created again starts at queue offset 0. The deletion point is on disk before this returns, so a
        restart after a crash, whose recovery re-dispatches the end of the log, does not bring the deleted
        entries back (RocketMQ does). MessageIllegalError if ``topic`` is not a name (it becomes a path:
        "../config" must not reach rmdir); OSError if the deletion point cannot be written.
        """
        validate_topic(topic)
        with self.commit_log.append_lock:  # no new entries while the topic goes
            # None of its entries left to recreate a queue later. Notifying: other topics' held pulls wait for
            # what this pass dispatches for them.
            self.dispatcher.dispatch_available()
            deleted_at = self.commit_log.max_offset
            # On disk in this order: the log up to the deletion point (a point past what a power loss keeps would
            # hide the next generation's first messages), the point itself, and only then are the queues
            # destroyed (a crash before that leaves whole queues, which start() drops by the point).
            self.commit_log.files.flush()
            with self.dispatcher.lock:
                before = self.table.get(topic)
                self.table[topic] = deleted_at
            try:
                self.save()
            except OSError:  # not deleted after all: the table must not say otherwise
                with self.dispatcher.lock:
                    if before is None:
                        del self.table[topic]
                    else:
                        self.table[topic] = before
                raise
            with self.dispatcher.lock:
                for cq in self.queues.remove_topic(topic):
                    cq.destroy()
                self.txn_visibility.forget_topic(topic)
                table = self.commit_log.queue_table  # changed in place: appenders hold no other reference to it
                for key in [k for k in table if k[0] == topic]:
                    del table[key]
                try:  # under the dispatcher's lock: the next generation's first dispatch may be making this folder
                    os.rmdir(os.path.join(self.config.consume_queue_dir, topic))
                except OSError:
                    pass  # not empty or not there: nothing of the deleted generation is left in it either way
            # at once: a start from the previous file would put the deleted generation's holds and rolled-back
            # ranges on the next generation's queues
            self.txn_visibility.save(self.commit_log.min_offset, force=True)

    def _path(self) -> str:
        return os.path.join(self.config.config_dir, DELETED_TOPICS_FILE)

    def load(self) -> None:
        loaded = json_file.load_json(self._path(), parse_deleted_topics) or {}
        self.table.clear()
        self.table.update(loaded)

    def save(self) -> None:
        with self._lock:
            json_file.write_json_atomic(self._path(), {"deletedTopics": dict(self.table)})

    def settle(self) -> None:
        """After recovery: finish deletions a crash interrupted, and keep the table of deletion points true.

        - A queue of a deleted topic whose first unit lies below the deletion point is of the deleted generation
          (a crash came between saving the point and destroying the queues): destroyed now.
        - A point past the recovered end of the log (possible only if the log lost its tail, e.g. in a power
          loss) comes back to that end: later entries belong to the next generation.
        - A point the log has expired past names no entry any more: forgotten.
        """
        deleted, end, first = self.table, self.commit_log.max_offset, self.commit_log.min_offset

        def old_generation(key: tuple[str, int]) -> bool:
            cq = self.queues.queues[key]
            unit = cq.unit(cq.min_offset) if key[0] in deleted else None
            return unit is not None and unit.commitlog_offset < deleted[key[0]]

        for cq in self.queues.remove(old_generation):
            log.warning("topic %s queue %d: deleted before a crash; its queue is removed now", cq.topic, cq.queue_id)
            self.commit_log.queue_table.pop((cq.topic, cq.queue_id), None)
            cq.destroy()
        changed = {t: min(at, end) for t, at in deleted.items() if first < at}
        if changed != deleted:
            deleted.clear()
            deleted.update(changed)
            self.save()
