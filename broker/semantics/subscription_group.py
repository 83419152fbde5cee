"""Subscription group settings: RocketMQ's ``SubscriptionGroupManager`` and ``config/subscriptionGroup.json``.

The file has RocketMQ's shape (``{"subscriptionGroupTable": {group: {...}}, "dataVersion": {...}}``) with RocketMQ's
field names, so a file from either broker reads the same. Every change is written at once, atomically.

Groups are created by the first pull, heartbeat or send-back that names them (when auto_create is on) and kept
for good, and every change rewrites the whole file: so at most ``max_groups`` exist (a flood of made-up group
names grew the file, and the cost of each write, without end). Past it a new group is refused with
LimitExceededError; the groups a file already holds are loaded whatever their number.

Server wiring::

    groups = SubscriptionGroupManager(store_config.config_dir)       # loads the file
    cfg = groups.find(group)            # None if unknown (auto_create=True makes it with defaults instead)
    groups.update(SubscriptionGroupConfig(group, retry_max_times=3))
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from broker.errors import InvalidArgumentError, LimitExceededError, SubscriptionGroupNotExistError
from broker.json_file import load_json, write_json_atomic

log = logging.getLogger(__name__)

SUBSCRIPTION_GROUP_FILE = "subscriptionGroup.json"
MAX_GROUP_NAME_CHARS = 255  # RocketMQ's CHARACTER_MAX_LENGTH for group names
MAX_RETRY_QUEUE_NUMS = 64  # retry queues per group; each is a consume queue on disk
MAX_RETRY_MAX_TIMES = 100  # more would exceed the delay levels by far; RocketMQ's default is 16
DEFAULT_MAX_GROUPS = 10_000  # see the module docstring

# snake_case field -> RocketMQ's JSON name
_JSON_NAMES = {
    "group_name": "groupName",
    "consume_enable": "consumeEnable",
    "consume_from_min_enable": "consumeFromMinEnable",
    "consume_broadcast_enable": "consumeBroadcastEnable",
    "retry_queue_nums": "retryQueueNums",
    "retry_max_times": "retryMaxTimes",
    "broker_id": "brokerId",
    "which_broker_when_consume_slowly": "whichBrokerWhenConsumeSlowly",
    "notify_consumer_ids_changed_enable": "notifyConsumerIdsChangedEnable",
    "consume_message_orderly": "consumeMessageOrderly",
}


@dataclass(frozen=True)
class SubscriptionGroupConfig:
    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    # Pop consumption (RocketMQ 5's FIFO groups): a message group's next message waits until the earlier one is done
    consume_message_orderly: bool = False

    def validate(self) -> None:
        if not self.group_name or len(self.group_name) > MAX_GROUP_NAME_CHARS:
            raise InvalidArgumentError(f"group name {self.group_name[:40]!r}: give 1..{MAX_GROUP_NAME_CHARS} chars")
        if not 1 <= self.retry_queue_nums <= MAX_RETRY_QUEUE_NUMS:
            raise InvalidArgumentError(
                f"retryQueueNums={self.retry_queue_nums} for group {self.group_name}: use 1..{MAX_RETRY_QUEUE_NUMS}"
            )
        if not 0 <= self.retry_max_times <= MAX_RETRY_MAX_TIMES:
            raise InvalidArgumentError(
                f"retryMaxTimes={self.retry_max_times} for group {self.group_name}: use 0..{MAX_RETRY_MAX_TIMES}"
            )

    def to_json(self) -> dict[str, Any]:
        return {_JSON_NAMES[k]: v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SubscriptionGroupConfig:
        known = {f.name for f in fields(cls)}
        by_json = {v: k for k, v in _JSON_NAMES.items() if k in known}
        kwargs = {by_json[k]: v for k, v in data.items() if k in by_json}
        cfg = cls(**kwargs)
        cfg.validate()
        return cfg


def _parse_groups(data: dict[str, Any]) -> tuple[dict[str, SubscriptionGroupConfig], dict[str, int]]:
    """``{"subscriptionGroupTable": {name: {...}}, "dataVersion": {...}}``; ValueError etc. when it is not that."""
    table = data.get("subscriptionGroupTable")
    if not isinstance(table, dict):
        raise ValueError("no 'subscriptionGroupTable' object")
    groups = {}
    for name, raw in table.items():
        cfg = SubscriptionGroupConfig.from_json({**raw, "groupName": raw.get("groupName", name)})
        groups[cfg.group_name] = cfg
    version = data.get("dataVersion")
    if not isinstance(version, dict):
        version = {}
    return groups, {"counter": int(version.get("counter", 0)), "timestamp": int(version.get("timestamp", 0))}


class SubscriptionGroupManager:
    """Thread-safe table of group settings, persisted on every change."""

    def __init__(self, config_dir: str, *, auto_create: bool = True, max_groups: int = DEFAULT_MAX_GROUPS) -> None:
        self.path = os.path.join(config_dir, SUBSCRIPTION_GROUP_FILE)
        self.auto_create = auto_create  # RocketMQ's autoCreateSubscriptionGroup (default true)
        self.max_groups = max_groups
        self._lock = threading.Lock()
        self._table: dict[str, SubscriptionGroupConfig] = {}
        self._data_version = {"counter": 0, "timestamp": 0}
        # A group auto-created while its file could not be written (a full disk): saved by persist_if_dirty.
        self._dirty = False
        self._load()

    def replace(self, data: dict[str, Any]) -> None:
        """A slave: the master's file replaces this one and is loaded, under the table's lock (which every persist
        holds, so an older table cannot be written after it)."""
        with self._lock:
            write_json_atomic(self.path, data)
            self._load()

    def _load(self) -> None:
        loaded = load_json(self.path, _parse_groups)
        if loaded is not None:
            self._table, self._data_version = loaded

    def _persist_locked(self) -> None:
        self._data_version = {"counter": self._data_version["counter"] + 1, "timestamp": int(time.time() * 1000)}
        write_json_atomic(
            self.path,
            {
                "subscriptionGroupTable": {name: cfg.to_json() for name, cfg in sorted(self._table.items())},
                "dataVersion": self._data_version,
            },
        )
        self._dirty = False  # the whole table is on disk, groups created unsaved included

    def find(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's settings; created with defaults (and persisted) when unknown and auto_create is on."""
        with self._lock:
            cfg = self._table.get(group)
            if cfg is None and self.auto_create:
                cfg = SubscriptionGroupConfig(group)
                cfg.validate()
                self._admit_locked(group)
                self._table[group] = cfg
                try:
                    self._persist_locked()
                except OSError as e:
                    # A pull or a heartbeat must not fail because a full disk cannot take the file: the group
                    # exists in memory with default settings, which a restart before the save would create again.
                    log.warning("group %s created but not saved (%s); saved once the disk takes it", group, e)
                    self._dirty = True
            return cfg

    def persist_if_dirty(self) -> None:
        """Save groups auto-created while the file could not be written (OSError while it still cannot)."""
        with self._lock:
            if self._dirty:
                self._persist_locked()

    def peek(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's settings if it exists; never creates it (for what a client may only describe, not make)."""
        with self._lock:
            return self._table.get(group)

    def get(self, group: str) -> SubscriptionGroupConfig:
        """Like ``find`` but SubscriptionGroupNotExistError when the group is unknown and not auto-created."""
        cfg = self.find(group)
        if cfg is None:
            raise SubscriptionGroupNotExistError(
                f"subscription group {group!r} does not exist; create it first (auto-creation is off)"
            )
        return cfg

    def _admit_locked(self, group: str) -> None:
        """LimitExceededError when a new group would pass max_groups."""
        if group not in self._table and len(self._table) >= self.max_groups:
            raise LimitExceededError(
                f"subscription group {group[:60]!r} would be group {len(self._table) + 1}; this broker keeps at most "
                f"max_subscription_groups={self.max_groups} (delete unused groups or raise the setting)"
            )

    def update(self, cfg: SubscriptionGroupConfig) -> None:
        cfg.validate()
        with self._lock:
            self._admit_locked(cfg.group_name)
            self._table[cfg.group_name] = cfg
            self._persist_locked()

    def update_fields(self, group: str, **changes: Any) -> SubscriptionGroupConfig:
        """Change some settings of a group (created with defaults first if unknown)."""
        with self._lock:
            cfg = replace(self._table.get(group) or SubscriptionGroupConfig(group), **changes)
            cfg.validate()
            self._admit_locked(group)
            self._table[group] = cfg
            self._persist_locked()
            return cfg

    def delete(self, group: str) -> bool:
        with self._lock:
            if self._table.pop(group, None) is None:
                return False
            self._persist_locked()
            return True

    def groups(self) -> list[SubscriptionGroupConfig]:
        with self._lock:
            return [self._table[name] for name in sorted(self._table)]

    @property
    def data_version(self) -> dict[str, int]:
        with self._lock:
            return dict(self._data_version)
