"""Transactions, the operations every front calls: end one (by id or by a half's commit-log offset), list, end many.

Protocol-neutral: a request is an EndTransaction, answers are the transaction service's EndResult and
TransactionSummary; sluice.v1 (broker_service.py) and the remoting front translate. Check-back streams are the
gRPC front's own (check_streams.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from broker.auth.operations import Operation, authorize
from broker.errors import InvalidArgumentError, shown
from broker.format.send_checks import validate_producer_group
from broker.semantics import EndResult, TransactionService, TransactionSummary, TxStatus

MAX_LIST = 100_000  # transactions returned by one ListTransactions
MAX_END_MANY = 10_000  # transaction ids one EndTransactions may name: each is one decision written to the store


@dataclass(frozen=True)
class EndTransaction:
    """One transaction's end: named by id, or by the commit-log offset of one of its halves."""

    commit: bool
    transaction_id: str = ""
    half_commitlog_offset: int | None = None
    from_check: bool = False  # the producer's answer to a check-back
    committed_attempts: Sequence[str] | None = None  # the writer attempts a commit keeps; None: every one
    producer_group: str = ""  # optional: names the group of a transaction this call records
    expected_messages: int | None = None  # the commit's count check (txn_in_place.py)
    record_unknown: bool = False


class TransactionProcessor:
    def __init__(self, transactions: TransactionService) -> None:
        self.tx = transactions

    def end(self, request: EndTransaction) -> EndResult:
        expected = request.expected_messages
        if expected is not None and expected < 0:
            raise InvalidArgumentError(f"expected_messages {expected} is negative")
        if request.producer_group:
            validate_producer_group(request.producer_group)
        attempts = list(request.committed_attempts) if request.committed_attempts is not None else None
        kwargs = {"from_check": request.from_check, "committed_attempts": attempts,
                  "producer_group": request.producer_group, "expected_messages": expected,
                  "record_unknown": request.record_unknown}
        if request.half_commitlog_offset is not None:
            return self.tx.end_transaction_by_offset(request.half_commitlog_offset, request.commit, **kwargs)
        if not request.transaction_id:
            raise InvalidArgumentError("EndTransaction names no transaction: give transaction_id or a half offset")
        return self.tx.end_transaction(request.transaction_id, request.commit, **kwargs)  # type: ignore[arg-type]

    def list_transactions(self, prefix: str, status_name: str) -> list[TransactionSummary]:
        """``status_name`` empty: every status."""
        authorize(Operation.LIST_TRANSACTIONS)
        status = None
        if status_name:
            try:
                status = TxStatus(status_name)
            except ValueError:
                names = [s.value for s in TxStatus]
                raise InvalidArgumentError(
                    f"transaction status {shown(status_name)} is not one of {names}"
                ) from None
        found = self.tx.list_transactions(prefix, status)
        if len(found) > MAX_LIST:
            raise InvalidArgumentError(f"{len(found)} transactions match; give a longer prefix (at most {MAX_LIST})")
        return found

    def end_many(self, commit: bool, prefix: str, txn_ids: Sequence[str]) -> list[EndResult]:
        """Every transaction ended is decided as one end is too (the transaction service asks for each)."""
        authorize(Operation.END_TRANSACTIONS)
        if not prefix and not txn_ids:
            raise InvalidArgumentError("EndTransactions: give a prefix or transaction ids (an empty prefix is refused)")
        if len(txn_ids) > MAX_END_MANY:
            raise InvalidArgumentError(
                f"EndTransactions names {len(txn_ids)} transactions; at most {MAX_END_MANY} per call "
                "(each is decided and written on its own)"
            )
        return self.tx.end_transactions(commit, prefix=prefix or None, txn_ids=list(txn_ids))
