"""Child process of the in-place transaction crash test: write rows in place under two attempts, then commit
keeping one of them; killed anywhere along the way.

Usage: python in_place_crash_child.py STORE_DIR TXN_ID TOPIC COUNT CONFIG_JSON
Prints PUT (every row stored), COMMITTING (end_transaction starts) and DONE, each on its own line.
"""

from __future__ import annotations

import sys

from txn_crash_child import commit_and_wait, start_transactions

from broker.client.outgoing_message import Message, encode_message

BATCH = 2000
QUEUES = 4
KEPT, DROPPED = "task-0.1", "task-0.0"  # a task attempt's retry, and the failed attempt the commit leaves out


def main() -> None:
    store_dir, txn_id, topic, count, overrides = sys.argv[1:6]
    tx = start_transactions(store_dir, overrides)
    n = int(count)
    for attempt in (DROPPED, KEPT):
        for first in range(0, n, BATCH):
            ids = range(first, min(n, first + BATCH))
            buf = b"".join(
                encode_message(Message(topic, b"%s:%s:%06d" % (txn_id.encode(), attempt.encode(), i)), i % QUEUES)
                for i in ids
            )
            res = tx.put_in_place(buf, "spark", txn_id, attempt=attempt)
            assert res.ok, res.error
    commit_and_wait(tx, txn_id, n, committed_attempts=[KEPT], expected_messages=n)


if __name__ == "__main__":
    main()
