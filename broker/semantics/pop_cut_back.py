"""A pop snapshot saved at a log end past this replica's log end is not used as it is.

``popState.json`` (pop_log.py) is the book as of a queue offset of the pop journal topic, with the commit-log end
it was saved at (``log_end``). A replica whose log now ends before that was cut back: truncated to where it agrees
with a new master (its own snapshot, written while it was master, or a copy of one, can cover records the new master
never had), or an ASYNC_FLUSH log that lost its unflushed tail in a crash. The snapshot's book then holds changes
whose records are gone, and its position names a queue offset the journal reaches again with other records (the new
master's): a promotion that took it would skip those records. Skipped, a record that received messages and a later
one that moved the queue's next offset past them leave those messages neither in flight nor acked: never delivered
again. (The transaction checker's state is cut back the same way: transaction_state_file.py.)

So at start-up, before anything is appended (once the journal grows again the cut can no longer be told), such a
snapshot keeps only its handle secret and highest sequence: a promotion replays the journal from its start, which
is this log's own record of every change (from its first record still held: a journal whose start expired, after
72 h without a snapshot reaching this replica, is reported by the replay). The master's next snapshot replaces it
when it reaches this replica.
"""

from __future__ import annotations

import logging
from typing import Any

from broker.errors import CorruptionError
from broker.ha.metadata_sync import LOG_END_KEY
from broker.json_file import load_json, write_json_atomic

log = logging.getLogger(__name__)


def cut_back(path: str, log_now: int) -> None:
    """Rewrite the snapshot at ``path`` without its book when it was saved at a log end past ``log_now``."""
    try:
        data: dict[str, Any] | None = load_json(path, dict)
    except CorruptionError:
        return  # recover() reports it
    log_end = None if data is None else data.get(LOG_END_KEY)
    if data is None or not isinstance(log_end, int) or log_end <= log_now:
        return
    state = data.get("state")
    seq = state.get("seq", 0) if isinstance(state, dict) else 0
    log.warning("%s: saved at commit-log offset %d, the log ends at %d (cut back); its book is dropped and a "
                "promotion replays the pop journal from its start", path, log_end, log_now)
    write_json_atomic(path, {"next": 0, "secret": data.get("secret", ""), "state": {"seq": seq},
                             LOG_END_KEY: log_now}, mode=0o600, backup=False)
