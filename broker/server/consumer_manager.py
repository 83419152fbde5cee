"""Live consumers per group, from heartbeats. Rebalancing is client-side: each consumer reads the sorted id
list of its group and takes its share. A group version changes whenever membership changes, so clients that
see a new version in a heartbeat answer rebalance at once instead of waiting for their periodic rebalance.

Every consumer is kept in memory until it leaves or expires (``expire_ms`` without a heartbeat), so the broker
holds at most ``max_consumers`` of them (each with at most a heartbeat's worth of subscriptions, bounded by the
service): a flood of heartbeats under made-up client ids or groups is refused past that, never a heartbeat of a
consumer already known.

A subscription is a topic's expression and its type: TAG (the default, all a gRPC heartbeat names) or SQL92 (a
RocketMQ 4 consumer's heartbeat may say so). ``subscription(group, topic)`` is what filters the pulls of consumers
that send no expression of their own (RocketMQ 4 push consumers). Listeners (``add_listener``) are told the group
whose membership or subscriptions changed (a consumer joined, left or expired), after the change, outside the lock:
the remoting front notifies that group's RocketMQ 4 clients so that they rebalance at once.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from broker.errors import BrokerError, LimitExceededError, ResponseCode

log = logging.getLogger(__name__)

T = TypeVar("T")

CLUSTERING = "CLUSTERING"
BROADCASTING = "BROADCASTING"
DEFAULT_MAX_CONSUMERS = 10_000  # consumers (all groups) kept at once; see the module docstring
TAG = "TAG"  # the expression type a subscription has unless its heartbeat names another


@dataclass
class ConsumerInfo:
    client_id: str
    subscriptions: dict[str, str]  # topic -> tag expression
    model: str
    last_heartbeat_ms: int
    expression_types: dict[str, str] = field(default_factory=dict)  # topic -> type, for those not TAG


@dataclass
class ConsumerGroupInfo:
    consumers: dict[str, ConsumerInfo] = field(default_factory=dict)
    version: int = 0


class ConsumerManager:
    def __init__(self, expire_ms: int = 120_000, max_consumers: int = DEFAULT_MAX_CONSUMERS) -> None:
        self.expire_ms = expire_ms
        self.max_consumers = max_consumers
        self._count = 0  # consumers of all groups
        self._lock = threading.Lock()
        self._groups: dict[str, ConsumerGroupInfo] = {}
        self._versions = itertools.count(1)  # global so a re-created group never repeats a version
        self._listeners: list[Callable[[str], None]] = []

    def add_listener(self, listener: Callable[[str], None]) -> None:
        """``listener(group)`` after each change of a group's members or subscriptions (module docstring)."""
        self._listeners.append(listener)

    def _changed(self, groups: list[str]) -> None:
        for group in dict.fromkeys(groups):
            for listener in self._listeners:
                try:
                    listener(group)
                except Exception:  # a listener's failure must not fail the heartbeat that changed the group
                    log.exception("group %s: a membership listener failed", group)

    def heartbeat(self, group: str, client_id: str, subscriptions: dict[str, str], model: str,
                  expression_types: Mapping[str, str] | None = None) -> int:
        """``expression_types``: topic -> expression type (SQL92) of the subscriptions that are not TAG."""
        types = {t: k for t, k in (expression_types or {}).items() if k != TAG and t in subscriptions}
        version, changed = self._beat(group, client_id, subscriptions, model, types)
        if changed:
            self._changed([group])
        return version

    def _beat(self, group: str, client_id: str, subscriptions: dict[str, str], model: str,
              types: dict[str, str]) -> tuple[int, bool]:
        now = int(time.time() * 1000)
        changed = False
        with self._lock:
            info = self._groups.get(group)
            known = info.consumers.get(client_id) if info is not None else None
            if known is None:
                if self._count >= self.max_consumers:
                    raise LimitExceededError(
                        f"the broker keeps {self._count} consumers, its limit of {self.max_consumers}; consumer "
                        f"{client_id[:60]!r} of group {group!r} is refused until others leave or expire"
                    )
                self._count += 1
            if info is None:
                info = self._groups[group] = ConsumerGroupInfo()
            if (known is None or known.subscriptions != subscriptions or known.model != model
                    or known.expression_types != types):
                info.version = next(self._versions)
                changed = True
                log.info("group %s: consumer %s registered (%s, %s%s)", group, client_id, model, subscriptions,
                         f", {types}" if types else "")
            info.consumers[client_id] = ConsumerInfo(client_id, dict(subscriptions), model, now, types)
            return info.version, changed

    def unregister(self, group: str, client_id: str) -> int:
        with self._lock:
            info = self._groups.get(group)
            if info is None or info.consumers.pop(client_id, None) is None:
                return info.version if info else 0
            self._count -= 1
            info.version = next(self._versions)
            if not info.consumers:  # versions are global, so a group that comes back never repeats one
                del self._groups[group]
            log.info("group %s: consumer %s left", group, client_id)
            version = info.version
        self._changed([group])
        return version

    def expire(self) -> list[tuple[str, str]]:
        """Drop consumers silent for longer than ``expire_ms``; returns the (group, client) pairs dropped."""
        deadline = int(time.time() * 1000) - self.expire_ms
        dropped = []
        with self._lock:
            for group, info in self._groups.items():
                stale = [cid for cid, c in info.consumers.items() if c.last_heartbeat_ms < deadline]
                for cid in stale:
                    del info.consumers[cid]
                    dropped.append((group, cid))
                self._count -= len(stale)
                if stale:
                    info.version = next(self._versions)
            for group in {g for g, _ in dropped if not self._groups[g].consumers}:
                del self._groups[group]  # every group name ever seen would otherwise stay
        for group, cid in dropped:
            log.warning("group %s: consumer %s expired after %d ms without heartbeat", group, cid, self.expire_ms)
        self._changed([g for g, _ in dropped])
        return dropped

    def subscription(self, group: str, topic: str) -> tuple[str, str] | None:
        """(expression, type) the group's consumers subscribe ``topic`` with (the latest heartbeat's, as RocketMQ
        keeps one subscription per group and topic); None when none of them subscribes it."""
        with self._lock:
            info = self._groups.get(group)
            subscribed = [c for c in info.consumers.values() if topic in c.subscriptions] if info else []
            if not subscribed:
                return None
            latest = max(subscribed, key=lambda c: c.last_heartbeat_ms)
            return latest.subscriptions[topic], latest.expression_types.get(topic, TAG)

    def consumer_ids(self, group: str) -> tuple[list[str], int]:
        with self._lock:
            info = self._groups.get(group)
            if info is None:
                return [], 0
            return sorted(info.consumers), info.version

    def has_group(self, group: str) -> bool:
        with self._lock:
            info = self._groups.get(group)
            return bool(info and info.consumers)

    def subscribed_topics(self, group: str) -> list[str]:
        with self._lock:
            info = self._groups.get(group)
            if info is None:
                return []
            return sorted({t for c in info.consumers.values() for t in c.subscriptions})

    def members(self, group: str) -> list[ConsumerInfo]:
        """The group's live consumers (copies), sorted by client id: what an administrator's connection list shows."""
        with self._lock:
            info = self._groups.get(group)
            if info is None:
                return []
            return [replace(c, subscriptions=dict(c.subscriptions)) for _, c in sorted(info.consumers.items())]

    def live_groups(self) -> dict[str, tuple[int, list[str]]]:
        """Every group with live consumers: (how many, the topics they subscribe to, sorted)."""
        with self._lock:
            return {
                group: (len(info.consumers), sorted({t for c in info.consumers.values() for t in c.subscriptions}))
                for group, info in self._groups.items()
                if info.consumers
            }

    def while_idle(self, group: str, action: Callable[[], T]) -> T:
        """``action()`` while no consumer of ``group`` is live, as one step: a consumer registering meanwhile waits
        for it (its heartbeat takes this lock), so it reads what ``action`` stored. Refused with NO_PERMISSION
        while consumers are live: they hold offsets in memory and would commit them over what ``action`` stores."""
        with self._lock:
            info = self._groups.get(group)
            if info is not None and info.consumers:
                ids = sorted(info.consumers)
                raise BrokerError(
                    f"group {group!r} has {len(ids)} live consumer(s) ({', '.join(ids[:3])}"
                    f"{', ...' if len(ids) > 3 else ''}); stop them first (a consumer that stopped without "
                    f"unregistering counts as live until {self.expire_ms} ms after its last heartbeat)",
                    ResponseCode.NO_PERMISSION,
                )
            return action()
