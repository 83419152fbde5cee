"""The decision of a transaction whose halves lie on several brokers, and each participant's share of a commit.

The wire form and the stored form are one declaration: ``TransactionDecision`` in ``broker/proto/coordinator.proto``
(a decision is stored as that message's bytes; broker/proto/decision.py converts). This module checks a
decision's bounds once, for the coordinator (decision_log.py), the participants (participant_resolver.py) and the
Spark sink that asks for a decision (connector/cluster_commit.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from broker.errors import InvalidArgumentError
from broker.format.transaction_codec import MAX_ATTEMPTS_PROPERTY_CHARS, check_transaction_id

COMMIT = "COMMIT"
ABORT = "ABORT"
# A decision names each broker that commits a part, in one message of the coordinator's store: a cluster has far
# fewer brokers than this (RocketMQ's largest run in the hundreds).
MAX_PARTICIPANTS = 1024
MAX_BROKER_NAME_CHARS = 127  # as broker.namesrv.route_table.MAX_NAME_CHARS


@dataclass(frozen=True, slots=True)
class Share:
    """One participant broker's part of a commit: the halves of these writer attempts, exactly this many."""

    broker_name: str
    committed_attempts: tuple[str, ...]
    expected_messages: int


@dataclass(frozen=True, slots=True)
class TxnDecision:
    txn_id: str
    commit: bool
    participants: tuple[Share, ...] = ()  # sorted by broker name; empty for ABORT
    decided_ms: int = 0

    @property
    def outcome(self) -> str:
        return COMMIT if self.commit else ABORT

    def share(self, broker_name: str) -> Share | None:
        """This broker's part of a commit; None: nothing of it is committed there (roll its halves back)."""
        for s in self.participants:
            if s.broker_name == broker_name:
                return s
        return None

    def stamped(self, now_ms: int | None = None) -> TxnDecision:
        return TxnDecision(self.txn_id, self.commit, self.participants, now_ms if now_ms is not None else _now_ms())


def _now_ms() -> int:
    return int(time.time() * 1000)


def make_decision(txn_id: str, commit: bool, shares: Iterable[Share] = ()) -> TxnDecision:
    """A checked decision: InvalidArgumentError naming what is out of bounds."""
    check_transaction_id(txn_id)
    participants = tuple(sorted(shares, key=lambda s: s.broker_name))
    if not commit and participants:
        raise InvalidArgumentError(f"decision of {txn_id!r}: an ABORT names no participants")
    if len(participants) > MAX_PARTICIPANTS:
        raise InvalidArgumentError(
            f"decision of {txn_id!r}: {len(participants)} participants, at most {MAX_PARTICIPANTS}"
        )
    seen: set[str] = set()
    for s in participants:
        if not s.broker_name or len(s.broker_name) > MAX_BROKER_NAME_CHARS or not s.broker_name.isprintable():
            raise InvalidArgumentError(
                f"decision of {txn_id!r}: participant name {s.broker_name[:40]!r} is not a broker name"
            )
        if s.broker_name in seen:
            raise InvalidArgumentError(f"decision of {txn_id!r}: participant {s.broker_name!r} is named twice")
        seen.add(s.broker_name)
        if s.expected_messages < 0:
            raise InvalidArgumentError(
                f"decision of {txn_id!r}: {s.broker_name!r} expects {s.expected_messages} messages"
            )
        # The participant commits with these attempts in one property: refused here, before anything is decided,
        # rather than by the participant after the decision stands.
        if len(",".join(s.committed_attempts)) > MAX_ATTEMPTS_PROPERTY_CHARS or any(
            not a or "," in a or "\x01" in a or "\x02" in a for a in s.committed_attempts
        ):
            raise InvalidArgumentError(
                f"decision of {txn_id!r}: the attempts of {s.broker_name!r} must be non-empty ids without ',' and "
                f"fit {MAX_ATTEMPTS_PROPERTY_CHARS} characters"
            )
    return TxnDecision(txn_id, commit, participants)
