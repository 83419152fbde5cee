"""Pre-encoded SendBatch buffers as a Producer sends them, for the benchmarks that time the broker alone.

Why: the throughput benchmarks (server, cluster, replication, security) send batches encoded once, so that the
client's encoding is not timed; but ``Producer.send_batch`` gives every message its own UNIQ_KEY property (a
32-character client id), and the broker indexes each one (the index file a send by key or id is found through).
A batch encoded without it skips that work and the 44 bytes it adds to every entry, which no real producer's
messages skip. Here each message gets its own key, as the Producer makes them (``UniqKeys``), through the
Producer's own encoder (``encode_messages``).

A benchmark sends the same few buffers again and again, so a key comes back once every ``len(buffers) * count``
messages. The broker's work per key does not depend on it: a send that is not a retry is stored and indexed
whether or not its key was seen before (only a retried send is answered from the key: broker/server/send_dedup.py).
"""

from __future__ import annotations

import time

from broker.client import Message
from broker.client.outgoing_message import encode_messages
from broker.client.producer import UniqKeys


def producer_batch(topic: str, body: bytes, queue_id: int, count: int, *, tags: str | None = None,
                   keys: UniqKeys | None = None) -> bytes:
    """``count`` messages of ``body`` for ``queue_id``, each with its own UNIQ_KEY (from ``keys``, a fresh
    producer's when None), encoded as ``Producer.send_batch`` encodes them: one buffer for ``send_encoded``."""
    keys = keys or UniqKeys()
    message = Message(topic, body, tags=tags)
    born_ms = int(time.time() * 1000)
    return b"".join(encode_messages([message] * count, [queue_id] * count, born_ms, keys.take(count)))


def producer_batches(topic: str, body: bytes, queues: int, count: int, *, tags: str | None = None) -> list[bytes]:
    """One ``producer_batch`` for each queue ``0 .. queues - 1``, their keys from one producer's sequence."""
    keys = UniqKeys()
    return [producer_batch(topic, body, q, count, tags=tags, keys=keys) for q in range(queues)]
