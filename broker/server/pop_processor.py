"""Pop consumption, the operation every front calls (sluice.v1's PopMessage, AckMessage and ChangeInvisibleTime,
the remoting front's codes 200050, 200051 and 200053, RocketMQ 5's ReceiveMessage, AckMessage,
ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue and a client's termination): asks for the caller's rights
(Sub on the group and on the topic), checks the request's names and bounds, then asks PopService.

Protocol-neutral: requests and answers are PopService's own (PopRequest, PopDelivery); each front translates its
wire to them and back.
"""

from __future__ import annotations

from dataclasses import replace

from broker.auth.operations import Operation, authorize
from broker.errors import BrokerError, InvalidArgumentError
from broker.format.system_topics import refuse_system_topic
from broker.semantics.pop import PopDelivery, PopRequest, PopService
from broker.server.consumer_offsets import validate_group

DEFAULT_POP_MSGS = 32  # RocketMQ's receive batch size
MAX_ACK_HANDLES = 1024  # handles one ack may carry (a pop returns at most 1024 messages)


class PopProcessor:
    def __init__(self, pops: PopService, max_poll_ms: int) -> None:
        self.pops = pops
        self.max_poll_ms = max_poll_ms  # longest a pop may ask to be held (the broker's max_suspend_timeout_ms)

    def pop(self, request: PopRequest, time_remaining_s: float | None) -> list[PopDelivery]:
        """``max_msgs`` 0: the default; ``long_poll_ms`` is cut to the broker's longest hold."""
        authorize(Operation.CONSUME, group=request.group, topics=[request.topic])
        validate_group(request.group)
        refuse_system_topic(request.topic, "pop")  # what the broker still owes is read by no client (operations.py)
        if request.long_poll_ms < 0 or request.max_msgs < 0:
            raise InvalidArgumentError("max_msgs and poll_time_ms must be >= 0 (0: default, answer at once)")
        bounded = replace(request, max_msgs=request.max_msgs or DEFAULT_POP_MSGS,
                          long_poll_ms=min(request.long_poll_ms, self.max_poll_ms))
        return self.pops.pop(bounded, time_remaining_s)

    def ack(self, group: str, topic: str, handles: list[str]) -> list[BrokerError | None]:
        """Per handle None (acked) or why not: one refused handle does not refuse the others (each is its own ack)."""
        authorize(Operation.CONSUME, group=group, topics=[topic])
        validate_group(group)
        if len(handles) > MAX_ACK_HANDLES:
            raise InvalidArgumentError(f"{len(handles)} handles in one ack; at most {MAX_ACK_HANDLES}")
        return self.pops.ack_many(group, topic, handles)

    def change(self, group: str, topic: str, handle: str, invisible_ms: int) -> PopDelivery:
        """The delivery with its new handle and invisible-until time."""
        authorize(Operation.CONSUME, group=group, topics=[topic])
        validate_group(group)
        return self.pops.change_invisible(group, topic, handle, invisible_ms)

    def forward_to_dlq(self, group: str, topic: str, handle: str) -> str:
        """The message a current handle names stored in %DLQ%{group} and ended; the DLQ topic."""
        authorize(Operation.CONSUME, group=group, topics=[topic])
        validate_group(group)
        return self.pops.forward_to_dlq(group, topic, handle)

    def release(self, deliveries: list[PopDelivery], group: str, topic: str) -> None:
        """Deliveries whose answer never reached the consumer (its call ended first): due again within a second."""
        self.pops.release([(group, topic, d.handle) for d in deliveries])

    def release_client(self, client_id: str) -> None:
        """A client went away: the deliveries renewed on its behalf become due within a second."""
        self.pops.release_client(client_id)


__all__ = ["DEFAULT_POP_MSGS", "MAX_ACK_HANDLES", "PopDelivery", "PopProcessor", "PopRequest"]
