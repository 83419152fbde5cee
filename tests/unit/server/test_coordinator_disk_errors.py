"""A coordinator whose files fail it (a full disk) answers SERVICE_NOT_AVAILABLE, as the Broker service does, never
INTERNAL: the exactly-once sink waits such an answer out and asks again, while INTERNAL ended a soak's Spark query."""

from __future__ import annotations

import errno

import grpc
import pytest

from broker.errors import ResponseCode
from broker.proto import coordinator_pb2 as cpb
from broker.proto.status import grpc_code_for
from broker.server.broker_controller import BrokerController
from tests.unit.server.hardening_rpc import answer

SERVICE = "/sluice.v1.TransactionCoordinator"


def test_a_decision_the_disk_fails_is_service_not_available(
    broker: BrokerController, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert broker.decisions is not None

    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(broker.decisions, "record", no_space)
    with grpc.insecure_channel(f"127.0.0.1:{broker.port}") as ch:
        record = ch.unary_unary(f"{SERVICE}/RecordDecision",
                                request_serializer=cpb.RecordDecisionRequest.SerializeToString,
                                response_deserializer=cpb.TransactionDecision.FromString)
        decision = cpb.TransactionDecision(transaction_id="disk-full-1", outcome="COMMIT")
        a = answer(record, cpb.RecordDecisionRequest(decision=decision))
    code = ResponseCode.SERVICE_NOT_AVAILABLE
    assert a.refused_with(grpc_code_for(code), code), a
    assert "No space left on device" in a.details and "retry later" in a.details
