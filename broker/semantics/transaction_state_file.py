"""The transaction service's state file: where the next start-up scans the half and op queues from, the
check-back counts, and the log end it was saved at.

Apart because it is read before anything else exists (a log cut back since it was saved moves the
positions back before the service appends anything) and holds no transaction."""

from __future__ import annotations

import logging
from typing import Any

from broker.errors import CorruptionError
from broker.format.system_topics import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from broker.ha.metadata_sync import LOG_END_KEY
from broker.json_file import load_json, write_json_atomic
from broker.store import MessageStore

log = logging.getLogger(__name__)

STATE_FILE = "transactionState.json"


def cut_back_state(path: str, store: MessageStore) -> None:
    """The state file names the log end it was saved at; a log that ends before it now was cut back (a
    replica truncated to where it agrees with its new master, or an ASYNC_FLUSH log that lost its unflushed
    tail in a crash). Scan starts past a queue's end would pass over the halves and decisions that take those
    offsets next: each comes down to its queue's end here, at start-up, before anything is appended (once the
    queues have grown again, recover() would skip them). An unreadable file is left to recover(), which
    reports it."""
    try:
        data = load_json(path, dict)
    except CorruptionError:
        return
    log_now = store.max_phys_offset()
    log_end = None if data is None else data.get(LOG_END_KEY)
    if data is None or not isinstance(log_end, int) or log_end <= log_now:
        return
    for key, topic in (("halfScanFrom", TRANS_HALF_TOPIC), ("opScanFrom", TRANS_OP_HALF_TOPIC)):
        start, end = data.get(key, 0), store.queue_end(topic, 0)
        if isinstance(start, int) and start > end:
            log.warning("%s: %s %d is past the queue end %d (saved at commit-log offset %d, the log ends at "
                        "%d): moving back", path, key, start, end, log_end, log_now)
            data[key] = end
    data[LOG_END_KEY] = log_now
    write_json_atomic(path, data)


def parse_checker_state(state: dict[str, Any]) -> tuple[int, int, dict[str, int]]:
    """``{"halfScanFrom": n, "opScanFrom": n, "checkTimes": {transaction id: n}}``; ValueError etc. if not."""
    checks = {str(tid): int(times) for tid, times in dict(state.get("checkTimes") or {}).items()}
    return int(state.get("halfScanFrom", 0)), int(state.get("opScanFrom", 0)), checks
