"""A transaction decision (``broker/format/txn_decision.py``) and its protobuf message ``TransactionDecision``,
the one form it travels and is stored in (``coordinator.proto``)."""

from __future__ import annotations

from broker.errors import InvalidArgumentError
from broker.format.txn_decision import ABORT, COMMIT, Share, TxnDecision, make_decision
from broker.proto import coordinator_pb2 as cpb


def to_pb(d: TxnDecision) -> cpb.TransactionDecision:
    return cpb.TransactionDecision(
        transaction_id=d.txn_id, outcome=d.outcome, decided_ms=d.decided_ms,
        participants=[cpb.ParticipantShare(broker_name=s.broker_name, committed_attempts=list(s.committed_attempts),
                                           expected_messages=s.expected_messages) for s in d.participants],
    )


def from_pb(m: cpb.TransactionDecision) -> TxnDecision:
    """A decision from its message, checked as ``make_decision`` checks (InvalidArgumentError)."""
    if m.outcome not in (COMMIT, ABORT):
        raise InvalidArgumentError(
            f"decision of {m.transaction_id[:60]!r}: outcome {m.outcome!r} is not COMMIT or ABORT"
        )
    shares = [Share(p.broker_name, tuple(p.committed_attempts), p.expected_messages) for p in m.participants]
    d = make_decision(m.transaction_id, m.outcome == COMMIT, shares)
    return d.stamped(m.decided_ms)
