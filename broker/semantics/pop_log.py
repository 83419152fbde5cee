"""The pop bookkeeping of a replicated broker group, kept in the replicated commit log so it survives a failover.

What must survive. A pop consumer is promised three things by the master that answered it: a message it acked is
not delivered again; a message it received stays invisible until the time it was told; a receipt handle it holds
is accepted (for an ack or a change of invisible time) while that delivery is current. A standalone broker keeps
its ``PopBook`` changes in a journal file of its own (journal.py, ``config/pop/``); in a replicated group that
file is the master's alone, so a promoted slave knew only the group's consume offsets and delivered acked and
in-flight messages again at once.

Why the commit log. Each book change is one JSON record (pop_book.py declares it) stored as a message of the
system topic ``SLUICE_SYS_POP_JOURNAL_TOPIC`` (queue 0), as RocketMQ stores its pop checkpoints and acks as messages
of its REVIVE topics. Replication already carries every byte of the log, in order, to every in-sync replica, with
the acknowledgement rules of a message (broker/ha/gate.py): the pop service answers a receive, an ack or a change
of invisible time only once every in-sync replica holds its records (``settle``), and refuses before changing
anything while fewer than ``min_insync_replicas`` are in sync (``admit``). So what a consumer was told has the same
promise as a message it was told is stored, and no second channel, with its own ordering, acknowledgement and
fencing, is needed. A new stream next to the log would have to answer again every question replication already
answers (which replica is ahead, what a returning replica must cut back, what a fenced master may still write).

Snapshot. Replaying the topic from its start at every promotion would grow without bound, and the log expires.
So the master writes the book as of a queue offset of the topic to ``config/popState.json`` (at the first start
and then every ``CHECKPOINT_RECORDS`` records or ``CHECKPOINT_INTERVAL_S``), and the metadata sync
(broker/ha/metadata_sync.py) carries that file to the slaves; like the other progress files it names the log end
its records lie below (``log_end``), and a slave writes a copy only when its own log reaches it. Starting as
master (at promotion, and at a restart after a crash) the service takes the snapshot, then applies every record
of the topic from the snapshot's offset to the queue's end. Records past the read limit are applied too: they are
in this master's log, which the group now follows.

The receipt-handle secret is in the snapshot too (the file is private, mode 0600, as users.json): a handle the
old master issued is accepted by the new one, so a consumer acks across a failover. The first master of a group
keeps its own secret (pop/secret); every later one takes the snapshot's.

What remains. A change whose records did not reach every in-sync replica was not answered (the client got
FLUSH_SLAVE_TIMEOUT or NOT_ENOUGH_REPLICAS) but is in the old master's memory: a receive so refused leaves its
messages invisible on that master until their time; an ack so refused is undone before it is answered
(pop_ack_undo.py: the message is delivered again, at least once). Auto-renewal and attempt ids are in memory only,
as on a restart (pop.py).
A broker that changes from standalone to replicated starts with an empty book (the standalone journal is not read).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from broker.errors import FlushSlaveTimeoutError, ServiceNotAvailableError
from broker.format.system_topics import POP_JOURNAL_TOPIC
from broker.ha.metadata_sync import LOG_END_KEY
from broker.json_file import load_json, write_json_atomic
from broker.semantics.pop_cut_back import cut_back
from broker.semantics.receipt_handle import SECRET_BYTES, load_secret
from broker.store import MessageStore, PutStatus

log = logging.getLogger(__name__)

STATE_FILE = "popState.json"  # in config/: synchronised to the slaves (broker/ha/metadata_sync.py)
# A promoted slave replays at most this many records past its snapshot (some 10k JSON decodes: well under a second)
CHECKPOINT_RECORDS = 10_000
# ... and a snapshot is never older than this while records come, far inside the commit log's retention (72 h)
CHECKPOINT_INTERVAL_S = 60.0
DISPATCH_WAIT_S = 60.0  # how long start-up waits for the dispatcher to index the topic's last records


class PopLog:
    """The journal of a replicated pop service: records in the commit log, the snapshot in ``popState.json``.
    Same calls as journal.Journal, plus ``admit``/``settle`` around each request and ``secret``."""

    def __init__(
        self, store: MessageStore, config_dir: str, folder: str, *, admit: Callable[[], None],
        confirm: Callable[[int], bool],
    ) -> None:
        self.store = store
        self.path = os.path.join(config_dir, STATE_FILE)
        self.folder = folder  # the pop service's own folder: the first master's secret
        self._admit = admit  # NotEnoughReplicasError while the in-sync set is too small
        self._confirm = confirm  # (log end) -> whether every in-sync replica holds the log to there
        self._next = 0  # the topic's next queue offset: the snapshot's position
        self._since = 0  # records since the last snapshot
        self._snapshot_at = time.monotonic()
        self._secret = b""
        self._ends = threading.local()  # per request thread: the end of its last record, for settle()
        cut_back(self.path, store.max_phys_offset())  # at start-up, before anything is appended

    # ------------------------------------------------------------------------------------------ recovery
    def recover(self, restore: Callable[[dict[str, Any] | None], None],
                apply: Callable[[dict[str, Any]], None]) -> None:
        snapshot = load_json(self.path, _parse)
        start, state, secret = snapshot if snapshot is not None else (0, None, b"")
        self._secret = secret or load_secret(self.folder)
        restore(state)
        if not self.store.wait_dispatched(DISPATCH_WAIT_S):
            raise ServiceNotAvailableError(
                f"the store's dispatcher did not reach the commit-log end in {DISPATCH_WAIT_S:.0f} s; pop state is "
                "not recovered"
            )
        cq = self.store.queues.find(POP_JOURNAL_TOPIC, 0)
        applied, end = 0, start
        if cq is not None:
            end = cq.max_offset
            if start > end:  # this replica's log was cut back (truncated to a new master's) below the snapshot
                log.warning("pop journal: the snapshot covers records up to %d, past the log's %d; kept as it is (the "
                            "master's next snapshot replaces it)", start, end)
            if start < cq.min_offset:
                log.error("pop journal: records %d..%d expired before a snapshot covered them; messages received or "
                          "acked then may be delivered again", start, cq.min_offset)
            for offset in range(max(start, cq.min_offset), end):
                unit = cq.unit(offset)
                msg = self.store.lookup_message(unit.commitlog_offset) if unit is not None else None
                if msg is None or msg.topic != POP_JOURNAL_TOPIC:
                    log.error("pop journal: record %d cannot be read; skipped", offset)
                    continue
                try:
                    record = json.loads(msg.body)
                except ValueError as e:  # written by this module: a bug, not a reason to stop
                    log.error("pop journal: record %d is not JSON (%s); skipped", offset, e)
                    continue
                apply(record)
                applied += 1
        self._next = end
        log.info("pop journal: snapshot at record %d, %d records applied after it", start, applied)

    # ------------------------------------------------------------------------------------------ records
    def admit(self) -> None:
        """Before a request changes the book: refused, nothing changed, while too few replicas are in sync."""
        self._admit()
        self._ends.end = 0

    def append(self, record: dict[str, Any]) -> None:
        body = json.dumps(record, separators=(",", ":")).encode("utf-8")
        res = self.store.put_message(POP_JOURNAL_TOPIC, 0, body, None, wait_store_ok=None)
        if res.status not in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
            raise ServiceNotAvailableError(f"pop state not stored ({res.status.name}: {res.error}); try again later")
        self._next = res.queue_offsets[0] + 1
        self._since += 1
        self._ends.end = max(getattr(self._ends, "end", 0), res.commitlog_offsets[0] + res.wrote_bytes)

    def settle(self) -> None:
        """Before a request is answered: every in-sync replica holds its records, or FlushSlaveTimeoutError."""
        end, self._ends.end = getattr(self._ends, "end", 0), 0
        if end and not self._confirm(end):
            raise FlushSlaveTimeoutError(
                "the pop state change was made on the master, but its in-sync replicas did not confirm it in time; "
                "after a failover it may be undone (an ack: the message is delivered again)"
            )

    def secret(self) -> bytes:
        return self._secret

    # ------------------------------------------------------------------------------------------ snapshot
    @property
    def behind(self) -> bool:
        return False  # a record the store refused is refused to the client: nothing is kept in memory only

    @property
    def due(self) -> bool:
        return self._since >= CHECKPOINT_RECORDS or (
            self._since > 0 and time.monotonic() - self._snapshot_at >= CHECKPOINT_INTERVAL_S
        )

    def checkpoint(self, state: dict[str, Any]) -> None:
        """``state``: every record up to the topic's current end applied (the caller's lock keeps appends out)."""
        write_json_atomic(self.path, {"next": self._next, "secret": self._secret.hex(), "state": state,
                                      LOG_END_KEY: self.store.max_phys_offset()}, mode=0o600, backup=False)
        self._since = 0
        self._snapshot_at = time.monotonic()

    def close(self) -> None:
        """Nothing to flush: every record is in the commit log."""


def _parse(data: dict[str, Any]) -> tuple[int, dict[str, Any], bytes]:
    secret = bytes.fromhex(str(data.get("secret", "")))
    if secret and len(secret) != SECRET_BYTES:
        raise ValueError(f"secret of {len(secret)} bytes")
    state = data["state"]
    if not isinstance(state, dict):
        raise TypeError("state is not an object")
    return int(data["next"]), state, secret
