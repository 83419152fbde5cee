"""Pulls: the store's get statuses folded into the four pull statuses, offset correction, and long polling.

| store status                              | pull status                                   | next offset |
|-------------------------------------------|-----------------------------------------------|-------------|
| FOUND                                     | FOUND                                         | past them   |
| NO_MATCHED_MESSAGE, MESSAGE_WAS_REMOVING  | NO_MATCHED_MSG (pull again at once)           | store's     |
| OFFSET_FOUND_NULL                         | OFFSET_ILLEGAL (min = next offset) (**)       | store's     |
| OFFSET_OVERFLOW_ONE                       | NO_NEW_MSG (held when a timeout is given)     | offset      |
| NO_MESSAGE_IN_QUEUE, NO_MATCHED_LOGIC_Q.  | NO_NEW_MSG if offset == 0, else OFFSET_ILLEGAL| 0           |
| OFFSET_TOO_SMALL                          | OFFSET_ILLEGAL                                | min         |
| OFFSET_OVERFLOW_BADLY                     | OFFSET_ILLEGAL                                | max (*)     |

(*) never rewound to 0: RocketMQ once did, re-consuming days of data (apache/rocketmq 4215).
(**) the consume-queue file holding the offset is gone: it expired before cleanup moved the queue's minimum.
RocketMQ answers "not found" and moves on; answering what the moved minimum will say lets a reader that must not
lose data (a Spark source with failOnDataLoss) see the loss. The store answers units whose commit-log entries
expired the same way (OFFSET_TOO_SMALL, queue_reader.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.auth.operations import Operation, authorize
from broker.errors import InvalidArgumentError
from broker.format.message import StoredMessage, validate_topic
from broker.format.subscription import parse_tags, tag_codes
from broker.format.system_topics import refuse_system_topic
from broker.server.consumer_offsets import ConsumerOffsetManager, validate_group
from broker.server.metrics import BrokerMetrics
from broker.server.pull_hold import PullHoldService
from broker.server.topic_config import TopicConfigManager
from broker.store import GetStatus, MessageStore
from broker.store.store_results import GetResult

FOUND, NO_NEW_MSG, NO_MATCHED_MSG, OFFSET_ILLEGAL = "FOUND", "NO_NEW_MSG", "NO_MATCHED_MSG", "OFFSET_ILLEGAL"
# Held pulls answer this long before the caller's gRPC deadline so the answer is not lost to it.
DEADLINE_MARGIN_MS = 200
# How long a pull past the end waits for a lagging dispatcher before answering OFFSET_ILLEGAL.
DISPATCH_LAG_WAIT_MS = 200


@dataclass
class PullOutcome:
    status: str
    next_begin_offset: int
    min_offset: int
    max_offset: int
    buffer: bytes = b""
    entry_positions: list[int] = field(default_factory=list)


def fold_status(result: GetResult, offset: int) -> PullOutcome:
    s, lo, hi = result.status, result.min_offset, result.max_offset
    if s is GetStatus.FOUND:
        return PullOutcome(FOUND, result.next_begin_offset, lo, hi, bytes(result.buffer), list(result.entry_positions))
    if s in (GetStatus.NO_MATCHED_MESSAGE, GetStatus.MESSAGE_WAS_REMOVING):
        return PullOutcome(NO_MATCHED_MSG, max(result.next_begin_offset, offset), lo, hi)
    if s is GetStatus.OFFSET_FOUND_NULL:
        next_offset = max(result.next_begin_offset, offset + 1)
        return PullOutcome(OFFSET_ILLEGAL, next_offset, max(lo, next_offset), hi)
    if s is GetStatus.OFFSET_OVERFLOW_ONE:
        return PullOutcome(NO_NEW_MSG, offset, lo, hi)
    if s in (GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.NO_MATCHED_LOGIC_QUEUE):
        return PullOutcome(NO_NEW_MSG if offset == 0 else OFFSET_ILLEGAL, 0, lo, hi)
    if s is GetStatus.OFFSET_TOO_SMALL:
        return PullOutcome(OFFSET_ILLEGAL, lo, lo, hi)
    if s is GetStatus.OFFSET_OVERFLOW_BADLY:
        return PullOutcome(OFFSET_ILLEGAL, hi, lo, hi)
    raise AssertionError(f"unhandled get status {s}")


# Get statuses that a send not yet dispatched can cause: the pull waits for the dispatcher before answering them.
PAST_THE_END = frozenset({GetStatus.OFFSET_OVERFLOW_BADLY, GetStatus.OFFSET_OVERFLOW_ONE,
                          GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.NO_MATCHED_LOGIC_QUEUE})


@dataclass
class PullRequestArgs:
    group: str
    topic: str
    queue_id: int
    offset: int
    max_msgs: int = 0
    max_bytes: int = 0
    suspend_timeout_ms: int = 0
    tag_expression: str = ""
    commit_offset: int = -1
    expression_type: str = ""  # "TAG" (or empty) or "SQL92"


class PullProcessor:
    def __init__(
        self, store: MessageStore, topics: TopicConfigManager, offsets: ConsumerOffsetManager, hold: PullHoldService,
        metrics: BrokerMetrics, *, default_max_msgs: int = 32, max_msgs: int = 4096, max_bytes: int = 16 << 20,
        max_suspend_ms: int = 60_000,
    ) -> None:
        self.store, self.topics, self.offsets, self.hold, self.metrics = store, topics, offsets, hold, metrics
        self.default_max_msgs, self.max_msgs, self.max_bytes = default_max_msgs, max_msgs, max_bytes
        self.max_suspend_ms = max_suspend_ms
        # Broker semantics hooks (set by the controller): refuse a pull (consumeEnable, DLQ), build a SQL92 filter.
        self.admit: Callable[[str, str], None] | None = None
        self.message_filter: Callable[[str, str], Callable[[StoredMessage], bool] | None] | None = None

    def validate(self, req: PullRequestArgs) -> None:
        validate_group(req.group)
        validate_topic(req.topic)
        refuse_system_topic(req.topic, "pull")
        self.topics.check_queue(req.topic, req.queue_id)
        if req.offset < 0:
            raise InvalidArgumentError(
                f"pull offset {req.offset} is negative; start at the queue's min offset (`sluice topic describe`)"
            )
        if req.max_msgs < 0 or req.max_bytes < 0 or req.suspend_timeout_ms < 0:
            raise InvalidArgumentError("max_msgs, max_bytes and suspend_timeout_ms must be >= 0 (0: default)")

    def pull(
        self,
        req: PullRequestArgs,
        time_remaining_s: float | None = None,
        on_call_end: Callable[[Callable[[], None]], object] | None = None,
    ) -> PullOutcome:
        """Answer one pull, holding it while nothing is new (long polling). ``on_call_end``: registers a function
        the server calls when the pull's call ends early (cancelled by the client, e.g. at its shutdown or a
        rebalance): the hold then ends at once instead of keeping a worker thread and a held-pull slot."""
        authorize(Operation.CONSUME, group=req.group, topics=[req.topic])  # before admit, which may make the group
        self.validate(req)
        if self.admit is not None:
            self.admit(req.group, req.topic)
        selector = self.message_filter(req.expression_type, req.tag_expression) if self.message_filter else None
        codes = None if selector is not None else tag_codes(parse_tags(req.tag_expression))
        if req.commit_offset >= 0:
            self.commit(req.group, req.topic, req.queue_id, req.commit_offset)
        max_msgs = min(req.max_msgs or self.default_max_msgs, self.max_msgs)
        max_bytes = min(req.max_bytes or self.max_bytes, self.max_bytes)
        hold_ms = min(req.suspend_timeout_ms, self.max_suspend_ms)
        if time_remaining_s is not None:
            hold_ms = min(hold_ms, int(time_remaining_s * 1000) - DEADLINE_MARGIN_MS)
        started = time.monotonic()
        deadline = started + max(hold_ms, 0) / 1000
        waited_for_dispatch = False
        ended, wake = threading.Event(), threading.Event()

        def call_ended() -> None:
            ended.set()  # first: the loop checks it after clearing wake
            wake.set()

        if on_call_end is not None and hold_ms > 0 and on_call_end(call_ended) is False:
            call_ended()  # the call already ended (cancelled while this pull was validated): do not hold at all
        while True:
            result = self.store.get_message(
                req.group, req.topic, req.queue_id, req.offset, max_msgs, max_bytes, codes, message_filter=selector
            )
            past_end = result.status in PAST_THE_END  # or before a new queue's first unit is dispatched
            has_new = self._has_new(req)
            # (has_new: the dispatcher may have caught up between the get and the lag check just below)
            if past_end and not waited_for_dispatch and (self._dispatch_behind() or has_new()):
                # The offset may be one a send just returned, not yet dispatched to the consume queue: wait for
                # the dispatcher rather than answer "nothing new" or, worse, send the consumer back to the max
                # offset (it would re-read messages). Read-your-writes for a consumer that follows a producer.
                waited_for_dispatch = True
                self.hold.wait_for(req.topic, req.queue_id, req.offset, DISPATCH_LAG_WAIT_MS, has_new)
                continue
            outcome = fold_status(result, req.offset)
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if outcome.status != NO_NEW_MSG or remaining_ms <= 0 or ended.is_set() or not self.hold.can_hold():
                break
            wake.clear()
            if ended.is_set():  # the call ended between the check above and the clear
                break
            self.hold.wait_for(req.topic, req.queue_id, req.offset, remaining_ms, has_new, wake)
        if hold_ms > 0:
            self.metrics.long_poll_wait.observe(time.monotonic() - started)
        if outcome.entry_positions:
            self.metrics.get_messages.inc(len(outcome.entry_positions))
            self.metrics.get_bytes.inc(len(outcome.buffer))
        return outcome

    def _dispatch_behind(self) -> bool:
        return self.store.dispatched_offset() < self.store.max_phys_offset()

    def _has_new(self, req: PullRequestArgs) -> Callable[[], bool]:
        store, topic, queue_id, offset = self.store, req.topic, req.queue_id, req.offset
        return lambda: store.max_offset(topic, queue_id) > offset

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.offsets.commit(group, {(topic, queue_id): offset}, self.check_commit)

    def check_commit(self, topic: str, queue_id: int, offset: int) -> None:
        """A committed offset must name a queue that exists, not of a system topic, and lie within [0, max
        offset]."""
        validate_topic(topic)
        refuse_system_topic(topic, "commit consumer offsets of")
        self.topics.check_queue(topic, queue_id)
        max_offset = self.store.max_offset(topic, queue_id)
        if offset > max_offset:
            raise InvalidArgumentError(
                f"offset {offset} for {topic}/{queue_id} is past the queue's max offset {max_offset}; "
                "commit the next offset to consume, at most the max offset"
            )
