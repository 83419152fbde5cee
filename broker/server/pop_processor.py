"""Pop consumption over sluice.v1 (PopMessage, AckMessage, ChangeInvisibleTime): requests into PopService calls.

Popped messages travel as commit-log entries (store fields included), back to back, as pulls answer, with one
receipt handle, delivery attempt and invisible-until time per message beside them.
"""

from __future__ import annotations

import itertools

from broker.errors import InvalidArgumentError
from broker.format.system_topics import refuse_system_topic
from broker.proto import sluice_pb2 as pb
from broker.semantics.pop import PopRequest, PopService
from broker.server.admin_processor import encode_stored
from broker.server.consumer_offsets import validate_group

DEFAULT_POP_MSGS = 32  # RocketMQ's receive batch size
MAX_ACK_HANDLES = 1024  # handles one AckMessage may carry (a pop returns at most 1024 messages)


class PopProcessor:
    def __init__(self, pops: PopService, max_poll_ms: int) -> None:
        self.pops = pops
        self.max_poll_ms = max_poll_ms  # longest a pop may ask to be held (the broker's max_suspend_timeout_ms)

    def pop(self, request: pb.PopRequest, time_remaining_s: float | None) -> pb.PopResponse:
        validate_group(request.consumer_group)
        refuse_system_topic(request.topic, "pop")  # what the broker still owes is read by no client (operations.py)
        if request.poll_time_ms < 0 or request.max_msgs < 0:
            raise InvalidArgumentError("max_msgs and poll_time_ms must be >= 0 (0: default, answer at once)")
        popped = self.pops.pop(
            PopRequest(
                request.consumer_group, request.topic, request.queue_id if request.HasField("queue_id") else -1,
                request.max_msgs or DEFAULT_POP_MSGS,
                request.invisible_time_ms, request.expression_type or "TAG", request.expression,
                min(request.poll_time_ms, self.max_poll_ms),
            ),
            time_remaining_s,
        )
        raw = [p.entry if p.entry is not None else encode_stored(p.message) for p in popped]
        positions = list(itertools.accumulate((len(e) for e in raw[:-1]), initial=0)) if raw else []
        entries = b"".join(raw)
        return pb.PopResponse(
            entries=entries, entry_positions=positions, receipt_handles=[p.handle for p in popped],
            delivery_attempts=[p.attempt for p in popped], invisible_until_ms=[p.invisible_until_ms for p in popped],
        )

    def ack(self, request: pb.AckMessageRequest) -> pb.AckMessageResponse:
        validate_group(request.consumer_group)
        if len(request.receipt_handles) > MAX_ACK_HANDLES:
            raise InvalidArgumentError(f"{len(request.receipt_handles)} handles in one ack; at most {MAX_ACK_HANDLES}")
        # one refused handle does not refuse the others (each is its own ack)
        results = self.pops.ack_many(request.consumer_group, request.topic, list(request.receipt_handles))
        return pb.AckMessageResponse(errors=["" if e is None else f"{e.code.name}: {e.message}" for e in results])

    def change(self, request: pb.ChangeInvisibleTimeRequest) -> pb.ChangeInvisibleTimeResponse:
        validate_group(request.consumer_group)
        p = self.pops.change_invisible(request.consumer_group, request.topic, request.receipt_handle,
                                       request.invisible_time_ms)
        return pb.ChangeInvisibleTimeResponse(receipt_handle=p.handle, invisible_until_ms=p.invisible_until_ms)
