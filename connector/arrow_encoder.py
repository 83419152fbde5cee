"""Arrow record batches -> commit-log entries, the sink's hot path.

Each row becomes one entry in the commit-log format (``broker.format.message.encode_entry``) so that a task can hand a
whole buffer to ``SendBatch`` and the broker stores it with one copy. Columns:

    body          binary or string, required, never null
    topic         string, optional (else the ``topic`` option)
    tags          string, optional
    keys          array<string> or a space-separated string, optional
    properties    map<string,string>, optional
    sharding_key  string, optional: rows with the same key go to the same queue, in order
    queue_id      int, optional: an explicit queue of the one broker (wins over sharding_key); not in a cluster,
                  where a queue id names no queue without its broker (a sharding key keeps rows in order there)

Queues: with one broker, ``queue_count(topic)`` queues; in a cluster, ``queues(topic)``, the topic's writable queues
over every broker in route order (as the producer sees them: a sharding key picks ``hash % len`` of that list, so it
lands where ``Producer.send(sharding_key=...)`` puts it). A chunk holds one broker's entries (one SendBatch goes to
one broker).

Unknown columns are an error naming them unless ``ignore_extra_columns`` is set.

Rows are encoded for their real topics whatever the delivery guarantee: an exactly-once writer names its
transaction and attempt in the call, and the broker stores the rows in place (broker/semantics/txn_in_place.py).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from broker.client.route import DIRECT_BROKER, MessageQueue
from broker.errors import InvalidArgumentError, MessageIllegalError
from broker.format.message import (
    DEFAULT_MAX_MESSAGE_SIZE,
    Prop,
    encode_entry,
    encode_properties,
    java_string_hash,
    validate_topic,
)

KNOWN_COLUMNS = ("body", "topic", "tags", "keys", "properties", "sharding_key", "queue_id")


def check_columns(
    names: Sequence[str], ignore_extra_columns: bool, topic_option: str | None = "", *, cluster: bool = False
) -> None:
    """Fail at query start, naming the columns that are wrong. ``topic_option``: the sink's topic option (None:
    not set, then every row needs a 'topic' column). ``cluster``: the sink writes to a cluster (option namesrv)."""
    if cluster and "queue_id" in names:
        raise MessageIllegalError(
            "column 'queue_id' names a queue of one broker; in a cluster (option 'namesrv') the queues of every "
            "broker share the rows: drop the column, or give a 'sharding_key' to keep rows of one key in order"
        )
    if "body" not in names:
        raise MessageIllegalError(f"the sink needs a 'body' column (binary or string); the DataFrame has {list(names)}")
    if topic_option is None and "topic" not in names:
        raise MessageIllegalError(
            "no topic to write to: set the 'topic' option or give the DataFrame a 'topic' column "
            f"(its columns: {list(names)})"
        )
    extra = [n for n in names if n not in KNOWN_COLUMNS]
    if extra and not ignore_extra_columns:
        raise MessageIllegalError(
            f"unknown column(s) {extra} for the sluice sink; expected some of {list(KNOWN_COLUMNS)}. "
            "Drop them or set ignoreExtraColumns=true"
        )


@dataclass
class EncodedChunk:
    """A run of entries ready for one SendBatch call to one broker."""

    buffer: bytes
    count: int
    topics: dict[str, int] = field(default_factory=dict)  # messages per topic, for the commit message
    broker: str = DIRECT_BROKER  # the broker whose queues the entries name


@dataclass
class _PendingChunk:
    """One broker's entries not yet yielded."""

    parts: list[bytes] = field(default_factory=list)
    size: int = 0
    topics: dict[str, int] = field(default_factory=dict)

    def take(self, broker: str) -> EncodedChunk:
        chunk = EncodedChunk(b"".join(self.parts), len(self.parts), self.topics, broker)
        self.parts, self.size, self.topics = [], 0, {}
        return chunk


@dataclass
class RowEncoder:
    """Encodes rows. A topic's queues (asked once per topic): ``queue_count(topic)`` of one broker, or ``queues(topic)``
    over a cluster's brokers; give one of the two."""

    default_topic: str | None
    queue_count: Callable[[str], int] | None = None
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    batch_messages: int = 4096
    batch_bytes: int = 4 * 1024 * 1024
    queues: Callable[[str], Sequence[MessageQueue]] | None = None
    # Rows without a queue or key go round-robin from a random queue (RocketMQ's producer): a query of many small
    # tasks would otherwise put every task's first rows in the same queues. Given: where the round-robin starts.
    round_robin: int = field(default_factory=lambda: random.randrange(1 << 30))
    _queues: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # topic -> its (broker, queue id)s
    _topic_bytes: dict[str, bytes] = field(default_factory=dict)

    def _topic(self, name: str | None, row: int) -> tuple[str, bytes]:
        topic = name or self.default_topic
        if not topic:
            raise MessageIllegalError(f"row {row} has no topic: set the 'topic' option or fill the 'topic' column")
        raw = self._topic_bytes.get(topic)
        if raw is None:
            raw = self._topic_bytes[topic] = validate_topic(topic)
            self._queues[topic] = self._topic_queues(topic)
        return topic, raw

    def _topic_queues(self, topic: str) -> list[tuple[str, int]]:
        if self.queues is not None:
            found = [(mq.broker_name, mq.queue_id) for mq in self.queues(topic)]
            if not found:
                raise MessageIllegalError(f"topic {topic!r} has no writable queue on any broker")
            return found
        if self.queue_count is None:
            raise InvalidArgumentError("a RowEncoder needs queue_count (one broker) or queues (a cluster)")
        return [(DIRECT_BROKER, q) for q in range(max(1, self.queue_count(topic)))]

    def _queue(self, topic: str, queue_id: int | None, sharding_key: str | None) -> tuple[str, int]:
        queues = self._queues[topic]
        n = len(queues)
        if queue_id is not None:
            if self.queues is not None:
                raise MessageIllegalError("queue_id names no queue in a cluster; give a sharding_key instead")
            if not 0 <= queue_id < n:
                raise MessageIllegalError(f"queue_id {queue_id} is outside topic {topic!r}'s queues 0..{n - 1}")
            return queues[queue_id]
        if sharding_key is not None:
            return queues[abs(java_string_hash(sharding_key)) % n]
        self.round_robin += 1
        return queues[self.round_robin % n]

    def encode(self, batch: pa.RecordBatch, first_row: int = 0) -> Iterator[EncodedChunk]:
        """Yield chunks of at most ``batch_messages`` entries and ``batch_bytes`` bytes (an entry larger than that
        goes alone: the broker names it); the row number is in every error."""
        cols = {name: batch.column(i).to_pylist() for i, name in enumerate(batch.schema.names)
                if name in KNOWN_COLUMNS}  # ignored extra columns are never made Python objects
        bodies = cols["body"]
        n = len(bodies)
        none: list[None] = [None] * n
        topics, tags, keys = cols.get("topic", none), cols.get("tags", none), cols.get("keys", none)
        props, shard, qids = cols.get("properties", none), cols.get("sharding_key", none), cols.get("queue_id", none)
        born = int(time.time() * 1000)
        pending: dict[str, _PendingChunk] = {}  # per broker
        for i in range(n):
            row = first_row + i
            body = bodies[i]
            if body is None:
                raise MessageIllegalError(f"row {row}: body is null; every message needs a body")
            if isinstance(body, str):
                body = body.encode("utf-8")
            topic, topic_raw = self._topic(topics[i], row)
            try:
                # Only rows with properties, tags or keys of their own need their properties built and encoded.
                own = self._properties(props[i], tags[i], keys[i]) if props[i] or tags[i] or keys[i] else None
                broker, queue_id = self._queue(topic, qids[i], shard[i])
                raw_props = b"" if own is None else encode_properties(own)
                entry = encode_entry(
                    topic_raw, queue_id, body, raw_props, born_timestamp=born, max_message_size=self.max_message_size
                )
            except MessageIllegalError as e:
                raise MessageIllegalError(f"row {row}: {e.message}") from None
            p = pending.get(broker)
            if p is None:
                p = pending[broker] = _PendingChunk()
            if p.parts and p.size + len(entry) > self.batch_bytes:  # never past the bound: the broker refuses that
                yield p.take(broker)
            p.parts.append(entry)
            p.size += len(entry)
            p.topics[topic] = p.topics.get(topic, 0) + 1
            if len(p.parts) >= self.batch_messages:
                yield p.take(broker)
        for broker, p in pending.items():
            if p.parts:
                yield p.take(broker)

    def _properties(self, props: object, tags: str | None, keys: object) -> dict[str, str]:
        out: dict[str, str] = {}
        if props:
            # Arrow gives a map<string,string> as a list of (key, value) pairs.
            pairs: Iterable[Any] = props.items() if isinstance(props, dict) else props  # type: ignore[assignment]
            for k, v in pairs:
                if v is not None:
                    out[str(k)] = str(v)
        if tags:
            out[Prop.TAGS] = tags
        if isinstance(keys, str):
            if keys:
                out[Prop.KEYS] = keys
        elif keys:
            keys = [str(k) for k in keys if k]  # type: ignore[attr-defined]
            spaced = [k for k in keys if " " in k]
            if spaced:  # KEYS is one space-separated property: such a key would come back as several
                raise MessageIllegalError(
                    f"key {spaced[0]!r} contains a space; message keys are stored space-separated, so replace "
                    "the spaces (or pass 'keys' as one space-separated string)"
                )
            joined = " ".join(keys)
            if joined:
                out[Prop.KEYS] = joined
        return out
