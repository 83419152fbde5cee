"""Access control entries and how a request's needs are decided against them (RocketMQ 5.3's ACL 2.0 model).

An entry belongs to one user: a resource pattern, a set of actions, a decision (Allow or Deny) and optionally the
source networks it holds for. Resources are ``Cluster``, ``Topic:NAME`` and ``Group:NAME``; NAME is matched
literally, as a prefix when it ends in ``*`` (``Topic:orders-*``), or is ``*`` (every topic); ``*`` alone matches
every resource. Actions are Pub, Sub, Create, Update, Delete, Get, List, and All for every one of them.

Deciding one need (a resource and the actions any one of which is enough):

* Only entries whose pattern matches the resource, that name the action (or All), and whose source networks, if
  any, hold the caller's address, take part. A source network narrows an entry; it never lets anyone in who did
  not authenticate (RocketMQ's IP whitelist skipped authentication, its RIP-68 calls that a security problem).
* The most specific of them decide: a literal name beats a prefix, a longer prefix a shorter one, any prefix
  ``NAME:*``, and that the bare ``*``. At equal specificity Deny wins over Allow (RocketMQ 5.3.0 let Allow win,
  apache/rocketmq#9784; Kafka and NATS let Deny win).
* Nothing matching is a Deny: once authorization is on, a user may do only what it was granted.

A need on a named resource that an administrator may also meet through the cluster (``or_cluster``: creating,
deleting, reading a topic's or group's settings) is decided on the resource first: an explicit answer there
stands; only when nothing matches there does the same action on ``Cluster`` decide. So ``Deny Delete`` on
``Topic:audit`` keeps even a user allowed ``Delete`` on the Cluster from deleting that topic.

A group's retry and dead-letter topics (``%RETRY%G``, ``%DLQ%G``) are decided as the group ``G`` itself, with
Pub counted as Sub: what consumers of G may consume they may also put back for a later attempt (Kafka's rights
follow the group the same way).
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from broker.errors import InvalidArgumentError

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
MAX_NAME_CHARS = 255  # a pattern's NAME: as long as a topic name may be
MAX_SOURCE_NETWORKS = 32  # per entry: more is a firewall's job


class Action(enum.Enum):
    PUB = "Pub"
    SUB = "Sub"
    CREATE = "Create"
    UPDATE = "Update"
    DELETE = "Delete"
    GET = "Get"
    LIST = "List"
    ALL = "All"

    @staticmethod
    def parse(text: str) -> Action:
        for a in Action:
            if a.value.lower() == text.strip().lower():
                return a
        raise InvalidArgumentError(f"unknown action {text[:40]!r}; use {', '.join(a.value for a in Action)}")


class Decision(enum.Enum):
    ALLOW = "Allow"
    DENY = "Deny"

    @staticmethod
    def parse(text: str) -> Decision:
        for d in Decision:
            if d.value.lower() == text.strip().lower():
                return d
        raise InvalidArgumentError(f"unknown decision {text[:40]!r}; use Allow or Deny")


class Kind(enum.Enum):
    CLUSTER = "Cluster"
    TOPIC = "Topic"
    GROUP = "Group"


@dataclass(frozen=True, slots=True)
class Resource:
    """A concrete resource a request touches (never a pattern)."""

    kind: Kind
    name: str = ""

    def __str__(self) -> str:
        return self.kind.value if self.kind is Kind.CLUSTER else f"{self.kind.value}:{self.name}"


CLUSTER = Resource(Kind.CLUSTER)


def topic(name: str) -> Resource:
    return Resource(Kind.TOPIC, name)


def group(name: str) -> Resource:
    return Resource(Kind.GROUP, name)


@dataclass(frozen=True, slots=True)
class Pattern:
    """A resource pattern of an entry: ``kind`` None is the bare ``*``; ``prefix`` True matches names starting with
    ``name`` (``name`` "" and prefix: every name of the kind)."""

    kind: Kind | None
    name: str = ""
    prefix: bool = False

    @staticmethod
    def parse(text: str) -> Pattern:
        text = text.strip()
        if text == "*":
            return Pattern(None)
        if text.lower() == "cluster" or text.lower().startswith("cluster:"):
            return Pattern(Kind.CLUSTER)  # RocketMQ writes Cluster:NAME; a broker serves one cluster
        kind_text, sep, name = text.partition(":")
        kind = next((k for k in (Kind.TOPIC, Kind.GROUP) if k.value.lower() == kind_text.lower()), None)
        if kind is None or not sep or not name:
            raise InvalidArgumentError(
                f"resource {text[:60]!r} is not Cluster, Topic:NAME, Group:NAME or *; NAME may end in '*'"
            )
        if len(name) > MAX_NAME_CHARS or "*" in name[:-1]:
            raise InvalidArgumentError(f"resource name {name[:60]!r}: '*' only at the end, at most {MAX_NAME_CHARS}")
        if name.endswith("*"):
            return Pattern(kind, name[:-1], prefix=True)
        return Pattern(kind, name)

    def __str__(self) -> str:
        if self.kind is None:
            return "*"
        if self.kind is Kind.CLUSTER:
            return "Cluster"
        return f"{self.kind.value}:{self.name}{'*' if self.prefix else ''}"

    def matches(self, resource: Resource) -> bool:
        if self.kind is None:
            return True
        if self.kind is not resource.kind:
            return False
        if self.kind is Kind.CLUSTER:
            return True
        return resource.name.startswith(self.name) if self.prefix else resource.name == self.name

    def specificity(self) -> tuple[int, int]:
        """Orders matching patterns, most specific highest: (rank, length of the name or prefix)."""
        if self.kind is None:
            return (0, 0)
        if self.prefix:
            return (1, len(self.name))
        return (2, len(self.name))


def parse_networks(texts: Iterable[str]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    networks = []
    for text in texts:
        try:
            networks.append(ipaddress.ip_network(text.strip(), strict=False))
        except ValueError:
            raise InvalidArgumentError(f"source network {text[:60]!r} is not an address or a CIDR") from None
    if len(networks) > MAX_SOURCE_NETWORKS:
        raise InvalidArgumentError(f"at most {MAX_SOURCE_NETWORKS} source networks per entry")
    return tuple(networks)


@dataclass(frozen=True, slots=True)
class Entry:
    """One access control entry of a user."""

    pattern: Pattern
    actions: frozenset[Action]
    decision: Decision
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    def covers(self, action: Action) -> bool:
        return action in self.actions or Action.ALL in self.actions

    def holds_for(self, source: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> bool:
        if not self.networks:
            return True
        return source is not None and any(source in n for n in self.networks if n.version == source.version)

    def to_json(self) -> dict[str, object]:
        return {"resource": str(self.pattern), "actions": sorted(a.value for a in self.actions),
                "decision": self.decision.value, "source_ips": [str(n) for n in self.networks]}

    @staticmethod
    def from_json(data: dict[str, object]) -> Entry:
        actions = data.get("actions", [])
        networks = data.get("source_ips", [])
        if not isinstance(actions, list) or not isinstance(networks, list) or not actions:
            raise InvalidArgumentError("an entry needs a list of actions and a list of source networks")
        return Entry(Pattern.parse(str(data.get("resource", ""))), frozenset(Action.parse(str(a)) for a in actions),
                     Decision.parse(str(data.get("decision", "Allow"))),
                     parse_networks(str(n) for n in networks))


@dataclass(frozen=True, slots=True)
class Need:
    """What one request needs: ``actions`` (any one is enough) on ``resource``; ``or_cluster``: the same action on
    the Cluster also meets it when nothing matches the resource itself (administration)."""

    resource: Resource
    actions: frozenset[Action]
    or_cluster: bool = False

    def describe(self) -> str:
        either = " or ".join(sorted(a.value for a in self.actions))
        cluster = " (or on Cluster)" if self.or_cluster else ""
        return f"{either} on {self.resource}{cluster}"


def need(resource: Resource, *actions: Action, or_cluster: bool = False) -> Need:
    return Need(resource, frozenset(actions), or_cluster)


def _as_group(resource: Resource, action: Action) -> tuple[Resource, Action]:
    """A retry or dead-letter topic is decided as its group, Pub counted as Sub (module docstring)."""
    if resource.kind is Kind.TOPIC:
        for prefix in (RETRY_PREFIX, DLQ_PREFIX):
            if resource.name.startswith(prefix) and len(resource.name) > len(prefix):
                return group(resource.name[len(prefix) :]), Action.SUB if action is Action.PUB else action
    return resource, action


def decide(entries: Sequence[Entry], resource: Resource, action: Action,
           source: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> Decision | None:
    """The decision of the most specific matching entries (Deny wins a tie); None when nothing matches."""
    resource, action = _as_group(resource, action)
    best: tuple[int, int] | None = None
    verdict: Decision | None = None
    for e in entries:
        if not (e.covers(action) and e.pattern.matches(resource) and e.holds_for(source)):
            continue
        s = e.pattern.specificity()
        if best is None or s > best:
            best, verdict = s, e.decision
        elif s == best and e.decision is Decision.DENY:
            verdict = Decision.DENY
    return verdict


def allows(entries: Sequence[Entry], n: Need, source: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> bool:
    """True when ``entries`` grant ``n`` to a caller from ``source`` (module docstring for the rules)."""
    for action in n.actions:
        verdict = decide(entries, n.resource, action, source)
        if verdict is None and n.or_cluster:
            verdict = decide(entries, CLUSTER, action, source)
        if verdict is Decision.ALLOW:
            return True
    return False
