"""Administration and queries: topics, queue offsets, consumer offsets and lag, message lookups, broker stats.

Each public method is one operation, whichever front called it (the Sluice service, the remoting port, RocketMQ 5's
service): it asks for the caller's rights on what it touches first (broker/auth/operations.py ``authorize``), before
it reads, creates or changes anything. The underscored methods are the same work unchecked, for an operation that
reads what it was already granted (a reset reads the offsets it replaces) and for the broker's own callers.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from broker.auth.operations import Operation, allowed, authorize
from broker.errors import InvalidArgumentError, QueryNotFoundError, SubscriptionGroupNotExistError, shown
from broker.format.message import (
    BODY_START,
    I32,
    POS_BODY_LENGTH,
    StoredMessage,
    encode_entry,
    encode_properties,
    validate_topic,
)
from broker.format.system_topics import is_system_topic, refuse_system_topic
from broker.server.consumer_manager import ConsumerInfo, ConsumerManager
from broker.server.consumer_offsets import ConsumerOffsetManager, QueueKey, validate_group
from broker.server.pull_hold import PullHoldService
from broker.server.pull_processor import PullProcessor
from broker.server.topic_config import TopicConfig, TopicConfigManager
from broker.store import MessageStore

DEFAULT_QUERY_MAX = 64
QUERY_MAX_LIMIT = 4096
MAX_OFFSETS_PER_UPDATE = 65_536  # a consumer's share of its queues, many times over
MAX_KEY_CHARS = 32 * 1024  # a key lies in a message's properties (at most 32767 bytes): longer ones match nothing
MAX_LIST_GROUPS = 100_000  # groups one ListGroups answer may carry (some 100 bytes each, within one gRPC message)


@dataclass
class GroupSummary:
    group: str
    online_consumers: int
    topics: list[str]


@dataclass
class GroupQueueLag:
    topic: str
    queue_id: int
    broker_offset: int
    consumer_offset: int  # -1: nothing committed
    lag: int


def encode_stored(msg: StoredMessage) -> bytes:
    """Re-encode a decoded message, store fields included (queries are rare; pulls ship raw bytes instead)."""

    def host(text: str) -> tuple[bytes, int]:
        ip, _, port = text.rpartition(":")
        return socket.inet_aton(ip or "127.0.0.1"), int(port or 0)

    born_ip, born_port = host(msg.born_host)
    store_ip, store_port = host(msg.store_host)
    return encode_entry(
        msg.topic.encode("ascii"), msg.queue_id, msg.body, encode_properties(msg.properties), flag=msg.flag,
        sys_flag=msg.sys_flag, born_timestamp=msg.born_timestamp, born_ip=born_ip, born_port=born_port,
        reconsume_times=msg.reconsume_times, prepared_transaction_offset=msg.prepared_transaction_offset,
        queue_offset=msg.queue_offset, physical_offset=msg.commitlog_offset, store_timestamp=msg.store_timestamp,
        store_ip=store_ip, store_port=store_port, max_message_size=max(len(msg.body), 1),
    )


def pack_entries(entries: list[bytes]) -> tuple[bytes, list[int]]:
    """Entries back to back, with where each starts (a MessagesResponse)."""
    positions, pos = [], 0
    for raw in entries:
        positions.append(pos)
        pos += len(raw)
    return b"".join(entries), positions


def _refuse_system_topic(topic: str, what: str) -> None:
    """The schedule and transaction topics hold messages the broker still owes (delayed, half, decisions):
    deleting one would drop them, creating one would fix a queue count the broker's services do not follow."""
    if is_system_topic(topic):
        raise InvalidArgumentError(
            f"topic {topic!r} is a system topic the broker manages; it cannot be {what} (delayed and transactional "
            "messages live there)"
        )


class AdminProcessor:
    def __init__(
        self, store: MessageStore, topics: TopicConfigManager, offsets: ConsumerOffsetManager,
        consumers: ConsumerManager, pulls: PullProcessor, hold: PullHoldService,
    ) -> None:
        self.store, self.topics, self.offsets, self.consumers = store, topics, offsets, consumers
        self.pulls, self.hold = pulls, hold
        self.admit_commit: Callable[[str], None] | None = None  # set by the controller: known groups only
        self.on_topic_deleted: Callable[[str], None] | None = None  # set by the controller: pop bookkeeping

    # ------------------------------------------------------------------------------------------------ topics
    def create_topic(self, topic: str, queue_nums: int, if_not_exists: bool) -> TopicConfig:
        authorize(Operation.CREATE_TOPIC, name=topic)
        _refuse_system_topic(topic, "created")
        return self.topics.create(topic, queue_nums, if_not_exists=if_not_exists)

    def create_or_grow_topic(self, topic: str, queue_nums: int) -> None:
        """mqadmin's updateTopic: the topic made with ``queue_nums`` queues, or grown to them. A topic's queue count
        is never lowered (its queues keep their messages readable)."""
        authorize(Operation.CREATE_TOPIC, name=topic)
        if queue_nums < 1:
            raise InvalidArgumentError(f"a topic needs at least one queue, not {queue_nums}")
        existing = self.topics.get(topic)
        if existing is not None and queue_nums < existing.read_queue_nums:
            raise InvalidArgumentError(
                f"topic {topic!r} has {existing.read_queue_nums} queues; Sluice never lowers a topic's queue "
                f"count (its queues keep their messages readable), so {queue_nums} is refused"
            )
        if existing is None or queue_nums > existing.read_queue_nums:
            _refuse_system_topic(topic, "created")
            self.topics.create(topic, queue_nums, if_not_exists=True)
            if existing is not None:
                self.topics.grow(topic, queue_nums)

    def list_topics(self) -> list[TopicConfig]:
        authorize(Operation.LIST_RESOURCES)
        return self.topics.topics()

    def delete_topic(self, topic: str) -> None:
        """The topic's config goes first (from then on pulls and commits find no topic), then the groups' offsets,
        on disk before the store deletes the queues: a crash in between must not leave offsets of the deleted
        generation for a new topic of the same name (its consumers would skip to them), and a crash before leaves
        the topic's messages, which the next start registers again (the deletion was not acknowledged). A name
        no topic can have is refused as such (INVALID_ARGUMENT), not reported missing."""
        authorize(Operation.DELETE_TOPIC, name=topic)
        validate_topic(topic)
        _refuse_system_topic(topic, "deleted")
        with self.topics.deleting(topic):
            self.topics.delete(topic)
            self.offsets.remove_topic(topic)
            if self.on_topic_deleted is not None:  # pop positions too, on disk before the queues go
                self.on_topic_deleted(topic)
            self.offsets.persist()
            self.store.delete_topic(topic)

    def topic_route(self, topic: str, auto_create: bool) -> TopicConfig:
        authorize(Operation.READ_TOPIC, topics=[topic])  # before a lookup that may create the topic
        if is_system_topic(topic):
            return self.topics.require(topic)  # the broker's own queues; never made with the default count
        return self.topics.get_or_create(topic) if auto_create else self.topics.require(topic)

    def queue_offsets(self, topic: str) -> list[tuple[int, int, int]]:
        authorize(Operation.READ_TOPIC, topics=[topic])
        config = self.topics.require(topic)
        return self.store.queue_ranges(topic, range(config.read_queue_nums))

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        authorize(Operation.READ_TOPIC, topics=[topic])
        return self._search_offset(topic, queue_id, timestamp_ms)

    def _search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        self.topics.check_queue(topic, queue_id)
        return self.store.offset_by_time(topic, queue_id, timestamp_ms)

    def earliest_time(self, topic: str, queue_id: int) -> int:
        """The store time (ms) of the queue's first kept message; -1 for an empty queue."""
        authorize(Operation.READ_TOPIC, topics=[topic])
        self.topics.check_queue(topic, queue_id)
        return self.store.earliest_message_time(topic, queue_id)

    # ------------------------------------------------------------------------------------------------ offsets
    def query_consumer_offsets(self, group: str, topic: str, queue_id: int) -> dict[int, int]:
        authorize(Operation.CONSUME, group=group, topics=[topic])
        return self._query_consumer_offsets(group, topic, queue_id)

    def _query_consumer_offsets(self, group: str, topic: str, queue_id: int) -> dict[int, int]:
        validate_group(group)
        validate_topic(topic)
        found = self.offsets.query(group, topic)
        return found if queue_id < 0 else {q: o for q, o in found.items() if q == queue_id}

    def update_consumer_offsets(self, group: str, offsets: Mapping[QueueKey, int]) -> int:
        authorize(Operation.CONSUME, group=group, topics=[t for t, _ in offsets])
        validate_group(group)
        if len(offsets) > MAX_OFFSETS_PER_UPDATE:
            raise InvalidArgumentError(
                f"{len(offsets)} offsets in one update; at most {MAX_OFFSETS_PER_UPDATE} (each is checked against its "
                "queue under the offset table's lock)"
            )
        if self.admit_commit is not None:
            self.admit_commit(group)
        return self.offsets.commit(group, offsets, self.pulls.check_commit)

    def reset_consumer_offsets(self, group: str, offsets: Mapping[QueueKey, int]) -> dict[QueueKey, int]:
        """Set committed offsets (any direction), all or nothing, only while the group has no live consumer (see
        ConsumerManager.while_idle), and saved at once: an administrator's reset must not wait for the periodic
        save to survive a crash. Returns the offsets replaced (-1: none)."""
        authorize(Operation.RESET_OFFSETS, name=group, topics=[t for t, _ in offsets])
        return self._reset_consumer_offsets(group, offsets)

    def reset_to_time(self, group: str, topic: str, timestamp_ms: int | None, force: bool) -> dict[QueueKey, int]:
        """mqadmin's resetOffsetByTime: each queue of ``topic`` set to the offset of ``timestamp_ms`` (None: the
        queue's end); unless ``force``, a queue already committed before that offset keeps its own. The offsets
        set, all or nothing as reset_consumer_offsets."""
        authorize(Operation.RESET_OFFSETS, name=group, topics=[topic])
        config = self.topics.require(topic)
        committed = self._query_consumer_offsets(group, topic, -1)
        offsets: dict[QueueKey, int] = {}
        for q in range(config.read_queue_nums):
            target = self.store.max_offset(topic, q) if timestamp_ms is None else self._search_offset(
                topic, q, timestamp_ms)
            current = committed.get(q, -1)
            offsets[(topic, q)] = target if force or current < 0 or target < current else current
        self._reset_consumer_offsets(group, offsets)
        return offsets

    def _reset_consumer_offsets(self, group: str, offsets: Mapping[QueueKey, int]) -> dict[QueueKey, int]:
        validate_group(group)
        if self.admit_commit is not None:
            self.admit_commit(group)

        def reset() -> dict[QueueKey, int]:
            before = {t: self.offsets.query(group, t) for t in {t for t, _ in offsets}}
            self.offsets.commit(group, offsets, self.pulls.check_commit)
            return {(t, q): before[t].get(q, -1) for t, q in offsets}

        previous = self.consumers.while_idle(group, reset)
        self.offsets.persist()
        return previous

    def list_groups(self, configured: Iterable[str]) -> list[GroupSummary]:
        """Groups with committed offsets, live consumers or settings (``configured``), sorted by name."""
        authorize(Operation.LIST_RESOURCES)
        live = self.consumers.live_groups()
        topics: dict[str, set[str]] = {g: set(ts) for g, (_, ts) in live.items()}
        for group, topic in self.offsets.groups():
            topics.setdefault(group, set()).add(topic)
        for group in configured:
            topics.setdefault(group, set())
        if len(topics) > MAX_LIST_GROUPS:
            raise InvalidArgumentError(
                f"{len(topics)} groups, more than one answer carries ({MAX_LIST_GROUPS}); ask for a group by name"
            )
        return [GroupSummary(g, live.get(g, (0, []))[0], sorted(ts)) for g, ts in sorted(topics.items())]

    def consumer_lag(self, group: str, topic: str = "") -> list[GroupQueueLag]:
        authorize(Operation.GROUP_LAG, group=group, topic=topic)
        validate_group(group)
        if not self.offsets.has_group(group) and not self.consumers.has_group(group):
            raise SubscriptionGroupNotExistError(
                f"consumer group {group!r} has no committed offsets and no live consumers on this broker; "
                "check the group name (`sluice group lag` needs a group that has consumed or is consuming)"
            )
        if topic:
            return self.lags(group, [topic])  # decided above
        found = sorted({*self.offsets.topics_of(group), *self.consumers.subscribed_topics(group)})
        # the group's offsets may name topics other members read: only those the caller may read are shown
        return self.lags(group, [t for t in found if allowed(Operation.GROUP_LAG, group=group, topic=t)])

    def lags(self, group: str, topics: Iterable[str]) -> list[GroupQueueLag]:
        """Per-queue lag of ``group`` on ``topics``, unchecked: the metrics gauge asks it of every (group, topic)
        with offsets, and consumer_lag's group check scans the offset table (per pair, that is quadratic)."""
        lags = []
        for t in topics:
            config = self.topics.get(t)
            if config is None:
                continue
            committed = self.offsets.query(group, t)
            for qid in range(config.read_queue_nums):
                max_offset = self.store.max_offset(t, qid)
                consumer_offset = committed.get(qid, -1)
                base = consumer_offset if consumer_offset >= 0 else self.store.min_offset(t, qid)
                lags.append(GroupQueueLag(t, qid, max_offset, consumer_offset, max(max_offset - base, 0)))
        return lags

    # ------------------------------------------------------------------------------------------------ queries
    def query_by_key(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int) -> list[bytes]:
        """The entries of ``topic`` with ``key`` (KEYS or UNIQ_KEY), exactly as stored (as a pull returns them)."""
        authorize(Operation.QUERY_MESSAGES, topic=topic)
        validate_topic(topic)
        refuse_system_topic(topic, "look up messages by key in")
        self.topics.require(topic)
        if max_num < 0:
            raise InvalidArgumentError(
                f"max_num {max_num} is negative; give 1..{QUERY_MAX_LIMIT}, or 0 for the default"
            )
        if len(key) > MAX_KEY_CHARS:
            raise InvalidArgumentError(f"key {shown(key)} is {len(key)} characters; keys are at most {MAX_KEY_CHARS}")
        limit = min(max_num or DEFAULT_QUERY_MAX, QUERY_MAX_LIMIT)
        found = self.store.query_by_key(topic, key, limit, begin_ms, end_ms or 2**62)
        entries = (self.store.lookup_entry(m.commitlog_offset) for m in found)
        return [e for e in entries if e is not None]  # None: expired since the lookup

    def view_by_id(self, msg_id: str) -> bytes:
        """The entry an offset msgId names, exactly as stored."""
        found = self.store.view_entry_by_msg_id(msg_id)
        if found is None:
            raise QueryNotFoundError(
                f"no message with id {msg_id} on this broker (expired, or the id came from another broker)"
            )
        topic_at = BODY_START + I32.unpack_from(found, POS_BODY_LENGTH)[0]
        topic = found[topic_at + 1 : topic_at + 1 + found[topic_at]].decode("ascii", "replace")
        authorize(Operation.VIEW_MESSAGE, topic=topic)  # the entry read: an id names no topic before it is read
        refuse_system_topic(topic, "view")
        return found

    # ------------------------------------------------------------------------------------------------ stats
    def consumer_ids(self, group: str) -> tuple[list[str], int]:
        """The client ids of the group's live consumers, and the group's version (a rebalance reads them)."""
        authorize(Operation.READ_GROUP, group=group)
        validate_group(group)
        return self.consumers.consumer_ids(group)

    def group_members(self, group: str) -> list[ConsumerInfo]:
        """The group's live consumers with their subscriptions (mqadmin's consumerConnection)."""
        authorize(Operation.READ_GROUP, group=group)
        return self.consumers.members(group)

    def stats(self, extra: Mapping[str, float]) -> dict[str, float]:
        authorize(Operation.CLUSTER_STATS)
        values = {f"store_{k}": float(v) for k, v in self.store.stats().items() if isinstance(v, int | float)}
        values.update(extra)
        values["topics"] = float(len(self.topics.topics()))
        values["held_pulls"] = float(self.hold.held_count())
        return values
