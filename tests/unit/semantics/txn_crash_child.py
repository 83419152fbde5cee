"""Child process of the batch-transaction crash test: put N halves under one id, then commit; killed mid-way.

Usage: python txn_crash_child.py STORE_DIR TXN_ID TOPIC COUNT CONFIG_JSON
Prints PUT (halves stored), COMMITTING (end_transaction starts) and DONE, each on its own line.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from broker.format.transaction_codec import encode_half_entry
from broker.semantics.transaction import TransactionService
from broker.store import MessageStore, StoreConfig

BATCH = 1000


def start_transactions(store_dir: str, overrides: str) -> TransactionService:
    """The store in ``store_dir`` (with CONFIG_JSON's settings) and its transaction service, started."""
    store = MessageStore(StoreConfig(store_path=store_dir, **json.loads(overrides)))
    store.start()
    tx = TransactionService(store, os.path.join(store_dir, "config"))
    tx.start()
    return tx


def commit_and_wait(tx: TransactionService, txn_id: str, n: int, **end: Any) -> None:
    """Say PUT, then COMMITTING, commit ``txn_id`` (its ``n`` messages; ``end``: end_transaction's other arguments),
    say DONE and wait to be killed: the test's kill lands between two of these lines or after the last."""
    print("PUT", flush=True)
    print("COMMITTING", flush=True)
    out = tx.end_transaction(txn_id, commit=True, **end)
    assert out.complete and out.restored == n, out
    print("DONE", flush=True)
    time.sleep(3600)  # no clean shutdown ever


def main() -> None:
    store_dir, txn_id, topic, count, overrides = sys.argv[1:6]
    tx = start_transactions(store_dir, overrides)
    n = int(count)
    for first in range(0, n, BATCH):
        ids = range(first, min(n, first + BATCH))
        buf = b"".join(
            encode_half_entry(topic, i % 4, b"%s:%06d" % (txn_id.encode(), i), {}, "spark", txn_id) for i in ids
        )
        res = tx.put_half_batch(buf, "spark", txn_id)
        assert res.ok, res.error
    commit_and_wait(tx, txn_id, n)


if __name__ == "__main__":
    main()
