"""The Spark offset of the sluice source: the next consume-queue offset of every queue it reads.

Spark stores it in the checkpoint as JSON, ``{"<topic>": {"<broker>:<queueId>": n}}``. The broker's name is part of
each key so that a cluster of brokers can be added later without breaking existing checkpoints; today one query
reads one broker, so inside the connector an offset is a plain ``{(topic, queue_id): n}`` map and the broker name is
checked when a checkpointed offset is read back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from connector.errors import SourceOptionError

QueueKey = tuple[str, int]  # (topic, queue id)


@dataclass(frozen=True, slots=True)
class SourceOffset:
    broker: str
    positions: Mapping[QueueKey, int]

    def to_json(self) -> dict[str, dict[str, int]]:
        """The JSON-able dict Spark checkpoints; topics and queues sorted so equal offsets serialise equally."""
        out: dict[str, dict[str, int]] = {}
        for (topic, qid), off in sorted(self.positions.items()):
            assert off >= 0, (topic, qid, off)
            out.setdefault(topic, {})[queue_key(self.broker, qid)] = off
        return out

    @classmethod
    def from_json(cls, broker: str, data: Mapping[str, Mapping[str, int]]) -> SourceOffset:
        return cls(broker, parse_positions(broker, data, what="offset"))

    def topics(self) -> set[str]:
        return {t for t, _ in self.positions}


def is_decimal(text: str) -> bool:
    """ASCII digits only: str.isdigit also admits '²' (which int() refuses) and '٣' (which int() reads as 3)."""
    return text.isascii() and text.isdigit()


def queue_key(broker: str, queue_id: int) -> str:
    return f"{broker}:{queue_id}"


def parse_positions(broker: str, data: Mapping[str, Mapping[str, int]], *, what: str) -> dict[QueueKey, int]:
    """``{(topic, qid): n}`` from offset JSON; every key must name ``broker`` (the ``brokerName`` option)."""
    out: dict[QueueKey, int] = {}
    for topic, queues in data.items():
        for key, off in queues.items():
            name, _, qid = str(key).rpartition(":")
            if name != broker or not is_decimal(qid):
                raise SourceOptionError(
                    f"{what} key {topic}/{key!r} does not name broker {broker!r} as '{broker}:<queueId>'; "
                    "set option 'brokerName' to the name the offsets were written with"
                )
            if (topic, int(qid)) in out:  # "broker:0" and "broker:00": which one was meant?
                raise SourceOptionError(f"{what}: topic {topic!r} names queue {int(qid)} twice; give each queue once")
            out[(topic, int(qid))] = int(off)
    return out


def by_topic(keys: Iterable[QueueKey]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for topic, qid in sorted(keys):
        out.setdefault(topic, []).append(qid)
    return out
