"""Child process for test_crash.py: appends with SYNC_FLUSH and prints each acknowledged message.

Usage: python crash_child.py STORE_DIR SEED FIRST_ID. Prints "ready", then one line "QUEUE_ID QUEUE_OFFSET BODY_ID"
per message as soon as its put returned PUT_OK, until it is killed.
"""

from __future__ import annotations

import random
import sys

from broker.format.message import encode_entry, encode_properties
from broker.store import MessageStore, PutStatus, StoreConfig

CRASH_CONFIG = dict(
    mapped_file_size_commit_log=64 * 1024,
    mapped_file_size_consume_queue=50 * 20,
    max_hash_slot_num=64,
    max_index_num=500,
    max_message_size=4096,
    max_batch_bytes=32 * 1024,
    flush_disk_type="SYNC_FLUSH",
    flush_interval_consume_queue_ms=50,
)
TOPIC = "Crash"
QUEUES = 3


def body(body_id: int, rng: random.Random) -> bytes:
    return b"id:%d:" % body_id + bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))


def main() -> None:
    path, seed, next_id = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    store = MessageStore(StoreConfig(store_path=path, **CRASH_CONFIG))  # type: ignore[arg-type]
    store.start()
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    while True:
        qid = rng.randrange(QUEUES)
        if rng.random() < 0.3:
            # small batches take the entry-by-entry path, more than 32 entries the vectorised one
            count = rng.randrange(1, 20) if rng.random() < 0.5 else rng.randrange(33, 60)
            ids = list(range(next_id, next_id + count))
            buf = b"".join(
                encode_entry(TOPIC.encode(), qid, body(i, rng), encode_properties({"KEYS": f"k{i}"})) for i in ids
            )
            r = store.put_batch(buf)
        else:
            ids = [next_id]
            r = store.put_message(TOPIC, qid, body(next_id, rng), {"KEYS": f"k{next_id}"})
        next_id += len(ids)
        if r.status is not PutStatus.PUT_OK:
            raise SystemExit(f"put failed: {r.status} {r.error}")
        out.write("".join(f"{qid} {q} {i}\n" for q, i in zip(r.queue_offsets, ids, strict=True)))
        out.flush()


if __name__ == "__main__":
    main()
