"""The Spark offset of the sluice source: the next consume-queue offset of every queue it reads.

Spark stores it in the checkpoint as JSON, ``{"<topic>": {"<broker>:<queueId>": n}}``. Inside the connector an
offset is a ``{(topic, broker, queue_id): n}`` map, one entry per Spark partition of the source.

* One broker (option ``endpoints``): the broker's name in the keys is the ``brokerName`` option (``broker-a`` by
  default), and a checkpointed offset naming another broker is refused (a checkpoint of another broker).
* A cluster (option ``namesrv``): each key names the broker group that holds the queue, as the name servers list
  it. A checkpoint of a one-broker query whose broker joins a cluster under its ``brokerName`` reads on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from connector.connector_errors import SourceOptionError

QueueKey = tuple[str, str, int]  # (topic, broker name, queue id)


@dataclass(frozen=True, slots=True)
class SourceOffset:
    positions: Mapping[QueueKey, int]

    def to_json(self) -> dict[str, dict[str, int]]:
        """The JSON-able dict Spark checkpoints; topics and queues sorted so equal offsets serialise equally."""
        out: dict[str, dict[str, int]] = {}
        for (topic, broker, qid), off in sorted(self.positions.items()):
            assert off >= 0, (topic, broker, qid, off)
            out.setdefault(topic, {})[queue_key(broker, qid)] = off
        return out

    @classmethod
    def from_json(cls, broker: str | None, data: Mapping[str, Mapping[str, int]]) -> SourceOffset:
        """``broker``: the one broker every key must name; None in a cluster (any broker)."""
        return cls(parse_positions(broker, data, what="offset"))

    def topics(self) -> set[str]:
        return {t for t, _, _ in self.positions}


def is_decimal(text: str) -> bool:
    """ASCII digits only: str.isdigit also admits '²', which int() refuses, and '٣', which int() reads as 3."""
    return text.isascii() and text.isdigit()


def queue_key(broker: str, queue_id: int) -> str:
    return f"{broker}:{queue_id}"


def describe(key: QueueKey) -> str:
    """``topic/broker:queue``, as errors name a queue."""
    topic, broker, qid = key
    return f"{topic}/{queue_key(broker, qid)}"


def parse_positions(broker: str | None, data: Mapping[str, Mapping[str, int]], *, what: str) -> dict[QueueKey, int]:
    """``{(topic, broker, qid): n}`` from offset JSON. With ``broker`` (one broker: the ``brokerName`` option) every
    key must name it; with None (a cluster) any broker name."""
    out: dict[QueueKey, int] = {}
    for topic, queues in data.items():
        for key, off in queues.items():
            name, _, qid = str(key).rpartition(":")
            if (broker is not None and name != broker) or not name or not is_decimal(qid):
                expected = repr(broker) if broker is not None else "a broker"
                raise SourceOptionError(
                    f"{what} key {topic}/{key!r} does not name {expected} as '<broker>:<queueId>'"
                    + ("; set option 'brokerName' to the name the offsets were written with" if broker else "")
                )
            k = (topic, name, int(qid))
            if k in out:  # "broker:0" and "broker:00": which one was meant?
                queue = int(qid) if broker is not None else queue_key(name, int(qid))
                raise SourceOptionError(f"{what}: topic {topic!r} names queue {queue} twice; give each queue once")
            out[k] = int(off)
    return out

