"""The JSON bodies of ``mqadmin``'s codes, byte for byte as RocketMQ's classes serialize with fastjson: fields
sorted by name, nulls left out, ``Set`` as arrays, enums by name, and a ``Map`` whose key is an object
(``MessageQueue``) written with that object as the key, ``{{"brokerName":"b","queueId":0,"topic":"T"}:{...}}``
(not JSON; fastjson, which every Java client and ``mqadmin`` read these with, parses it).

========================= ===== ==========================================================================
class                      code  fields
========================= ===== ==========================================================================
TopicStatsTable            202   offsetTable {MessageQueue: TopicOffset{lastUpdateTimestamp, maxOffset,
                                 minOffset}}
ConsumeStats               208   consumeTps (double), offsetTable {MessageQueue: OffsetWrapper{brokerOffset,
                                 consumerOffset, lastTimestamp}}
ConsumerConnection         203   connectionSet [Connection{clientAddr, clientId, language, version}],
                                 consumeFromWhere, consumeType, messageModel, subscriptionTable
                                 {topic: SubscriptionData}
KVTable                    28    table {name: value}, every value a string
ResetOffsetBody            222   offsetTable {MessageQueue: offset}
========================= ===== ==========================================================================
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from broker.remoting import fastjson

# SubscriptionData.SUB_ALL: the expression of "every tag", whose tag and code sets are empty
SUB_ALL = "*"


@dataclass(frozen=True)
class Queue:
    """RocketMQ's MessageQueue."""

    topic: str
    broker_name: str
    queue_id: int

    def json(self) -> str:
        return _text({"brokerName": self.broker_name, "queueId": self.queue_id, "topic": self.topic})


def _text(value: Any) -> str:
    return fastjson.dumps(value, standard=True).decode("utf-8")


def _queue_map(entries: Iterable[tuple[Queue, Any]]) -> str:
    return "{" + ",".join(f"{q.json()}:{_text(v)}" for q, v in entries) + "}"


def topic_stats_table(queues: Iterable[tuple[Queue, int, int, int]]) -> bytes:
    """(queue, min offset, max offset, last update ms) per queue."""
    offsets = ((q, {"lastUpdateTimestamp": ts, "maxOffset": hi, "minOffset": lo}) for q, lo, hi, ts in queues)
    return ('{"offsetTable":' + _queue_map(offsets) + "}").encode("utf-8")


def consume_stats(queues: Iterable[tuple[Queue, int, int, int]], consume_tps: float = 0.0) -> bytes:
    """(queue, broker offset, consumer offset, last timestamp) per queue."""
    offsets = ((q, {"brokerOffset": b, "consumerOffset": c, "lastTimestamp": ts}) for q, b, c, ts in queues)
    return ('{"consumeTps":' + _text(float(consume_tps)) + ',"offsetTable":' + _queue_map(offsets) + "}").encode()


def reset_offset_body(offsets: Iterable[tuple[Queue, int]]) -> bytes:
    return ('{"offsetTable":' + _queue_map(offsets) + "}").encode("utf-8")


def kv_table(table: Mapping[str, str]) -> bytes:
    return fastjson.dumps({"table": dict(table)}, standard=True)


def java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units, as an int32): SubscriptionData's ``codeSet``."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def subscription_data(topic: str, expression: str, expression_type: str = "TAG", sub_version: int = 0
                      ) -> dict[str, Any]:
    """SubscriptionData of a tag expression ("*" or "TagA || TagB"); an SQL92 one has no tag sets."""
    expression = expression.strip() or SUB_ALL
    tags: list[str] = []
    if expression_type == "TAG" and expression != SUB_ALL:
        for tag in (t.strip() for t in expression.split("||")):
            if tag and tag not in tags:
                tags.append(tag)
    return {"classFilterMode": False, "codeSet": [java_hash(t) for t in tags], "expressionType": expression_type,
            "subString": expression, "subVersion": sub_version, "tagsSet": tags, "topic": topic}


@dataclass(frozen=True)
class ClientConnection:
    client_id: str
    client_addr: str
    language: str = "OTHER"
    version: int = 0


def consumer_connection(connections: Iterable[ClientConnection], subscriptions: Mapping[str, str], *, model: str,
                        consume_type: str, consume_from_where: str) -> bytes:
    body = {
        "connectionSet": [
            {"clientAddr": c.client_addr, "clientId": c.client_id, "language": c.language, "version": c.version}
            for c in connections
        ],
        "consumeFromWhere": consume_from_where,
        "consumeType": consume_type,
        "messageModel": model,
        "subscriptionTable": {t: subscription_data(t, e) for t, e in sorted(subscriptions.items())},
    }
    return fastjson.dumps(body, standard=True)
