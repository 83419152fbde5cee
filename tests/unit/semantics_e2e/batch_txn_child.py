"""Child process of the batch-transaction tests: sends its share of half messages under one transaction id.

Usage: python batch_txn_child.py ENDPOINT TXN_ID WORKER COUNT BATCH TOPIC
Bodies are ``WORKER:i``; queues round-robin over 8.
"""

from __future__ import annotations

import sys

from broker.client import Message, Producer, encode_message


def main() -> int:
    endpoint, txn_id, worker, count, batch, topic = sys.argv[1:7]
    n, size = int(count), int(batch)
    with Producer(endpoint, group="spark-like-writer") as producer:
        for start in range(0, n, size):
            entries = [
                encode_message(Message(topic, f"{worker}:{i}".encode(), properties={"w": worker}), i % 8, 1)
                for i in range(start, min(n, start + size))
            ]
            results = producer.send_encoded(b"".join(entries), len(entries), transaction_id=txn_id)
            assert len(results) == len(entries)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
