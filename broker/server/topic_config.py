"""Topics the broker knows, persisted in ``config/topics.json`` (RocketMQ's ``topicConfigTable`` layout).

A topic is created explicitly or, when auto-create is on, by its first send with the default queue count (8).

Bounds. Every queue becomes a consume-queue directory and file on disk, an open file and a memory mapping in the
broker (the process has a few tens of thousands of each), so the queues of all topics together are bounded by
``max_total_queue_nums``, and one send may auto-create at most ``max_auto_create_topics_per_request`` topics:
a 38 KB batch once named 50 new topics of 8 queues. A send charges the topics it would create against the bound
before anything is stored (``reserving``) and creates them once it is (``register_sent``); explicit creation,
retry and dead-letter topics are charged as they are made. Topics found in the store at start-up (``adopt``) are
registered whatever the bound: their data exists. A refusal is LimitExceededError naming the setting.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.errors import InvalidArgumentError, LimitExceededError, TopicExistsError, TopicNotExistError
from broker.format.message import validate_topic
from broker.format.system_topics import is_system_topic
from broker.json_file import load_json, write_json_atomic

log = logging.getLogger(__name__)

PERM_READ = 0x4  # RocketMQ PermName.PERM_READ
PERM_WRITE = 0x2  # RocketMQ PermName.PERM_WRITE
PERM_READ_WRITE = PERM_READ | PERM_WRITE


@dataclass(frozen=True)
class TopicConfig:
    topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = PERM_READ_WRITE

    def to_json(self) -> dict[str, object]:
        return {
            "topicName": self.topic,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
        }

    @staticmethod
    def from_json(raw: dict[str, object]) -> TopicConfig:
        return TopicConfig(
            topic=str(raw["topicName"]),
            read_queue_nums=int(str(raw["readQueueNums"])),
            write_queue_nums=int(str(raw["writeQueueNums"])),
            perm=int(str(raw.get("perm", PERM_READ_WRITE))),
        )


def _parse_topics(raw: dict[str, Any]) -> tuple[dict[str, TopicConfig], int]:
    """``{"topicConfigTable": {name: {...}}, "dataVersion": n}``; KeyError etc. when it is not that."""
    table = raw.get("topicConfigTable", {})
    version = raw.get("dataVersion", 0)  # Sluice writes a number, RocketMQ an object with a counter
    counter = version.get("counter", 0) if isinstance(version, dict) else version
    return {name: TopicConfig.from_json(item) for name, item in table.items()}, int(counter)


# Defaults of the bounds in the module docstring: 1024 topics of 8 queues, and what a batch to a handful of new
# topics needs.
DEFAULT_MAX_TOTAL_QUEUE_NUMS = 8192
DEFAULT_MAX_AUTO_CREATE_TOPICS_PER_REQUEST = 16


class TopicConfigManager:
    def __init__(
        self, config_dir: Path, *, default_queue_nums: int = 8, max_queue_nums: int = 1024, auto_create: bool = True,
        max_total_queue_nums: int = DEFAULT_MAX_TOTAL_QUEUE_NUMS,
        max_auto_create_topics_per_request: int = DEFAULT_MAX_AUTO_CREATE_TOPICS_PER_REQUEST,
    ) -> None:
        self.path = config_dir / "topics.json"
        self.default_queue_nums = default_queue_nums
        self.max_queue_nums = max_queue_nums
        self.auto_create = auto_create
        self.max_total_queue_nums = max_total_queue_nums
        self.max_auto_create_topics_per_request = max_auto_create_topics_per_request
        self._reserved_queue_nums = 0  # charged by sends under way for the topics they will create (reserving)
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()  # one writer of the file at a time (they share its temp name)
        self.store_queue_ids: Callable[[str], list[int]] | None = None  # set once the store runs
        self._topics: dict[str, TopicConfig] = {}
        self._data_version = 0
        self._deleting: set[str] = set()  # topics under DeleteTopic: their store queues are not adopted again
        self._listeners: list[Callable[[], None]] = []  # told after every change (the name-server registrar)
        self._dirty = False  # a change whose save failed (a full disk): saved again by persist_if_dirty

    def load(self) -> None:
        loaded = load_json(self.path, _parse_topics)
        if loaded is None:
            return
        with self._lock:
            self._topics, self._data_version = loaded
        log.info("loaded %d topics from %s", len(self._topics), self.path)

    @property
    def data_version(self) -> int:
        """Changes whenever a topic is created, grown or deleted (RocketMQ's topic table DataVersion)."""
        return self._data_version

    def add_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _changed(self) -> None:
        try:
            self.persist()
        finally:  # the change is made in memory either way: the registrar must know of it
            for listener in list(self._listeners):
                listener()

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
                    "topicConfigTable": {name: t.to_json() for name, t in sorted(self._topics.items())},
                    "dataVersion": self._data_version,
                }
                self._dirty = False
            try:
                write_json_atomic(self.path, data)
            except OSError:
                self._dirty = True  # not on disk: the next persist_if_dirty tries again
                raise

    def persist_if_dirty(self) -> None:
        if self._dirty:
            self.persist()

    def _check_queue_nums(self, queue_nums: int) -> None:
        if not 1 <= queue_nums <= self.max_queue_nums:
            raise InvalidArgumentError(
                f"queue count {queue_nums} is outside 1..{self.max_queue_nums}; pick one in range"
            )

    def _queue_nums_locked(self) -> int:
        """Queues of every topic (the larger of its read and write counts), plus those sends have reserved."""
        held = sum(max(t.read_queue_nums, t.write_queue_nums) for t in self._topics.values())
        return held + self._reserved_queue_nums

    def _charge_locked(self, queue_nums: int, what: str) -> None:
        """LimitExceededError unless ``queue_nums`` more queues fit max_total_queue_nums."""
        held = self._queue_nums_locked()
        if held + queue_nums > self.max_total_queue_nums:
            raise LimitExceededError(
                f"{what} needs {queue_nums} more queue(s), but the broker holds {held} of its "
                f"max_total_queue_nums={self.max_total_queue_nums} (each is a directory, a file and a mapping); "
                "delete unused topics or raise the setting"
            )

    def create(
        self, topic: str, queue_nums: int = 0, *, if_not_exists: bool = False, charged: bool = False
    ) -> TopicConfig:
        """``charged``: its queues were counted against the bound already (a send's reservation, or data found in
        the store): create it whatever the bound says now."""
        validate_topic(topic)
        queue_nums = queue_nums or self.default_queue_nums
        self._check_queue_nums(queue_nums)
        with self._lock:
            existing = self._topics.get(topic)
            if existing is not None:
                if if_not_exists:
                    return existing
                raise TopicExistsError(
                    f"topic {topic!r} already exists with {existing.read_queue_nums} queues; "
                    "delete it first or reuse it"
                )
            if not charged:
                self._charge_locked(queue_nums, f"creating topic {topic!r}")
            created = TopicConfig(topic, queue_nums, queue_nums)
            self._topics[topic] = created
            self._data_version += 1
        self._changed()
        log.info("created topic %s with %d queues", topic, queue_nums)
        return created

    def grow(self, topic: str, queue_nums: int, *, charged: bool = False) -> TopicConfig:
        """Raise an existing topic's queue counts to ``queue_nums`` (never lowers them: queues that hold messages
        stay readable). ``charged``: as for create."""
        self._check_queue_nums(queue_nums)
        with self._lock:
            found = self._topics.get(topic)
            if found is None:
                raise TopicNotExistError(f"topic {topic!r} does not exist; create it first")
            if found.read_queue_nums >= queue_nums and found.write_queue_nums >= queue_nums:
                return found
            if not charged:
                more = queue_nums - max(found.read_queue_nums, found.write_queue_nums)
                self._charge_locked(max(more, 0), f"growing topic {topic!r} to {queue_nums} queues")
            grown = TopicConfig(topic, max(found.read_queue_nums, queue_nums), max(found.write_queue_nums, queue_nums),
                                found.perm)
            self._topics[topic] = grown
            self._data_version += 1
        self._changed()
        log.info("topic %s grown to %d queues", topic, queue_nums)
        return grown

    def get(self, topic: str) -> TopicConfig | None:
        return self._topics.get(topic)

    def adopt(self, topic: str, queue_ids: list[int]) -> TopicConfig | None:
        """Register a topic that exists in the store but not here (written by a broker service, or topics.json
        lost): its queue count covers every queue id the store has."""
        if not queue_ids or topic in self._deleting:
            return None
        if is_system_topic(topic):  # written by the broker's own services, which never register them: expected
            log.info("registering system topic %s (found in the store)", topic)
        else:
            log.warning("topic %s found in the store but not in %s; registering it", topic, self.path)
        return self.create(topic, max(max(queue_ids) + 1, 1), if_not_exists=True, charged=True)

    def require(self, topic: str) -> TopicConfig:
        found = self._topics.get(topic)
        if found is None and self.store_queue_ids is not None:
            found = self.adopt(topic, self.store_queue_ids(topic))
        if found is None:
            validate_topic(topic)
            raise TopicNotExistError(
                f"topic {topic!r} does not exist; create it with `sluice topic create {topic}` or send to it first"
            )
        return found

    def get_or_create(self, topic: str) -> TopicConfig:
        """For sends: the topic, auto-created with the default queue count when allowed."""
        found = self._topics.get(topic)
        if found is not None:
            return found
        if not self.auto_create:
            return self.require(topic)
        return self.create(topic, if_not_exists=True)

    def register_sent(self, topic: str, max_queue_id: int) -> TopicConfig:
        """After a send stored messages in ``topic`` up to queue ``max_queue_id``: auto-create the topic on its
        first send, and grow it when it has fewer queues. That happens when ``topic create`` with fewer queues
        than the default ran between the send's check (made against the default count) and this call; the
        queue holding the message must stay readable."""
        config = self._topics.get(topic) or self.create(topic, if_not_exists=True, charged=True)
        if max_queue_id < min(config.read_queue_nums, config.write_queue_nums):
            return config
        log.warning(
            "topic %s has %d queues but a send racing its creation stored into queue %d; growing it to %d",
            topic, config.read_queue_nums, max_queue_id, max_queue_id + 1,
        )
        return self.grow(topic, max_queue_id + 1, charged=True)

    @contextmanager
    def reserving(self, topics: Iterable[str]) -> Iterator[None]:
        """For a send to ``topics``, before anything is stored: charge the topics it would auto-create (those
        neither known nor in the store) against the bounds (module docstring), held until the send is done and
        register_sent made them. LimitExceededError when they do not fit."""
        in_store = self.store_queue_ids or (lambda _topic: [])
        new = [t for t in topics if self._topics.get(t) is None and not in_store(t)]
        if len(new) > self.max_auto_create_topics_per_request:
            raise LimitExceededError(
                f"the send would auto-create {len(new)} topics (first {new[0]!r}); one request may create at most "
                f"max_auto_create_topics_per_request={self.max_auto_create_topics_per_request}: create them first "
                "(`sluice topic create`) or send to fewer new topics at a time"
            )
        charge = len(new) * self.default_queue_nums
        with self._lock:
            if charge:
                self._charge_locked(charge, f"auto-creating topic(s) {new[:3]}")
            self._reserved_queue_nums += charge
        try:
            yield
        finally:
            with self._lock:
                self._reserved_queue_nums -= charge

    def writable_queue_nums(self, topic: str) -> int:
        """For sends, before anything is stored or created: the topic's write queue count, or the count a first
        send would create it with (auto-create on); TopicNotExistError when it does not exist and cannot be made.
        The caller creates it (get_or_create) only once the send is accepted, so a refused send leaves no topic."""
        found = self._topics.get(topic)
        if found is None and self.store_queue_ids is not None and self.store_queue_ids(topic):
            found = self.require(topic)  # in the store but not registered: adopt it with its queues
        if found is not None:
            return found.write_queue_nums
        validate_topic(topic)
        if not self.auto_create:
            self.require(topic)  # raises TopicNotExistError saying how to create it
        return self.default_queue_nums

    def check_write(self, topic: str, min_queue_id: int, max_queue_id: int) -> None:
        """InvalidArgumentError unless queues min..max exist for a send (or would, on the topic's first send);
        creates nothing."""
        count = self.writable_queue_nums(topic)
        for queue_id in (min_queue_id, max_queue_id):
            if not 0 <= queue_id < count:
                raise InvalidArgumentError(
                    f"queue {queue_id} does not exist: topic {topic!r} has queues 0..{count - 1}"
                )

    def check_queue(self, topic: str, queue_id: int) -> TopicConfig:
        """For reads: the topic exists and has the queue (sends use check_write, which creates nothing)."""
        config = self.require(topic)
        count = config.read_queue_nums
        if not 0 <= queue_id < count:
            raise InvalidArgumentError(f"queue {queue_id} does not exist: topic {topic!r} has queues 0..{count - 1}")
        return config

    @contextmanager
    def deleting(self, topic: str) -> Iterator[None]:
        """While a topic is deleted, a pull or an offset commit finds it gone even though the store still has its
        queues: adopting them (require) would register the topic again, and a commit would store an offset of the
        deleted generation that a new topic of the same name then starts from."""
        with self._lock:
            self._deleting.add(topic)
        try:
            yield
        finally:
            with self._lock:
                self._deleting.discard(topic)

    def delete(self, topic: str) -> None:
        with self._lock:
            if self._topics.pop(topic, None) is None:
                raise TopicNotExistError(f"topic {topic!r} does not exist; `sluice topic list` shows the topics")
            self._data_version += 1
        self._changed()

    def topics(self) -> list[TopicConfig]:
        return sorted(self._topics.values(), key=lambda t: t.topic)
