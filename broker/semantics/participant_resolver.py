"""A participant's side of transactions over several brokers: open halves ended by their coordinator's decision.

The protocol is in decision_log.py. Halves that name a coordinator broker (``TRAN_COORDINATOR``) belong to a
transaction whose outcome that broker keeps. The TransactionService hands such a transaction to this resolver
(``TransactionService.resolver``) where it would check a producer back, and where it would roll it back after
``transaction_check_max`` checks, with ``final`` set:

* not final: the coordinator is asked for the decision; a COMMIT ends this broker's part with its share (the
  writer attempts and message count the decision names for this broker; a COMMIT that does not name this broker
  rolls its halves back), an ABORT rolls them back, no decision leaves them open for the next pass;
* final: the coordinator is asked to decide ABORT unless a decision stands, and the standing one is applied.

The service calls the resolver from its check thread, which must not wait on other brokers: the resolver only
notes the transaction, and its own thread asks each coordinator once per round about all of that coordinator's
transactions. A coordinator that does not answer leaves the halves open (asked again at the next pass): a
participant never rolls back alone a transaction that may be committed elsewhere. At most ``max_pending``
transactions wait for a round; past that, the rest are asked at a later pass.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from broker.errors import BrokerError, InvalidArgumentError
from broker.format.message import StoredMessage
from broker.format.transaction_codec import COORDINATOR
from broker.format.txn_decision import TxnDecision
from broker.semantics.decision_log import MAX_QUERY_IDS
from broker.semantics.transaction import TransactionService

log = logging.getLogger(__name__)

COORDINATOR_PROPERTY = COORDINATOR  # on a half: the broker that keeps its transaction's decision
DEFAULT_MAX_PENDING = 100_000
# (coordinator broker name, transaction ids, abort_undecided) -> the decisions that stand among them
Ask = Callable[[str, list[str], bool], list[TxnDecision]]


class ParticipantResolver:
    def __init__(self, transactions: TransactionService, broker_name: str, ask: Ask, *,
                 max_pending: int = DEFAULT_MAX_PENDING) -> None:
        if not broker_name:
            raise InvalidArgumentError("a participant needs its broker name: decisions name participants by it")
        self.tx = transactions
        self.broker_name = broker_name
        self.ask = ask
        self.max_pending = max_pending
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[str, bool]] = {}  # transaction id -> (coordinator, final)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.applied = 0  # decisions applied to this broker's transactions

    def __call__(self, txn_id: str, half: StoredMessage, final: bool) -> bool:
        """The TransactionService's hook: True when the transaction is decided elsewhere (noted for a round)."""
        coordinator = half.properties.get(COORDINATOR_PROPERTY)
        if not coordinator:
            return False
        with self._lock:
            known = self._pending.get(txn_id)
            if known is not None or len(self._pending) < self.max_pending:
                self._pending[txn_id] = (coordinator, final or (known is not None and known[1]))
            else:
                log.warning("transaction %s: %d transactions already wait for their coordinators; asked at a later "
                            "pass", txn_id, self.max_pending)
        self._wake.set()
        return True

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="transaction-participant", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.resolve_pending()
            except Exception:  # broad: this thread must live on; every transaction is noted again next pass
                log.exception("resolving transactions by their coordinators failed; retried at the next pass")

    # ------------------------------------------------------------------------------------------ rounds

    def resolve_pending(self) -> int:
        """Ask each coordinator about its noted transactions and apply what stands; returns decisions applied."""
        with self._lock:
            pending, self._pending = self._pending, {}
        groups: dict[tuple[str, bool], list[str]] = {}
        for txn_id, (coordinator, final) in sorted(pending.items()):
            groups.setdefault((coordinator, final), []).append(txn_id)
        applied = 0
        for (coordinator, final), ids in sorted(groups.items()):
            for lo in range(0, len(ids), MAX_QUERY_IDS):
                chunk = ids[lo : lo + MAX_QUERY_IDS]
                try:
                    decisions = self.ask(coordinator, chunk, final)
                except BrokerError as e:
                    log.warning("coordinator %s did not answer about %d transaction(s) (%s); their halves stay "
                                "open and it is asked again at the next pass", coordinator, len(chunk),
                                e.message)
                    continue
                wanted = set(chunk)
                applied += sum(self.apply(d) for d in decisions if d.txn_id in wanted)
        return applied

    def apply(self, d: TxnDecision) -> bool:
        """End this broker's part of ``d``; True when it is ended (now or before)."""
        share = d.share(self.broker_name) if d.commit else None
        try:
            if share is not None:
                self.tx.end_transaction(d.txn_id, True, committed_attempts=share.committed_attempts,
                                        expected_messages=share.expected_messages, from_check=True)
            else:
                self.tx.end_transaction(d.txn_id, False, from_check=True)
        except BrokerError as e:  # e.g. halves lost under ASYNC_FLUSH: the share cannot be committed exactly
            log.error("transaction %s: its coordinator decided %s, but this broker's part cannot end so (%s); the "
                      "halves stay open for an operator", d.txn_id, d.outcome, e.message)
            return False
        self.applied += 1
        log.info("transaction %s: ended by its coordinator's decision (%s)", d.txn_id,
                 "COMMIT" if share is not None else "ROLLBACK")
        return True


__all__ = ["COORDINATOR_PROPERTY", "Ask", "ParticipantResolver"]
