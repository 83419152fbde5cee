"""The fuzz oracle's part for the TransactionCoordinator service: every decision the broker answered stands.

Rules (decision_log.py's promise, judged on every answer and after every restart): a new decision is recorded as
asked (its outcome and participants); the first decision of a transaction stands, every later answer about it
names that one (decided_ms included); a refused RecordDecision records nothing, so a transaction only ever refused
has no decision; a QueryDecisions names no transaction that nothing decided.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError

from broker.errors import BrokerError
from broker.format.transaction_codec import check_transaction_id
from broker.proto import coordinator_pb2 as cpb
from broker.semantics.decision_log import MAX_QUERY_IDS
from tests.unit.fuzz.fuzz_oracle import Fuzzer
from tests.unit.server.hardening_rpc import Answer

SERVICE = "sluice.v1.TransactionCoordinator"
COORDINATOR = cpb.DESCRIPTOR.services_by_name["TransactionCoordinator"]


def _parsed(cls: Any, data: bytes) -> Any | None:
    message = cls()
    try:
        message.ParseFromString(data)
    except DecodeError:
        return None
    return message


def _valid_id(txn_id: str) -> bool:
    try:
        check_transaction_id(txn_id)
    except BrokerError:
        return False
    return True


def _shares(d: cpb.TransactionDecision) -> list[tuple[str, list[str], int]]:
    return sorted((p.broker_name, list(p.committed_attempts), p.expected_messages) for p in d.participants)


@dataclass
class DecisionBook:
    """The decisions the broker answered, and the transactions it only ever refused to decide."""

    fuzzer: Fuzzer
    stood: dict[str, cpb.TransactionDecision] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.fuzzer.checks.append(self.check)

    def call(self, method: str, data: bytes) -> Answer:
        """Send bytes to a method of the service; the answer judged by the fuzz oracle and by this book."""
        a = self.fuzzer.send_raw(f"/{SERVICE}/{method}", data)
        self.fuzzer.judge(f"{SERVICE}/{method}", a)
        if method == "RecordDecision":
            self._recorded(data, a)
        elif method == "QueryDecisions" and a.ok:
            self._queried(data, a)
        return a

    def _problem(self, what: str) -> None:
        self.fuzzer.record(SERVICE, refused=False, problem=what)

    def _stands(self, d: cpb.TransactionDecision, new: bool = False) -> None:
        """``d`` answered for its transaction: the one that stands (recorded now when ``new``)."""
        first = self.stood.get(d.transaction_id)
        if first is None:
            if not new:
                self._problem(f"a decision of {d.transaction_id[:60]!r} nothing recorded: {d}")
            self.stood[d.transaction_id] = d
            self.refused.discard(d.transaction_id)
        elif first != d:
            self._problem(f"{d.transaction_id[:60]!r} was decided {first}, later answered {d}")

    def _recorded(self, data: bytes, a: Answer) -> None:
        request = _parsed(cpb.RecordDecisionRequest, data)
        if not a.ok:
            if request is not None and request.decision.transaction_id not in self.stood:
                self.refused.add(request.decision.transaction_id)
            return
        answered = _parsed(cpb.TransactionDecision, a.response)
        if request is None or answered is None:
            self._problem(f"RecordDecision answered OK to bytes that are no request, or with no decision: {a}")
            return
        asked = request.decision
        if answered.transaction_id != asked.transaction_id:
            self._problem(f"RecordDecision of {asked.transaction_id[:60]!r} answered {answered.transaction_id[:60]!r}")
            return
        if asked.transaction_id not in self.stood and (answered.outcome, _shares(answered)) != (
            asked.outcome, _shares(asked)
        ):
            self._problem(f"RecordDecision recorded {answered} when asked {asked}")
        self._stands(answered, new=True)

    def _queried(self, data: bytes, a: Answer) -> None:
        request = _parsed(cpb.QueryDecisionsRequest, data)
        answered = _parsed(cpb.QueryDecisionsResponse, a.response)
        if request is None or answered is None:
            self._problem(f"QueryDecisions answered OK to bytes that are no request: {a}")
            return
        named = set(request.transaction_ids)
        for d in answered.decisions:
            if not (d.transaction_id in named or (request.prefix and d.transaction_id.startswith(request.prefix))):
                self._problem(f"QueryDecisions answered {d.transaction_id[:60]!r}, which it did not ask about")
            new = request.abort_undecided and d.transaction_id in named and d.transaction_id not in self.stood
            if new and (d.outcome, list(d.participants)) != ("ABORT", []):
                self._problem(f"an undecided transaction decided by a query is not a plain ABORT: {d}")
            self._stands(d, new=new)
        if request.abort_undecided and not named <= {d.transaction_id for d in answered.decisions}:
            self._problem(f"QueryDecisions with abort_undecided left some of {sorted(named)[:5]} out")

    def check(self, when: str) -> str:
        """Every decision stands as answered; no transaction only refused has one."""
        ids = sorted(self.stood)
        for i in range(0, len(ids), MAX_QUERY_IDS):
            chunk = ids[i : i + MAX_QUERY_IDS]
            a = self.call("QueryDecisions", cpb.QueryDecisionsRequest(transaction_ids=chunk).SerializeToString())
            assert a.ok, f"{when}: QueryDecisions of the recorded decisions: {a}"
            found = {d.transaction_id: d for d in cpb.QueryDecisionsResponse.FromString(a.response).decisions}
            lost = [t for t in chunk if found.get(t) != self.stood[t]]
            assert not lost, f"{when}: decisions lost or changed: {[(t, found.get(t)) for t in lost[:5]]}"
        never = sorted(t for t in self.refused - set(self.stood) if _valid_id(t))
        if never:
            a = self.call("QueryDecisions", cpb.QueryDecisionsRequest(transaction_ids=never).SerializeToString())
            assert a.ok, f"{when}: QueryDecisions of the refused transactions: {a}"
            found_refused = cpb.QueryDecisionsResponse.FromString(a.response).decisions
            assert not found_refused, f"{when}: refused RecordDecisions recorded {list(found_refused)[:5]}"
        return f"{len(ids)} decisions stand as answered, {len(never)} transactions only refused have none"
