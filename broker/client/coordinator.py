"""CoordinatorClient: calls to named brokers of a cluster for transactions over several brokers.

The protocol is in broker/semantics/decision_log.py: a coordinator broker keeps each such transaction's decision
(``RecordDecision`` / ``QueryDecisions`` of the TransactionCoordinator service), and each participant broker ends
its part with ``EndTransaction``. Brokers are named by their broker name and found through the name servers (the
master of the group: decisions and commits are writes); the Spark sink's driver and tasks, and a participant broker
asking a coordinator, use this client.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.client.connection import Connection
from broker.client.route import MASTER_ID
from broker.client.router import Router
from broker.errors import InvalidArgumentError, ServiceNotAvailableError
from broker.format.txn_decision import TxnDecision
from broker.proto import coordinator_pb2 as cpb
from broker.proto import coordinator_pb2_grpc as cpb_grpc
from broker.proto import sluice_pb2 as pb
from broker.proto.decision import from_pb, to_pb


class CoordinatorClient:
    def __init__(self, router: Router) -> None:
        if not router.cluster_mode:
            raise InvalidArgumentError("transactions over several brokers need a cluster: give namesrv=, not endpoint=")
        self.router = router

    def masters(self) -> dict[str, str]:
        """Broker name -> address of every live master the name servers list."""
        return {b.broker_name: b.address for b in self.router.cluster_brokers() if b.broker_id == MASTER_ID}

    def connection(self, broker_name: str, masters: dict[str, str] | None = None) -> Connection:
        address = (masters if masters is not None else self.masters()).get(broker_name)
        if address is None:
            raise ServiceNotAvailableError(
                f"broker {broker_name!r} has no live master in {self.router.describe()} (it is down or left the "
                "cluster)"
            )
        return self.router.connection(address)

    # ------------------------------------------------------------------------------------------ coordinator
    def record(self, broker_name: str, decision: TxnDecision, timeout_s: float | None = None) -> TxnDecision:
        """Record ``decision`` on coordinator ``broker_name``; the decision that stands there."""
        conn = self.connection(broker_name)
        stub = cpb_grpc.TransactionCoordinatorStub(conn.channel)
        answer = conn.call(stub.RecordDecision, cpb.RecordDecisionRequest(decision=to_pb(decision)), timeout_s)
        return from_pb(answer)

    def query(self, broker_name: str, txn_ids: Sequence[str] = (), prefix: str = "", *, abort_undecided: bool = False,
              masters: dict[str, str] | None = None) -> list[TxnDecision]:
        conn = self.connection(broker_name, masters)
        stub = cpb_grpc.TransactionCoordinatorStub(conn.channel)
        request = cpb.QueryDecisionsRequest(transaction_ids=list(txn_ids), prefix=prefix,
                                            abort_undecided=abort_undecided)
        return [from_pb(d) for d in conn.call(stub.QueryDecisions, request).decisions]

    # ------------------------------------------------------------------------------------------ participants
    def end(self, broker_name: str, txn_id: str, commit: bool, committed_attempts: Sequence[str] | None = None, *,
            expected_messages: int | None = None, timeout_s: float | None = None) -> str:
        """End ``txn_id``'s part on participant ``broker_name``; its (first) outcome."""
        conn = self.connection(broker_name)
        request = pb.EndTransactionRequest(
            transaction_id=txn_id, commit=commit, committed_attempts=list(committed_attempts or ()),
            restrict_attempts=committed_attempts is not None, expected_messages=expected_messages,
        )
        return str(conn.call(conn.stub.EndTransaction, request, timeout_s).status)

    def transactions(self, broker_name: str, prefix: str, status: str = "",
                     masters: dict[str, str] | None = None) -> dict[str, str]:
        """Transaction id -> status of the transactions on ``broker_name`` whose id starts with ``prefix``."""
        conn = self.connection(broker_name, masters)
        request = pb.ListTransactionsRequest(prefix=prefix, status=status)
        return {t.transaction_id: t.status for t in conn.call(conn.stub.ListTransactions, request).transactions}


__all__ = ["CoordinatorClient"]
