"""The check-back loop: open transactions idle too long are asked about through the producer group's checker
(or their coordinator's resolver), rolled back after ``check_max`` unanswered checks; stalled commits retried."""

from __future__ import annotations

import logging
import time

from broker.format.message import StoredMessage, decode_entry
from broker.format.system_topics import TRANS_MARKER_TOPIC
from broker.semantics.transaction_recovery import Recovery
from broker.semantics.transaction_table import DecisionGoneError, HalvesGoneError, TxnRecord, TxState, TxStatus
from broker.store import PutStatus
from broker.store.txn_visibility import MARKER_QUEUE_ID, encode_marker

log = logging.getLogger(__name__)


class CheckBack(Recovery):
    """The check thread's passes over the table."""

    def _run_checks(self) -> None:
        next_persist = time.monotonic()
        while not self._stop.wait(self.check_interval_ms / 1000):
            try:
                self.check_once()
                if time.monotonic() >= next_persist:
                    self.persist()
                    next_persist = time.monotonic() + 5
            except Exception:
                log.exception("transaction check pass failed; next pass in %d ms", self.check_interval_ms)

    def check_once(self) -> int:
        """One check pass: finish stalled commits, check back idle open transactions, roll back those checked
        ``check_max`` times. Returns the number of transactions checked back."""
        self._roll_back_orphans()
        now = self._now()
        with self._lock:
            unfinished = [
                t for t in self._txns.values()
                if t.status in (TxStatus.COMMITTED, TxStatus.ROLLED_BACK) and not t.finished and not t.restoring
            ]
            for t in unfinished:
                t.restoring = True
            idle = [
                t for t in self._txns.values()
                if t.status is TxStatus.OPEN and not t.inflight and t.halves
                and now - max(t.last_ms, t.checked_ms) >= self.transaction_timeout_ms
            ]
        for t in unfinished:
            self._retry_finish(t)
        expired = [t for t in idle if t.check_times >= self.check_max]
        for t in expired:
            try:
                if self._decided_elsewhere(t, final=True):
                    continue
                log.warning("transaction %s: no answer after %d checks; rolling back", t.txn_id, t.check_times)
                self.end_transaction(t.txn_id, False)
            except Exception:  # broad, as in _check_back: one transaction's failure must not end the pass
                log.exception("transaction %s: rollback after %d checks failed; retried next pass", t.txn_id,
                              t.check_times)
        to_check = [t for t in idle if t.check_times < self.check_max]
        if not to_check:
            return 0
        with self._lock:
            for t in to_check:
                t.check_times += 1
                t.checked_ms = now
        self.persist()  # counted before asking, and on disk: a restart cannot grant check_max more checks
        for t in to_check:
            self._check_back(t)
        return len(to_check)

    def _roll_back_orphans(self) -> None:
        """Roll back, with a marker, the slices the store still holds open whose writer's record expired with the
        log's first files and which no transaction here names: nothing can decide them any more (a transaction is
        found by those records), and they would hold their queues from readers for ever. A marker, not a local
        rule, so that replicas do the same from the log."""
        log_min = self.store.min_phys_offset()
        with self._lock:
            known = {h for t in self._txns.values() for h in t.slices}
        orphans = [s.handle for s in self.store.txn_visibility.open_slices() if s.handle <= log_min
                   and s.handle not in known]
        if not orphans:
            return
        log.warning("transaction slices %s: their records expired undecided; rolling them back", orphans)
        res = self.store.put_message(TRANS_MARKER_TOPIC, MARKER_QUEUE_ID, encode_marker([], orphans), {},
                                     wait_store_ok=True)
        if res.status not in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
            log.error("rollback marker of expired slices not stored (%s: %s); the next pass retries",
                      res.status.name, res.error)

    def _retry_finish(self, t: TxnRecord) -> None:
        """check_once's retry of one stalled commit (``t.restoring`` set by the caller, cleared here)."""
        try:
            self._finish_commit(t)
        except (HalvesGoneError, DecisionGoneError) as e:
            self._give_up_commit(t, e)
        except Exception:
            # Broad on purpose: whatever stops this commit (store refusal, I/O error, a half that cannot be
            # committed) is this transaction's problem; the pass must still check back every open transaction.
            log.exception("transaction %s: finishing the commit failed; the next check pass retries", t.txn_id)
        finally:
            with self._lock:
                t.restoring = False

    def _check_back(self, t: TxnRecord) -> None:
        """Ask one transaction's producer group and apply a definite answer."""
        try:
            if self._decided_elsewhere(t, final=False):
                return
            answer = self._ask(t)
            if answer in (TxState.COMMIT, TxState.ROLLBACK):
                self.end_transaction(t.txn_id, answer is TxState.COMMIT, from_check=True)
        except Exception:
            # Broad on purpose: every check of the pass is already counted, so one that fails (its half unreadable,
            # its commit refused) must not leave the others counted but never asked. It is asked again next pass,
            # and rolled back once check_max passes have counted it.
            log.exception("transaction %s: check-back failed; it is checked again next pass", t.txn_id)

    def _ask(self, t: TxnRecord) -> TxState | None:
        if self.checker is None:
            return None
        half = self._first_half(t)
        if half is None:
            return None
        try:
            return self.checker(t.producer_group, t.txn_id, half)
        except Exception:
            log.exception("transaction %s: checker of group %s failed", t.txn_id, t.producer_group)
            return None

    def _first_half(self, t: TxnRecord) -> StoredMessage | None:
        with self._lock:
            first = min(t.halves) if t.halves else None
        return None if first is None else decode_entry(self._read_half_runs([first])[0].buffer)

    def _decided_elsewhere(self, t: TxnRecord, *, final: bool) -> bool:
        """True when ``resolver`` takes the transaction: its halves name the coordinator broker that decides it."""
        if self.resolver is None:
            return False
        half = self._first_half(t)
        return half is not None and self.resolver(t.txn_id, half, final)
