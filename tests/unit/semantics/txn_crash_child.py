"""Child process of the batch-transaction crash test: put N halves under one id, then commit; killed mid-way.

Usage: python txn_crash_child.py STORE_DIR TXN_ID TOPIC COUNT CONFIG_JSON
Prints PUT (halves stored), COMMITTING (end_transaction starts) and DONE, each on its own line.
"""

from __future__ import annotations

import json
import os
import sys
import time

from broker.format.transaction_codec import encode_half_entry
from broker.semantics.transaction import TransactionService
from broker.store import MessageStore, StoreConfig

BATCH = 1000


def main() -> None:
    store_dir, txn_id, topic, count, overrides = sys.argv[1:6]
    store = MessageStore(StoreConfig(store_path=store_dir, **json.loads(overrides)))
    store.start()
    tx = TransactionService(store, os.path.join(store_dir, "config"))
    tx.start()
    n = int(count)
    for first in range(0, n, BATCH):
        ids = range(first, min(n, first + BATCH))
        buf = b"".join(
            encode_half_entry(topic, i % 4, b"%s:%06d" % (txn_id.encode(), i), {}, "spark", txn_id) for i in ids
        )
        res = tx.put_half_batch(buf, "spark", txn_id)
        assert res.ok, res.error
    print("PUT", flush=True)
    print("COMMITTING", flush=True)
    out = tx.end_transaction(txn_id, commit=True)
    assert out.complete and out.restored == n, out
    print("DONE", flush=True)
    time.sleep(3600)  # wait to be killed: no clean shutdown ever


if __name__ == "__main__":
    main()
