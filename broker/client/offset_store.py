"""Where a PushConsumer keeps its progress: on the broker (clustering) or on the client (broadcasting).

Both hold the next offset to consume per queue in memory (updated after the listener succeeds) and remember what
was last committed, so only changed offsets are sent. The start offset of a queue without progress comes from
the consumer's ``consume_from`` setting.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from broker.client.connection import Connection
from broker.client.consumer_options import ConsumeFrom
from broker.errors import InvalidArgumentError, TopicNotExistError
from broker.proto import sluice_pb2 as pb
from broker.semantics.system_topics import RETRY_GROUP_TOPIC_PREFIX

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]
# Answers to a commit that will never change: the topic was deleted, or the queue is gone or the offset past its end.
REFUSED = (TopicNotExistError, InvalidArgumentError)


class OffsetStore:
    def __init__(self, conn: Connection, consume_from: ConsumeFrom, consume_timestamp_ms: int) -> None:
        self.conn = conn
        self.consume_from = consume_from
        self.consume_timestamp_ms = consume_timestamp_ms
        self._lock = threading.Lock()
        # One commit at a time, from choosing what to send to marking it sent: the control thread's periodic
        # commit and a dropped queue's final commit (sent from the queue's worker thread) must not cross on the
        # wire, or an older offset could land last and the queue's next owner would consume a message again.
        self._commit_lock = threading.RLock()
        self._offsets: dict[QueueKey, int] = {}
        self._committed: dict[QueueKey, int] = {}

    # -------------------------------------------------------------------------------- to be provided per kind
    def stored_offset(self, topic: str, queue_id: int) -> int | None:
        raise NotImplementedError

    def _persist(self, offsets: dict[QueueKey, int]) -> None:
        raise NotImplementedError

    # -------------------------------------------------------------------------------- shared
    def initial_offset(self, topic: str, queue_id: int) -> int:
        stored = self.stored_offset(topic, queue_id)
        if stored is None:
            stored = self._start_offset(topic, queue_id)
        else:
            with self._lock:
                self._committed[(topic, queue_id)] = stored
        with self._lock:
            self._offsets[(topic, queue_id)] = stored
        return stored

    def _start_offset(self, topic: str, queue_id: int) -> int:
        if self.consume_from is ConsumeFrom.TIMESTAMP:
            request = pb.SearchOffsetByTimestampRequest(
                topic=topic, queue_id=queue_id, timestamp_ms=self.consume_timestamp_ms
            )
            return self.conn.call(self.conn.stub.SearchOffsetByTimestamp, request).offset
        ranges = self.conn.call(self.conn.stub.GetQueueOffsets, pb.GetQueueOffsetsRequest(topic=topic)).queues
        # A retry queue holds only this group's failed messages, each waiting for it: as RocketMQ's consumer,
        # start those at the beginning even when consuming from the last offset, or the waiting retries are skipped.
        first = self.consume_from is ConsumeFrom.FIRST or topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        for r in ranges:
            if r.queue_id == queue_id:
                return r.min_offset if first else r.max_offset
        return 0

    def update(self, topic: str, queue_id: int, offset: int) -> None:
        with self._lock:
            self._offsets[(topic, queue_id)] = offset

    def pending_commit(self, topic: str, queue_id: int) -> int | None:
        """The queue's offset when it differs from the committed one (to piggy-back on a pull)."""
        key = (topic, queue_id)
        with self._lock:
            offset = self._offsets.get(key)
            return offset if offset is not None and offset != self._committed.get(key) else None

    def mark_committed(self, topic: str, queue_id: int, offset: int) -> None:
        with self._lock:
            self._committed[(topic, queue_id)] = offset

    def _changed(self, only: QueueKey | None = None) -> dict[QueueKey, int]:
        with self._lock:
            return {
                k: v for k, v in self._offsets.items() if (only is None or k == only) and self._committed.get(k) != v
            }

    def commit_all(self) -> None:
        with self._commit_lock:
            self._commit(self._changed())

    def commit_queue(self, topic: str, queue_id: int, *, force: bool = False) -> None:
        """Commit one queue's progress; ``force``: even if it was marked committed (a queue handed over: the
        broker must hold exactly this offset before another consumer reads it)."""
        key = (topic, queue_id)
        with self._commit_lock:
            if force:
                with self._lock:
                    offset = self._offsets.get(key)
                self._commit({} if offset is None else {key: offset})
            else:
                self._commit(self._changed(key))

    def _commit(self, changed: dict[QueueKey, int]) -> None:
        if not changed:
            return
        try:
            self._persist(changed)
        except REFUSED as e:
            if len(changed) == 1:
                self._drop_refused(changed, {next(iter(changed)): e.message})
            else:  # the broker takes a batch whole or not at all: find the queues it refuses
                self._commit_each(changed)
            return
        with self._lock:
            self._committed.update(changed)

    def _commit_each(self, changed: dict[QueueKey, int]) -> None:
        refused: dict[QueueKey, str] = {}
        for key, offset in sorted(changed.items()):
            try:
                self._persist({key: offset})
            except REFUSED as e:
                refused[key] = e.message
                continue
            with self._lock:
                self._committed[key] = offset
        self._drop_refused(changed, refused)

    def _drop_refused(self, changed: dict[QueueKey, int], refused: dict[QueueKey, str]) -> None:
        """Forget progress the broker will never take (its topic was deleted, or the queue is gone or was cut back
        below it): kept, it would be sent again with every later commit and refuse the whole batch each time."""
        with self._lock:
            for key in refused:
                if self._offsets.get(key) == changed[key]:  # a newer offset since may be good: keep that one
                    del self._offsets[key]
                self._committed.pop(key, None)
        for (topic, queue_id), reason in sorted(refused.items()):
            log.warning("dropped the progress %d of %s/%d: the broker refuses it (%s)", changed[(topic, queue_id)],
                        topic, queue_id, reason)  # fmt: skip

    def forget(self, topic: str, queue_id: int) -> None:
        with self._lock:
            self._offsets.pop((topic, queue_id), None)
            self._committed.pop((topic, queue_id), None)

    def offsets(self) -> dict[QueueKey, int]:
        with self._lock:
            return dict(self._offsets)


class RemoteOffsetStore(OffsetStore):
    """Clustering: offsets live on the broker (UpdateConsumerOffsets, all queues in one atomic call)."""

    def __init__(self, conn: Connection, group: str, consume_from: ConsumeFrom, consume_timestamp_ms: int) -> None:
        super().__init__(conn, consume_from, consume_timestamp_ms)
        self.group = group

    def stored_offset(self, topic: str, queue_id: int) -> int | None:
        request = pb.QueryConsumerOffsetRequest(consumer_group=self.group, topic=topic, queue_id=queue_id)
        found = self.conn.call(self.conn.stub.QueryConsumerOffset, request).offsets
        return found[0].offset if found else None

    def _persist(self, offsets: dict[QueueKey, int]) -> None:
        request = pb.UpdateConsumerOffsetsRequest(
            consumer_group=self.group,
            offsets=[pb.QueueOffset(topic=t, queue_id=q, offset=o) for (t, q), o in sorted(offsets.items())],
        )
        self.conn.call(self.conn.stub.UpdateConsumerOffsets, request)


class LocalOffsetStore(OffsetStore):
    """Broadcasting: every consumer has its own progress, kept in memory and in ``path`` (JSON) when given."""

    def __init__(
        self, conn: Connection, consume_from: ConsumeFrom, consume_timestamp_ms: int, path: str | Path | None
    ) -> None:
        super().__init__(conn, consume_from, consume_timestamp_ms)
        self.path = Path(path) if path else None
        self._file: dict[str, int] = {}
        if self.path and self.path.exists():
            self._file = {k: int(v) for k, v in json.loads(self.path.read_text()).get("offsetTable", {}).items()}

    @staticmethod
    def _name(topic: str, queue_id: int) -> str:
        return f"{topic}#{queue_id}"

    def stored_offset(self, topic: str, queue_id: int) -> int | None:
        return self._file.get(self._name(topic, queue_id))

    def _persist(self, offsets: dict[QueueKey, int]) -> None:
        for (t, q), o in offsets.items():
            self._file[self._name(t, q)] = o
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump({"offsetTable": self._file}, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
