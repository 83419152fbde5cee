"""Retried sends are stored at most once: a retry of a send whose answer was lost gets the first attempt's result.

A producer that sent a message and heard nothing back (its deadline passed, the connection broke mid-call) cannot
tell whether the broker stored it. RocketMQ's producer sends it again and the message may be stored twice. Sluice's
producer instead sends it again to the same broker marked ``retry``, and the broker answers with the original
result when the first attempt stored it.

How the broker knows, without any new state: every message the producer sends carries its UNIQ_KEY (a 32-hex id
made by the client), and the store's index already holds ``topic#UNIQ_KEY`` for every message. The index is
durable, rebuilt by recovery after a crash, and built the same way by a replica from the replicated log, so the
answer survives a broker crash between storing and answering, and a failover.

* A send's key is the topic and UNIQ_KEY of its first message (a batch is stored all or nothing, contiguously, so
  its first message stands for all of it).
* While a send with a key runs, the key is held: a retry of it waits until the first attempt has finished (stored
  or failed) before it looks. Two sends of one key never run at once, so two retries cannot both miss and both
  store.
* A retry looks the key up in the index within ``window_ms`` after the dispatcher has indexed everything stored so
  far; when found (and the stored messages carry the request's UNIQ_KEYs, in order, and went to its topics) the
  stored messages' offsets are the answer and nothing is written. Otherwise it is stored as a first attempt. The
  caller's rights on the request's topics are asked before its key is held (send_processor.py's
  ``authorize_deduplicated_*``), as storing it would ask them.

Not covered: a send without UNIQ_KEY (the producer always sets one; other writers are at-least-once), transactional
halves (a transaction's own id names them), and retries after ``window_ms`` or with the index disabled. Waiting for a
first attempt is bounded by ``WAIT_FIRST_ATTEMPT_S``; past it the retry is refused as SYSTEM_BUSY, and the client
tries again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

from broker.errors import SystemBusyError
from broker.format.message import BODY_START, I32, POS_BODY_LENGTH, Prop, StoredMessage
from broker.format.system_topics import SCHEDULE_TOPIC, TIMER_TOPIC
from broker.format.transaction_codec import raw_property
from broker.store import MessageStore, PutStatus
from broker.store.store_results import PutResult

log = logging.getLogger(__name__)

DEFAULT_DEDUP_WINDOW_MS = 300_000  # a producer retries within its send timeout (30 s); five minutes is ample
WAIT_FIRST_ATTEMPT_S = 30.0  # longest a retry waits for the attempt it repeats (a SYNC_FLUSH put waits 5 s at most)
MAX_HELD_KEYS = 100_000  # sends in progress at once: bounded by gRPC workers (256) in practice; this is a backstop


class SendKey(NamedTuple):
    topic: str
    uniq_key: str


def batch_key(buffer: bytes) -> SendKey | None:
    """The key of a SendBatch buffer's first entry; None when it has no UNIQ_KEY (or is too short to have one)."""
    if len(buffer) < BODY_START:
        return None
    try:
        uniq = raw_property(buffer, Prop.UNIQ_KEY)
        if not uniq:
            return None
        body_len = I32.unpack_from(buffer, POS_BODY_LENGTH)[0]
        at = BODY_START + body_len
        topic = bytes(buffer[at + 1 : at + 1 + buffer[at]]).decode("ascii")
    except (IndexError, ValueError):  # a malformed buffer: the store's validation refuses it with a clear reason
        return None
    return SendKey(topic, uniq)


def entry_keys(buffer: bytes) -> list[SendKey | None]:
    """Every entry's key in a well-formed SendBatch buffer, None for an entry without UNIQ_KEY (only called on the
    retry path)."""
    keys: list[SendKey | None] = []
    pos = 0
    while pos + 4 <= len(buffer):
        size = I32.unpack_from(buffer, pos)[0]
        if size <= 0:
            break
        keys.append(batch_key(buffer[pos : pos + size]))
        pos += size
    return keys


def _destination(msg: StoredMessage) -> str:
    """The topic a stored message was sent to: a delayed or timer message waits in a system topic, its own in
    REAL_TOPIC."""
    if msg.topic in (SCHEDULE_TOPIC, TIMER_TOPIC):
        return msg.properties.get(Prop.REAL_TOPIC, "")
    return msg.topic


class SendDeduplicator:
    def __init__(self, store: MessageStore, window_ms: int = DEFAULT_DEDUP_WINDOW_MS) -> None:
        self.store = store
        self.window_ms = window_ms
        self._cond = threading.Condition()
        self._held: set[SendKey] = set()
        self.deduplicated = 0  # retries answered from the store (a metric)

    @contextmanager
    def _hold(self, key: SendKey) -> Iterator[None]:
        deadline = time.monotonic() + WAIT_FIRST_ATTEMPT_S
        with self._cond:
            while key in self._held or len(self._held) >= MAX_HELD_KEYS:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SystemBusyError(
                        f"an earlier attempt of this send (UNIQ_KEY {key.uniq_key[:64]}) is still being stored; "
                        "retry later"
                    )
                self._cond.wait(remaining)
            self._held.add(key)
        try:
            yield
        finally:
            with self._cond:
                self._held.discard(key)
                self._cond.notify_all()

    @contextmanager
    def attempt(
        self, key: SendKey | None, retry: bool, keys_of_request: Callable[[], list[SendKey | None]]
    ) -> Iterator[PutResult | None]:
        """Run a send inside: yields the stored result when this is a retry of a send stored already (write
        nothing then), else None (store it now, still inside, so no other attempt of the key runs meanwhile)."""
        if key is None:
            yield None
            return
        with self._hold(key):
            found = self._find(key, keys_of_request()) if retry else None
            if found is not None:
                self.deduplicated += 1
                log.info("retried send of %s (UNIQ_KEY %s) was stored already; answering with its result",
                         key.topic, key.uniq_key)
            yield found

    def _find(self, key: SendKey, keys: list[SendKey | None]) -> PutResult | None:
        if self.store.index is None:
            return None
        if not self.store.wait_dispatched(WAIT_FIRST_ATTEMPT_S):
            raise SystemBusyError("the store is indexing a backlog; retry the send later")
        begin_ms = int(time.time() * 1000) - self.window_ms
        # a delayed message is stored in the schedule topic first, a timer message in the timer topic
        for topic in (key.topic, SCHEDULE_TOPIC, TIMER_TOPIC):
            # unconfirmed copies too: the answer then waits for the in-sync replicas (broker/ha/replication_gate.py)
            hits = self.store.query_by_key(topic, key.uniq_key, max_num=1, begin_ms=begin_ms, confirmed_only=False)
            if hits:
                return self._result_from(hits[0].commitlog_offset, keys)
        return None

    def _result_from(self, first_offset: int, keys: list[SendKey | None]) -> PutResult | None:
        """The PutResult of the contiguous stored messages from ``first_offset`` whose UNIQ_KEYs and topics are the
        request's: a message of another topic is no answer to this send, even under its UNIQ_KEY (the answer would
        tell where a message the caller may not publish to is stored)."""
        result = PutResult(PutStatus.PUT_OK, msg_id_prefix=self.store.msg_id_prefix())
        offset = first_offset
        for key in keys:
            msg = self.store.lookup_message(offset)
            if msg is None or (
                key is not None
                and (msg.properties.get(Prop.UNIQ_KEY) != key.uniq_key or _destination(msg) != key.topic)
            ):
                log.warning("a retried send's first message is stored at %d but the rest differ; storing it again",
                            first_offset)
                return None
            result.commitlog_offsets.append(msg.commitlog_offset)
            result.queue_ids.append(msg.queue_id)
            result.queue_offsets.append(msg.queue_offset)
            result.store_timestamp = msg.store_timestamp
            offset += msg.store_size
        return result
