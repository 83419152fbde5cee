"""The TransactionCoordinator gRPC service, and how a participant broker reaches a coordinator.

Every broker serves it next to the Broker service, on the same port: any broker may be chosen as the coordinator of
a transaction over several brokers (broker/semantics/decision_log.py has the protocol). Errors travel as the Broker
service's do: the gRPC status for the response code, the code in the ``sluice-response-code`` trailer.

``coordinator_asker`` builds the participant resolver's way to a coordinator: this broker's own decision log when
it is the coordinator itself, else the coordinator's master found through the name servers (broker to broker).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import grpc

from broker.auth.operations import Operation, authorize
from broker.client.coordinator import CoordinatorClient
from broker.errors import BrokerError, ResponseCode, ServiceNotAvailableError
from broker.format.txn_decision import TxnDecision
from broker.proto import coordinator_pb2 as cpb
from broker.proto import coordinator_pb2_grpc as cpb_grpc
from broker.proto.decision import from_pb, to_pb
from broker.proto.status import RESPONSE_CODE_KEY, capped_details, grpc_code_for
from broker.semantics.decision_log import DecisionLog
from broker.semantics.participant_resolver import Ask
from broker.server.request_guard import refuse_if_malformed

log = logging.getLogger(__name__)

R = TypeVar("R")


def _abort(context: grpc.ServicerContext, code: ResponseCode, text: str) -> NoReturn:
    # Capped as the Broker service's: a reason quoting the request could pass what a client accepts as metadata.
    context.set_trailing_metadata(((RESPONSE_CODE_KEY, str(int(code))),))
    context.abort(grpc_code_for(code), capped_details(text))
    raise AssertionError("unreachable: context.abort raises")


def _answer(method: Callable[[Any, Any, grpc.ServicerContext], R]) -> Callable[[Any, Any, grpc.ServicerContext], R]:
    @functools.wraps(method)
    def wrapper(self: CoordinatorService, request: Any, context: grpc.ServicerContext) -> R:
        try:
            refuse_if_malformed(request)  # bytes that are no request of the method (request_guard.py)
            return method(self, request, context)
        except BrokerError as e:
            log.info("%s refused: %s (%s)", method.__name__, capped_details(e.message), e.code.name)
            _abort(context, e.code, e.message)
        except OSError as e:  # the disk, not the request (a full one): the caller may ask again, as BrokerService's
            log.exception("%s failed on an I/O error", method.__name__)
            refused = ServiceNotAvailableError.files_failed(e)
            _abort(context, refused.code, refused.message)
        except Exception as e:  # the last line of defence, as BrokerService's: logged, answered INTERNAL
            if isinstance(e, grpc.RpcError):
                raise
            log.exception("%s failed unexpectedly", method.__name__)
            _abort(context, ResponseCode.SYSTEM_ERROR, f"internal broker error ({type(e).__name__}: {e}); see log")

    return wrapper


class CoordinatorService(cpb_grpc.TransactionCoordinatorServicer):
    """``local_group``: the producer group a transaction was recorded under on this broker (None: this broker holds
    none of it). A decision ends a transaction: where this broker holds it, recording one (or an ABORT of an
    undecided one) is also decided as ending it through any other front (broker/auth/operations.py), so that an
    entry denying its group stands here too; elsewhere the right on the Cluster decides alone."""

    def __init__(self, decisions: DecisionLog, local_group: Callable[[str], str | None] = lambda txn_id: None
                 ) -> None:
        self.decisions = decisions
        self.local_group = local_group

    def _authorize_end(self, txn_ids: list[str]) -> None:
        for txn_id in txn_ids:
            found = self.local_group(txn_id)
            if found is not None:
                authorize(Operation.END_TRANSACTION, producer_group=found)

    @_answer
    def RecordDecision(self, request: cpb.RecordDecisionRequest, context: grpc.ServicerContext
                       ) -> cpb.TransactionDecision:
        authorize(Operation.RECORD_DECISION)
        decision = from_pb(request.decision)
        self._authorize_end([decision.txn_id])
        return to_pb(self.decisions.record(decision))

    @_answer
    def QueryDecisions(self, request: cpb.QueryDecisionsRequest, context: grpc.ServicerContext
                       ) -> cpb.QueryDecisionsResponse:
        authorize(Operation.QUERY_DECISIONS)
        if request.abort_undecided:  # decides the named undecided ones: ABORT
            authorize(Operation.RECORD_DECISION)
            self._authorize_end(list(request.transaction_ids))
        found = self.decisions.query(list(request.transaction_ids), request.prefix,
                                     abort_undecided=request.abort_undecided)
        return cpb.QueryDecisionsResponse(decisions=[to_pb(d) for d in found])


def coordinator_asker(decisions: DecisionLog, broker_name: str, client: CoordinatorClient | None) -> Ask:
    """The participant resolver's ``ask``: this broker's own decisions, or another broker's through ``client``."""

    def ask(coordinator: str, txn_ids: list[str], abort_undecided: bool) -> list[TxnDecision]:
        if coordinator == broker_name:
            return decisions.query(txn_ids, abort_undecided=abort_undecided)
        if client is None:
            raise ServiceNotAvailableError(
                f"coordinator {coordinator!r} cannot be found: this broker has no name servers (--namesrv)"
            )
        return client.query(coordinator, txn_ids, abort_undecided=abort_undecided)

    return ask


__all__ = ["CoordinatorService", "coordinator_asker"]
