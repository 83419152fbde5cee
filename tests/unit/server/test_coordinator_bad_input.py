"""Bad requests to the TransactionCoordinator service are refused clearly (INVALID_ARGUMENT with its response code,
details any client accepts) and decide nothing: bytes that are no request, and a refusal whose reason quotes a long
field (uncapped, it would pass the size gRPC accepts as metadata, and the client would see no code at all)."""

from __future__ import annotations

import grpc

from broker.errors import ResponseCode
from broker.proto import coordinator_pb2 as cpb
from broker.proto.status import MAX_DETAILS_ENCODED_BYTES
from broker.server.broker_controller import BrokerController
from tests.unit.server.hardening_rpc import answer, clear_refusal

SERVICE = "/sluice.v1.TransactionCoordinator"


def test_bytes_that_are_no_request_are_invalid_argument_and_decide_nothing(broker: BrokerController) -> None:
    assert broker.decisions is not None
    before = len(broker.decisions)
    with grpc.insecure_channel(f"127.0.0.1:{broker.port}") as ch:
        for method in ("RecordDecision", "QueryDecisions"):
            raw = ch.unary_unary(f"{SERVICE}/{method}", request_serializer=lambda b: b)
            for data in (b"\xff\xff\xff\xff", b"\x0a\x02\xff\xfe", b"\x12\x7fabc"):
                a = answer(raw, data)
                assert a.refused_with(grpc.StatusCode.INVALID_ARGUMENT, ResponseCode.INVALID_ARGUMENT), (method, a)
                assert "not a valid protobuf message" in a.details
    assert len(broker.decisions) == before


def test_a_refusal_quoting_a_long_field_is_capped_and_decides_nothing(broker: BrokerController) -> None:
    assert broker.decisions is not None
    with grpc.insecure_channel(f"127.0.0.1:{broker.port}") as ch:
        record = ch.unary_unary(f"{SERVICE}/RecordDecision",
                                request_serializer=cpb.RecordDecisionRequest.SerializeToString,
                                response_deserializer=cpb.TransactionDecision.FromString)
        for outcome in ("t" * 20_000, "\u00e9" * 6_000, "x\x01" * 3_000):
            decision = cpb.TransactionDecision(transaction_id="fz-long-outcome", outcome=outcome)
            a = answer(record, cpb.RecordDecisionRequest(decision=decision))
            assert a.refused_with(grpc.StatusCode.INVALID_ARGUMENT, ResponseCode.INVALID_ARGUMENT), a
            assert clear_refusal(a) and len(a.details.encode()) <= MAX_DETAILS_ENCODED_BYTES
    assert broker.decisions.get("fz-long-outcome") is None
