"""A commit's re-store: the halves put again, in chunks, in their real topics, each recording its half.

Apart because both a live commit and recovery after a crash re-store, and must store each message once."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np

from broker.errors import MessageIllegalError
from broker.format.batch import split_entries
from broker.format.message import Prop, decode_entry
from broker.format.system_topics import TRANS_OP_HALF_TOPIC
from broker.format.transaction_codec import FINISHED_TAG
from broker.semantics.half_run import CommittedRun, commit_halves
from broker.semantics.half_scan import HalfScans
from broker.semantics.transaction_table import DISPATCH_WAIT_S, TransactionError, TxnRecord
from broker.store import PutStatus

log = logging.getLogger(__name__)


class CommitRestore(HalfScans):
    """Committed halves re-stored in their real queues."""

    def _commit_runs(
        self, offsets: list[int], attempts: list[str] | None
    ) -> tuple[list[CommittedRun], list[int], set[tuple[str, int]], int]:
        """Make every half at these half-queue offsets into its committed entries, reading one run at a time:
        MessageIllegalError for a bad half, HalvesGoneError for a missing one, before anything is decided.
        Returns the committed runs kept (a prefix, within commit_memory_bytes), the half offsets past it (to be
        made again as they are stored), every real queue the commit writes to and how many messages it commits."""
        kept: list[CommittedRun] = []
        later: list[int] = []
        queues: set[tuple[str, int]] = set()
        size = total = 0
        for run in self._iter_half_runs(offsets):
            committed = commit_halves(run, attempts=attempts)
            queues |= committed.queues
            total += committed.messages
            if later or size + len(committed.buffer) > self.commit_memory_bytes:
                later.extend(run.queue_offsets)
            else:
                kept.append(committed)
                size += len(committed.buffer)
        return kept, later, queues, total

    def _restore(self, txn: TxnRecord, committed: Iterable[CommittedRun], queues: Iterable[tuple[str, int]]) -> int:
        """Re-store committed entries in their real topics (``queues``: all they go to), all shown to readers at
        the same instant, then write the finished marker."""
        with self._restore_lock:  # one commit's visibility hold at a time: each shows exactly its own messages
            hold = self.store.hold_visibility(queues)
            try:
                restored = self._put_runs(txn, committed)
                if not self.store.wait_dispatched(DISPATCH_WAIT_S, up_to=self.store.max_phys_offset()):
                    log.error("transaction %s: dispatch lags %.0f s behind; showing the commit as far as it got",
                              txn.txn_id, DISPATCH_WAIT_S)
            finally:
                # Also on failure: a queue must not stay frozen; the check thread finishes the rest of the commit.
                self.store.release_visibility(hold)
        self._store_finished(txn)
        return restored

    def _put_runs(self, txn: TxnRecord, committed: Iterable[CommittedRun]) -> int:
        """put_batch calls of at most put_chunk_bytes; returns how many messages were stored."""
        chunk: list[tuple[bytes, np.ndarray | None]] = []
        size = restored = 0
        for run in committed:
            if not run.buffer:  # every half of the run was already re-stored (a commit finished after a crash)
                continue
            pieces = [(run.buffer, run.positions)] if len(run.buffer) <= self.put_chunk_bytes else [
                (piece, None) for piece, _ in split_entries(run.buffer, self.put_chunk_bytes)]
            for piece, positions in pieces:
                if chunk and size + len(piece) > self.put_chunk_bytes:
                    restored += self._put_chunk(txn.txn_id, chunk)
                    chunk, size = [], 0
                if len(piece) > self.put_chunk_bytes:  # one message too big for any batch goes alone
                    restored += self._put_one(txn.txn_id, piece)
                    continue
                chunk.append((piece, positions))
                size += len(piece)
        if chunk:
            restored += self._put_chunk(txn.txn_id, chunk)
        return restored

    def _put_one(self, txn_id: str, entry: bytes) -> int:
        m = decode_entry(entry)
        ip, _, port = m.born_host.rpartition(":")
        res = self.store.put_message(
            m.topic, m.queue_id, m.body, m.properties, flag=m.flag, sys_flag=m.sys_flag,
            born_timestamp=m.born_timestamp, born_host=(ip, int(port) if port.isdigit() else 0),
            reconsume_times=m.reconsume_times, prepared_transaction_offset=m.prepared_transaction_offset,
            wait_store_ok=False,
        )
        assert res.status is not PutStatus.PUT_OK or res.wrote_bytes == len(entry), (res.wrote_bytes, len(entry))
        if res.status not in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
            raise TransactionError(f"re-store of {txn_id!r} refused: {res.status.name} {res.error}")
        return 1

    def _put_chunk(self, txn_id: str, pieces: list[tuple[bytes, np.ndarray | None]]) -> int:
        """One put_batch of committed runs; their entry positions (when the bulk path knows them) spare the
        store's validation the walk: it checks them instead (batch.walk)."""
        buffer = pieces[0][0] if len(pieces) == 1 else b"".join(p for p, _ in pieces)
        known: np.ndarray | None = None
        if all(positions is not None for _, positions in pieces):
            starts = np.cumsum([0] + [len(p) for p, _ in pieces[:-1]])
            known = np.concatenate([pos + at for (_, pos), at in zip(pieces, starts.tolist(), strict=True)])
        try:
            validated = self.store.validate_batch(buffer, known)
        except MessageIllegalError as e:
            raise TransactionError(f"re-store of {txn_id!r} refused: {e.message}") from None
        res = self.store.put_batch(buffer, wait_store_ok=False, validated=validated)
        if res.status not in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
            raise TransactionError(f"re-store of {txn_id!r} refused: {res.status.name} {res.error}")
        return len(res.queue_offsets)

    def _store_finished(self, txn: TxnRecord) -> None:
        """The op message saying the decision is complete (its copies stored, or its marker applied), then the
        transaction's tables go."""
        res = self.store.put_message(
            TRANS_OP_HALF_TOPIC, 0, txn.txn_id.encode(), {Prop.TAGS: FINISHED_TAG, Prop.TRANSACTION_ID: txn.txn_id},
            wait_store_ok=False,
        )
        if res.status not in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
            raise TransactionError(f"finished marker of {txn.txn_id!r} not stored: {res.status.name} {res.error}")
        with self._lock:
            txn.finished = True
            self._drop_tables(txn)
