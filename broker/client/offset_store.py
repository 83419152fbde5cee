"""Where a PushConsumer keeps its progress: on the brokers (clustering) or on the client (broadcasting).

Both hold the next offset to consume per queue in memory (updated after the listener succeeds) and remember what
was last committed, so only changed offsets are sent. The start offset of a queue without progress comes from
the consumer's ``consume_from`` setting, asked of the broker that owns the queue.

Queues are ``MessageQueue(topic, broker_name, queue_id)``. In a cluster every queue's offset is committed to the
broker that owns it (one UpdateConsumerOffsets per broker, each stored all or nothing by that broker), so a broker
that is down delays only its own queues' commits. A store of one broker (``endpoint=``) keys its progress by
``(topic, queue_id)``, as it always did, and its methods also take that older form: ``update("T", 0, 36)``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from broker.client.connection import Connection
from broker.client.consumer_options import ConsumeFrom
from broker.client.route import DIRECT_BROKER, MessageQueue
from broker.client.router import Router
from broker.errors import BrokerError, InvalidArgumentError, ServiceNotAvailableError, TopicNotExistError
from broker.format.system_topics import RETRY_GROUP_TOPIC_PREFIX
from broker.proto import sluice_pb2 as pb

log = logging.getLogger(__name__)

# A queue as the store keys it: (topic, queue id) for a store of one broker, MessageQueue in a cluster.
QueueKey = MessageQueue | tuple[str, int]
# Answers to a commit that will never change: the topic was deleted, or the queue is gone or the offset past its end.
REFUSED = (TopicNotExistError, InvalidArgumentError)
Connect = Callable[[MessageQueue, bool], Connection]  # (queue, write) -> the connection to its broker


def queue_of(key: QueueKey) -> MessageQueue:
    return key if isinstance(key, MessageQueue) else MessageQueue(key[0], DIRECT_BROKER, key[1])


class OffsetStore:
    def __init__(self, target: Router | Connection, consume_from: ConsumeFrom, consume_timestamp_ms: int) -> None:
        """``target``: the consumer's Router, or (a store of one broker) a Connection to that broker."""
        if isinstance(target, Router):
            router = target
            self.cluster = router.cluster_mode
            self._connect: Connect = lambda mq, write: router.queue_connection(mq, write=write)
        else:
            conn = target
            self.cluster = False
            self._connect = lambda mq, write: conn
        self.consume_from = consume_from
        self.consume_timestamp_ms = consume_timestamp_ms
        self._lock = threading.Lock()
        # One commit at a time, from choosing what to send to marking it sent: the control thread's periodic
        # commit and a dropped queue's final commit (sent from the queue's worker thread) must not cross on the
        # wire, or an older offset could land last and the queue's next owner would consume a message again.
        self._commit_lock = threading.RLock()
        self._offsets: dict[QueueKey, int] = {}
        self._committed: dict[QueueKey, int] = {}

    # -------------------------------------------------------------------------------- queues
    def key(self, mq: MessageQueue) -> QueueKey:
        """How this store names ``mq``: the MessageQueue in a cluster, (topic, queue id) with one broker."""
        return mq if self.cluster else (mq.topic, mq.queue_id)

    def _split(self, queue: MessageQueue | str, args: tuple[int, ...]) -> tuple[QueueKey, tuple[int, ...]]:
        """``(mq, *rest)`` or, with one broker, ``(topic, queue_id, *rest)`` -> (key, rest)."""
        if isinstance(queue, MessageQueue):
            return self.key(queue), args
        if self.cluster:
            raise InvalidArgumentError("a topic and a bare queue id are ambiguous in a cluster: give a MessageQueue")
        if not args:
            raise InvalidArgumentError("name the queue: a MessageQueue, or a topic and a queue id")
        return (queue, int(args[0])), args[1:]

    def connection(self, mq: MessageQueue, *, write: bool) -> Connection:
        """The connection to ``mq``'s broker. A broker the route does not list now (it left, or the name servers
        have not heard from it lately) is a passing outage here, not a refusal: progress is kept for it."""
        try:
            return self._connect(mq, write)
        except TopicNotExistError as e:
            raise ServiceNotAvailableError(f"no route to the broker of {mq} now ({e.message})") from None

    # -------------------------------------------------------------------------------- to be provided per kind
    def _stored(self, key: QueueKey) -> int | None:
        raise NotImplementedError

    def _persist(self, offsets: dict[QueueKey, int]) -> None:
        raise NotImplementedError

    def _parts(self, changed: dict[QueueKey, int]) -> list[dict[QueueKey, int]]:
        """The groups of offsets stored all or nothing (one per broker for the brokers' store)."""
        return [changed]

    # -------------------------------------------------------------------------------- shared
    def stored_offset(self, queue: MessageQueue | str, *args: int) -> int | None:
        """The committed offset as stored (on the broker, or in the local file); None when there is none."""
        key, _ = self._split(queue, args)
        return self._stored(key)

    def initial_offset(self, queue: MessageQueue | str, *args: int) -> int:
        key, _ = self._split(queue, args)
        stored = self._stored(key)
        if stored is None:
            stored = self._start_offset(queue_of(key))
        else:
            with self._lock:
                self._committed[key] = stored
        with self._lock:
            self._offsets[key] = stored
        return stored

    def _start_offset(self, mq: MessageQueue) -> int:
        conn = self.connection(mq, write=False)
        if self.consume_from is ConsumeFrom.TIMESTAMP:
            request = pb.SearchOffsetByTimestampRequest(
                topic=mq.topic, queue_id=mq.queue_id, timestamp_ms=self.consume_timestamp_ms
            )
            return conn.call(conn.stub.SearchOffsetByTimestamp, request).offset
        ranges = conn.call(conn.stub.GetQueueOffsets, pb.GetQueueOffsetsRequest(topic=mq.topic)).queues
        # A retry queue holds only this group's failed messages, each waiting for it: as RocketMQ's consumer,
        # start those at the beginning even when consuming from the last offset, or the waiting retries are skipped.
        first = self.consume_from is ConsumeFrom.FIRST or mq.topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        for r in ranges:
            if r.queue_id == mq.queue_id:
                return r.min_offset if first else r.max_offset
        return 0

    def update(self, queue: MessageQueue | str, *args: int) -> None:
        """``update(mq, offset)`` (or ``update(topic, queue_id, offset)`` with one broker)."""
        key, rest = self._split(queue, args)
        with self._lock:
            self._offsets[key] = int(rest[0])

    def pending_commit(self, queue: MessageQueue | str, *args: int) -> int | None:
        """The queue's offset when it differs from the committed one (to piggy-back on a pull)."""
        key, _ = self._split(queue, args)
        with self._lock:
            offset = self._offsets.get(key)
            return offset if offset is not None and offset != self._committed.get(key) else None

    def mark_committed(self, queue: MessageQueue | str, *args: int) -> None:
        """``mark_committed(mq, offset)`` (or ``(topic, queue_id, offset)`` with one broker)."""
        key, rest = self._split(queue, args)
        with self._lock:
            self._committed[key] = int(rest[0])

    def _changed(self, only: QueueKey | None = None) -> dict[QueueKey, int]:
        with self._lock:
            return {
                k: v for k, v in self._offsets.items() if (only is None or k == only) and self._committed.get(k) != v
            }

    def commit_all(self) -> None:
        with self._commit_lock:
            self._commit(self._changed())

    def commit_queue(self, queue: MessageQueue | str, *args: int, force: bool = False) -> None:
        """Commit one queue's progress; ``force``: even if it was marked committed (a queue handed over: the
        broker must hold exactly this offset before another consumer reads it)."""
        key, _ = self._split(queue, args)
        with self._commit_lock:
            if force:
                with self._lock:
                    offset = self._offsets.get(key)
                self._commit({} if offset is None else {key: offset})
            else:
                self._commit(self._changed(key))

    def _commit(self, changed: dict[QueueKey, int]) -> None:
        """Store ``changed``, each part (broker) on its own: a broker that cannot take its part now does not hold
        up the others. Raises the first failure once every part was tried."""
        failure: BrokerError | None = None
        for part in self._parts(changed) if changed else []:
            try:
                self._commit_part(part)
            except BrokerError as e:
                failure = failure or e
        if failure is not None:
            raise failure

    def _commit_part(self, changed: dict[QueueKey, int]) -> None:
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
        for key, reason in sorted(refused.items()):
            log.warning("dropped the progress %d of %s: the broker refuses it (%s)", changed[key], queue_of(key),
                        reason)

    def forget(self, queue: MessageQueue | str, *args: int) -> None:
        key, _ = self._split(queue, args)
        with self._lock:
            self._offsets.pop(key, None)
            self._committed.pop(key, None)

    def offsets(self) -> dict[QueueKey, int]:
        """Next offset to consume per queue: keyed by (topic, queue id) with one broker, MessageQueue in a cluster."""
        with self._lock:
            return dict(self._offsets)


class RemoteOffsetStore(OffsetStore):
    """Clustering: offsets live on the brokers that own the queues (UpdateConsumerOffsets, one atomic call per
    broker)."""

    def __init__(self, target: Router | Connection, group: str, consume_from: ConsumeFrom,
                 consume_timestamp_ms: int) -> None:
        super().__init__(target, consume_from, consume_timestamp_ms)
        self.group = group

    def _stored(self, key: QueueKey) -> int | None:
        mq = queue_of(key)
        request = pb.QueryConsumerOffsetRequest(consumer_group=self.group, topic=mq.topic, queue_id=mq.queue_id)
        conn = self.connection(mq, write=False)
        found = conn.call(conn.stub.QueryConsumerOffset, request).offsets
        return found[0].offset if found else None

    def _parts(self, changed: dict[QueueKey, int]) -> list[dict[QueueKey, int]]:
        by_broker: dict[str, dict[QueueKey, int]] = defaultdict(dict)
        for key, offset in changed.items():
            by_broker[queue_of(key).broker_name][key] = offset
        return [by_broker[b] for b in sorted(by_broker)]

    def _persist(self, offsets: dict[QueueKey, int]) -> None:
        """One broker's offsets (``_parts`` splits by broker), all or nothing."""
        queues = sorted((queue_of(k), o) for k, o in offsets.items())
        request = pb.UpdateConsumerOffsetsRequest(
            consumer_group=self.group,
            offsets=[pb.QueueOffset(topic=mq.topic, queue_id=mq.queue_id, offset=o) for mq, o in queues],
        )
        conn = self.connection(queues[0][0], write=True)
        conn.call(conn.stub.UpdateConsumerOffsets, request)


class LocalOffsetStore(OffsetStore):
    """Broadcasting: every consumer has its own progress, kept in memory and in ``path`` (JSON) when given.

    The file names a queue ``topic#queue_id`` for a consumer of one broker (the format it always had) and
    ``topic#broker_name#queue_id`` in a cluster (topic names cannot hold ``#``)."""

    def __init__(
        self, target: Router | Connection, consume_from: ConsumeFrom, consume_timestamp_ms: int,
        path: str | Path | None,
    ) -> None:
        super().__init__(target, consume_from, consume_timestamp_ms)
        self.path = Path(path) if path else None
        self._file: dict[str, int] = {}
        if self.path and self.path.exists():
            self._file = {k: int(v) for k, v in json.loads(self.path.read_text()).get("offsetTable", {}).items()}

    @staticmethod
    def _name(key: QueueKey) -> str:
        mq = queue_of(key)
        if isinstance(key, MessageQueue):
            return f"{mq.topic}#{mq.broker_name}#{mq.queue_id}"
        return f"{mq.topic}#{mq.queue_id}"

    def _stored(self, key: QueueKey) -> int | None:
        return self._file.get(self._name(key))

    def _persist(self, offsets: dict[QueueKey, int]) -> None:
        for key, o in offsets.items():
            self._file[self._name(key)] = o
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump({"offsetTable": self._file}, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
