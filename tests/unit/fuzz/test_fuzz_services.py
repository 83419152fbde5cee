"""Fuzzing the broker process's other services on its client port, as test_fuzz_broker.py fuzzes the Broker
service and with the same oracle (fuzz_oracle.Fuzzer): the transaction coordinator (``sluice.v1.
TransactionCoordinator``) and RocketMQ 5's ``apache.rocketmq.v2.MessagingService``.

Families: decisions recorded and queried (a few transaction ids again and again, well made or not), a request of
every coordinator RPC from its descriptors and bytes that are no request; RocketMQ 5 sends (well made or each kind
of bad message), a request of every RocketMQ 5 RPC from the descriptors with or without the client id header, and
bytes that are no request. Each service's own rules are in fuzz_coordinator.py and fuzz_rmqv2.py; after each
family the broker is stopped, its store checked and restarted, and everything read back, as in the Broker's fuzz.

The default run is short and deterministic; ``make fuzz`` (SLUICE_FUZZ_LONG=1) runs fifteen times the examples,
random ones, with a SIGKILL instead of a clean stop after every other family.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from google.protobuf.descriptor import MethodDescriptor
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.fuzz.fuzz_coordinator import COORDINATOR, DecisionBook
from tests.unit.fuzz.fuzz_oracle import FUZZ_SETTINGS, SCALE, STORE_SETTINGS, Fuzzer, started_fuzzer
from tests.unit.fuzz.fuzz_rmqv2 import MESSAGING, RocketMQ5
from tests.unit.fuzz.fuzz_strategies import (
    coordinator_calls,
    messages,
    method_requests,
    not_requests,
    v2_metadata,
    v2_sends,
)

pytestmark = pytest.mark.slow
# Long polling kept short: a ReceiveMessage of an empty queue waits this long, not RocketMQ's 5..20 s. Dead-letter
# topics pullable: a RocketMQ 5 send may name one, and the oracle reads every topic a send named.
BROKER_SETTINGS = {"store": STORE_SETTINGS, "rmqv2_min_long_polling_ms": 100, "rmqv2_max_long_polling_ms": 300,
                   "dlq_pull_enable": True}
TELEMETRY_COMMANDS_MAX = 3


@dataclass
class Services:
    fuzzer: Fuzzer
    decisions: DecisionBook
    rmq: RocketMQ5


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    with started_fuzzer(tmp_path_factory.mktemp("fuzz-services"), BROKER_SETTINGS) as f:
        yield Services(f, DecisionBook(f), RocketMQ5(f))


def test_coordinator_family(services: Services) -> None:
    methods = [(m.name, m.client_streaming or m.server_streaming) for m in COORDINATOR.methods]

    @settings(FUZZ_SETTINGS, max_examples=300 * SCALE)
    @given(st.one_of(
        coordinator_calls, coordinator_calls,
        method_requests(COORDINATOR).map(lambda mr: (mr[0].name, mr[1])),
        st.tuples(st.sampled_from([name for name, _ in methods]), not_requests()),
    ))
    def one(call: tuple[str, Any]) -> None:
        method, request = call
        services.decisions.call(method, request if isinstance(request, bytes) else request.SerializeToString())

    one()
    print(services.fuzzer.end_family("TransactionCoordinator requests"))


def test_rocketmq5_send_family(services: Services) -> None:
    send = MESSAGING.methods_by_name["SendMessage"]

    @settings(FUZZ_SETTINGS, max_examples=200 * SCALE)
    @given(v2_sends())
    def one(request: Any) -> None:
        services.rmq.call(send, request)

    one()
    print(services.fuzzer.end_family("RocketMQ 5 sends"))


def test_rocketmq5_every_rpc_family(services: Services) -> None:
    telemetry = MESSAGING.methods_by_name["Telemetry"]
    commands = messages(telemetry.input_type, dense=True)

    @settings(FUZZ_SETTINGS, max_examples=600 * SCALE)
    @given(st.one_of(
        method_requests(MESSAGING, dense=True), method_requests(MESSAGING, dense=True),
        method_requests(MESSAGING, dense=True),
        st.tuples(st.just(telemetry), st.lists(commands, min_size=1, max_size=TELEMETRY_COMMANDS_MAX)),
        st.tuples(st.sampled_from(list(MESSAGING.methods)), not_requests()),
    ), v2_metadata)
    def one(call: tuple[MethodDescriptor, Any], metadata: list[tuple[str, str]]) -> None:
        method, request = call
        if method.client_streaming and not isinstance(request, list):
            request = [request]
        services.rmq.call(method, request, metadata)

    one()
    print(services.fuzzer.end_family("a request of every RocketMQ 5 RPC"))


def test_the_service_families_saw_both_outcomes(services: Services) -> None:
    """Both outcomes happened on each service: decisions recorded and refused, messages stored and refused."""
    f, d, r = services.fuzzer, services.decisions, services.rmq
    assert f.families == 3 and f.calls > f.refused > 0, (f.families, f.calls, f.refused)
    assert len(d.stood) > 5 and d.refused, (len(d.stood), len(d.refused))
    found, refused = sum(s.must for s in r.sent), sum(not s.may for s in r.sent)
    assert found > 10 and refused > 10, (found, refused)
