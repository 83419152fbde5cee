"""The fuzz oracle's part for RocketMQ 5's ``apache.rocketmq.v2.MessagingService``: answers and sent messages.

This service answers a refusal in the response (``Status{code, message}``, broker/rmqv2/codes.py), not as a gRPC
status. Rules: every call ends with gRPC OK (or a refusal the Broker service's rules accept, such as the auth
gate's), within its deadline (a stream too: ReceiveMessage and PullMessage end by themselves, Telemetry once the
client half-closes); every answer, and a stream's first, carries a status, and no status is INTERNAL_SERVER_ERROR
(the service's answer to an unexpected failure). Every message sent is given a unique body; after each family the
queues of every topic a send named are read whole: each message acknowledged to be stored plainly is there, and no
message of a refused send is (a refused request stores nothing); system topics, which no client may read, are left
out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass
from rocketmq.grpc_protocol import definition_pb2 as v2
from rocketmq.grpc_protocol import service_pb2 as v2s

from broker.format.system_topics import is_system_topic
from tests.unit.fuzz.fuzz_oracle import Fuzzer, Metadata
from tests.unit.fuzz.fuzz_strategies import FRESH_ID

SERVICE = "apache.rocketmq.v2.MessagingService"
MESSAGING = v2s.DESCRIPTOR.services_by_name["MessagingService"]
CLIENT_ID_HEADER = "x-mq-client-id"
CLIENT_ID = [(CLIENT_ID_HEADER, "fz-v2-client")]
BODY_PREFIX = b"v2-"


@dataclass
class Sent:
    """A message of a SendMessage, by its unique body: whether it must be in its topic, may be, or must not."""

    topic: str
    body: bytes
    must: bool  # acknowledged and stored plainly (no transaction, no timer): readable now
    may: bool  # acknowledged otherwise (a half, a timer message, stored but not replicated) or the answer was lost


def _statuses(responses: list[Any]) -> list[Any]:
    return [r.status for r in responses if r.HasField("status")]


@dataclass
class RocketMQ5:
    """Calls of the MessagingService, judged; the messages its sends stored, checked with every read-back."""

    fuzzer: Fuzzer
    sent: list[Sent] = field(default_factory=list)
    message_ids: set[str] = field(default_factory=set)  # of acknowledged sends: a resend may be deduplicated
    serial: int = 0

    def __post_init__(self) -> None:
        self.fuzzer.checks.append(self.check)

    # ------------------------------------------------------------------------------------------ calls
    def call(self, method: MethodDescriptor, request: Any, metadata: Metadata = CLIENT_ID) -> list[Any]:
        """A request (a message, or bytes that may be none; for Telemetry a list of them) to ``method``; its
        answers parsed (a unary call's one, a stream's in order), judged."""
        if method.name == "SendMessage" and not isinstance(request, bytes):
            request = self._unique_bodies(request)
        data = [_bytes(r) for r in request] if isinstance(request, list) else _bytes(request)
        a = self.fuzzer.send_raw(f"/{SERVICE}/{method.name}", data, streaming=method.server_streaming,
                                 client_streaming=method.client_streaming, metadata=metadata)
        what = f"{SERVICE}/{method.name}"
        if not a.ok:
            self.fuzzer.judge(what, a)
            self._sent(method, request, [], answered=False)
            return []
        responses = [_parse(method, r) for r in (a.response if isinstance(a.response, list) else [a.response])]
        statuses = _statuses(responses)
        problem = ""
        if not responses and method.name != "Telemetry":  # Telemetry answers nothing to a stream of no settings
            problem = "no answer"
        elif responses and not responses[0].HasField("status"):
            problem = f"the first answer carries no status: {responses[0]}"
        elif any(s.code == v2.INTERNAL_SERVER_ERROR for s in statuses):
            problem = f"INTERNAL_SERVER_ERROR: {[s.message[:200] for s in statuses]}"
        self.fuzzer.record(what, refused=any(s.code != v2.OK for s in statuses), problem=problem)
        self._sent(method, request, responses, answered=True)
        return responses

    def _unique_bodies(self, request: Any) -> Any:
        """Each message's body made unique (found by it later), and its id when the strategy asked for a fresh one."""
        out = v2s.SendMessageRequest()
        out.CopyFrom(request)
        for m in out.messages:
            self.serial += 1
            if m.body or self.serial % 2:  # half of the empty bodies stay empty (refused: nothing to find)
                m.body = BODY_PREFIX + f"{self.serial}|".encode() + m.body
            if m.system_properties.message_id == FRESH_ID:
                m.system_properties.message_id = f"FZ{self.serial:030X}"
        return out

    def _sent(self, method: MethodDescriptor, request: Any, responses: list[Any], *, answered: bool) -> None:
        if method.name != "SendMessage" or isinstance(request, bytes):
            return
        entries = list(responses[0].entries) if responses else []
        for i, m in enumerate(request.messages):
            ok = answered and i < len(entries) and entries[i].status.code == v2.OK
            stored = answered and i < len(entries) and entries[i].status.code == v2.MASTER_PERSISTENCE_TIMEOUT
            sp = m.system_properties
            plain = sp.message_type != v2.TRANSACTION and not sp.HasField("delivery_timestamp")
            fresh = sp.message_id not in self.message_ids
            must = ok and plain and fresh
            self.sent.append(Sent(m.topic.name, m.body, must, ok or stored or not answered))
            if ok:
                self.message_ids.add(sp.message_id)

    # ------------------------------------------------------------------------------------------ after a family
    def check(self, when: str) -> str:
        """Each topic a send named, read whole: the acknowledged plain messages there, no refused one. System
        topics are left out: no client may read them, and the service refuses every send naming one."""
        topics = sorted({s.topic for s in self.sent if not is_system_topic(s.topic)})
        found: set[bytes] = set()
        for topic in topics:
            found |= self.fuzzer.bodies(topic, BODY_PREFIX, when)
        missing = [s for s in self.sent if s.must and s.body not in found]  # (no system topic acknowledges a send)
        assert not missing, f"{when}: {len(missing)} acknowledged messages not found, first {missing[:3]}"
        stored = [s for s in self.sent if not s.may and s.body in found]
        assert not stored, f"{when}: {len(stored)} messages of refused sends were stored, first {stored[:3]}"
        refused = sum(not s.may for s in self.sent)
        return (f"{sum(s.must for s in self.sent)} acknowledged RocketMQ 5 messages found, none of {refused} refused "
                f"ones stored")


def _bytes(request: Any) -> bytes:
    return request if isinstance(request, bytes) else request.SerializeToString()


def _parse(method: MethodDescriptor, data: bytes) -> Any:
    message = GetMessageClass(method.output_type)()
    try:
        message.ParseFromString(data)
    except DecodeError as e:
        raise AssertionError(f"{method.name}: the broker's answer does not parse: {e}") from None
    return message
