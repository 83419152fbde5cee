"""Child process of the delay crash test: keeps sending delayed messages while the timers deliver; killed at random.

Usage: python delay_crash_child.py STORE_DIR LEVELS PREFIX CONFIG_JSON
Prints "ACK <n>" after message n (body PREFIX:n) was stored, so the parent knows what was acknowledged.
"""

from __future__ import annotations

import json
import os
import sys
import time

from broker.format.message import Prop
from broker.semantics.delay import ScheduleMessageService
from broker.store import MessageStore, StoreConfig


def main() -> None:
    store_dir, levels, prefix, overrides = sys.argv[1:5]
    store = MessageStore(StoreConfig(store_path=store_dir, **json.loads(overrides)))
    store.start()
    sched = ScheduleMessageService(store, os.path.join(store_dir, "config"), levels)
    sched.start()
    n_levels = len(levels.split())
    for n in range(100_000):
        props = {Prop.DELAY: str(n % n_levels + 1), "n": str(n)}
        res = sched.put_message("Late", n % 3, f"{prefix}:{n}".encode(), props)
        assert res.ok, res.error
        print(f"ACK {n}", flush=True)
        time.sleep(0.002)


if __name__ == "__main__":
    main()
