"""Transactional messages, single (RocketMQ) and batch (Sluice), crash-safe.

A transaction is named by an id (``__transactionId__``; RocketMQ's producer uses the message's UNIQ_KEY). Its
half messages wait, invisible, in ``RMQ_SYS_TRANS_HALF_TOPIC``; they may come one by one (``prepare_half``) or in
batches (``put_half_batch``) from any number of processes. ``end_transaction(id, commit)`` decides for all of them:

1. new halves for the id are refused from now on, and in-flight half puts are waited for;
2. one op message (tag ``d``) is stored with the decision and the half offsets it covers, waiting for the store
   (SYNC_FLUSH: on disk) -- this is the commit point: before it nothing is visible, after it everything will be;
3. on commit, the halves are re-stored in their real topics (``put_batch``, in chunks), each recording its half's
   commit-log offset in PREPARED TRANSACTION OFFSET; the committed entries are built in bulk (``half_run``) and
   checked before step 2 (kept for the re-store up to ``commit_memory_bytes``, built again past that), and a
   visibility hold on every real queue keeps readers from seeing any of them until all are dispatched, then shows
   them at one instant;
4. an op message with tag ``f`` marks the re-store finished.

A transaction holds at most ``max_halves`` messages (its table is kept in memory); its commit holds at most
``commit_memory_bytes`` of committed entries and one store read of halves. Check-back counts are persisted with
the scan positions, before each pass asks.

After a crash anywhere, ``start()`` scans the op and half queues, and for every commit decision without its ``f``
marker it scans the real queues from the offsets recorded in the decision, skips halves already re-stored (their
commit-log offsets appear as PREPARED TRANSACTION OFFSET in entries of COMMIT type carrying this transaction's id;
other messages there carry 0 or another transaction's halves) and re-stores the rest: each message once, all or
nothing. A commit whose halves or decision expired before that is given up (logged), never retried. Ending an
ended transaction returns the first outcome. Open transactions idle for ``transaction_timeout_ms`` are checked
back with the producer group through ``checker`` every ``check_interval_ms``; after ``check_max`` unanswered checks
they are rolled back (RocketMQ: transactionTimeOut 6 s, transactionCheckMax 15). A failure with one transaction in
a pass (its commit, its check) is logged and leaves the others to be checked. A transaction whose halves name a
coordinator broker (one over several brokers) goes to ``resolver`` instead, at each check and at check_max: its
coordinator decides it (decision_log.py).

Halves may not carry DELAY > 0 (``refuse_delay``): a commit stores them in their real topics at once, and RocketMQ's
producer drops DELAY from transactional sends.

Server wiring::

    tx = TransactionService(store, store_config.config_dir, checker=fn)  # fn(group, txn_id, half) -> TxState|None
    tx.start()                                            # recovery; before serving any request
    res, txn_id = tx.prepare_half(topic, qid, body, props, producer_group)            # SEND with TRAN_MSG=true
    res = tx.put_half_batch(buffer, producer_group, txn_id)                           # SendBatch in a transaction
    out = tx.end_transaction(txn_id, commit=True)         # or end_transaction_by_offset(half_commitlog_offset, ..)
    tx.list_transactions(prefix="query-1:"); tx.end_transactions(prefix="query-1:", commit=False)
    tx.shutdown()                                         # before store.shutdown()

The checker is called from the check thread; it may answer at once (return TxState) or later through
``end_transaction(..., from_check=True)`` (RocketMQ's CHECK_TRANSACTION_STATE is one-way); None means "asked".
"""

from __future__ import annotations

import threading

from broker.errors import MessageIllegalError
from broker.format.transaction_codec import MAX_ATTEMPTS_PROPERTY_CHARS
from broker.semantics.transaction_checkback import CheckBack
from broker.semantics.transaction_state_file import STATE_FILE
from broker.semantics.transaction_table import (
    DEFAULT_CHECK_INTERVAL_MS,
    DEFAULT_CHECK_MAX,
    DEFAULT_COMMIT_MEMORY_BYTES,
    DEFAULT_MAX_HALVES,
    DEFAULT_MAX_OPEN_MS,
    DEFAULT_MAX_OUTCOMES,
    DEFAULT_OUTCOME_RETENTION_MS,
    DEFAULT_PUT_CHUNK_BYTES,
    DEFAULT_TRANSACTION_TIMEOUT_MS,
    Checker,
    DecisionGoneError,
    EndResult,
    HalvesGoneError,
    Resolver,
    TransactionError,
    TransactionSummary,
    TxState,
    TxStatus,
)
from broker.semantics.transaction_table import now_ms as _now_ms


class TransactionService(CheckBack):
    """The transaction service, whole: its parts are layered classes, each in its own module, from the table
    (transaction_table.py) through the queue scans (half_scan.py), the commit re-store (transaction_restore.py),
    the half puts (transaction_puts.py), the decisions (transaction_decisions.py) and start-up recovery
    (transaction_recovery.py) to the check-back loop (transaction_checkback.py). This class adds their lifecycle."""

    def start(self) -> None:
        """Recover (finish interrupted commits), then start the check-back thread. Call before serving."""
        assert not self._started, "already started"
        self.recover()
        self._started = True
        self._stop.clear()
        self._thread = threading.Thread(target=self._run_checks, name="transaction-check", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        recovered, self._started = self._started, False
        if recovered:  # a start refused by recovery (say an unreadable state file) must leave the file as it was
            self.persist()

    def _now(self) -> int:
        return _now_ms()  # this module's clock, looked up at each call: a test may set another one here


__all__ = [
    "DEFAULT_CHECK_INTERVAL_MS",
    "DEFAULT_CHECK_MAX",
    "DEFAULT_COMMIT_MEMORY_BYTES",
    "DEFAULT_MAX_HALVES",
    "DEFAULT_MAX_OPEN_MS",
    "DEFAULT_MAX_OUTCOMES",
    "DEFAULT_OUTCOME_RETENTION_MS",
    "DEFAULT_PUT_CHUNK_BYTES",
    "DEFAULT_TRANSACTION_TIMEOUT_MS",
    "MAX_ATTEMPTS_PROPERTY_CHARS",
    "STATE_FILE",
    "Checker",
    "DecisionGoneError",
    "EndResult",
    "HalvesGoneError",
    "MessageIllegalError",
    "Resolver",
    "TransactionError",
    "TransactionSummary",
    "TransactionService",
    "TxState",
    "TxStatus",
]
