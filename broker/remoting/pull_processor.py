"""PULL_MESSAGE (11): translated into the broker's pull (``broker.server.pull_processor.PullProcessor``), held
without a thread (``pull_suspend``) when the consumer asked to be (PullSysFlag SUSPEND) and nothing is new.

| pull status      | remoting code              | 4.x client                                                |
|------------------|----------------------------|-----------------------------------------------------------|
| FOUND            | SUCCESS (0), body entries  | FOUND: decodes the body (the stored entries, unchanged)   |
| NO_NEW_MSG       | PULL_NOT_FOUND (19)        | NO_NEW_MSG: pulls again from ``nextBeginOffset``          |
| NO_MATCHED_MSG   | PULL_RETRY_IMMEDIATELY (20)| NO_MATCHED_MSG: pulls again at once                       |
| OFFSET_ILLEGAL   | PULL_OFFSET_MOVED (21)     | OFFSET_ILLEGAL: moves to ``nextBeginOffset``              |

Every one of them carries ``suggestWhichBrokerId`` (0: this broker, a master's answer), ``nextBeginOffset``,
``minOffset`` and ``maxOffset``, which the client reads on each. A refusal answers its code (message_outcomes); a
SQL92 expression that does not parse is SUBSCRIPTION_PARSE_FAILED, an unknown group SUBSCRIPTION_GROUP_NOT_EXIST.
"""

from __future__ import annotations

from broker.errors import BrokerError, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.message_ids import RemotingIds
from broker.remoting.message_outcomes import Access, failure, refusal
from broker.remoting.message_replication import GroupReplication
from broker.remoting.processor import Answer, RequestContext
from broker.remoting.pull_request import SubscriptionOf, parse_pull, pull_args
from broker.remoting.pull_suspend import PullSuspender
from broker.server.pull_processor import FOUND, NO_MATCHED_MSG, NO_NEW_MSG, OFFSET_ILLEGAL, PullOutcome, PullProcessor

STATUS_CODES = {
    FOUND: ResponseCode.SUCCESS,
    NO_NEW_MSG: ResponseCode.PULL_NOT_FOUND,
    NO_MATCHED_MSG: ResponseCode.PULL_RETRY_IMMEDIATELY,
    OFFSET_ILLEGAL: ResponseCode.PULL_OFFSET_MOVED,
}
MASTER_ID = "0"  # MixAll.MASTER_ID: suggestWhichBrokerId when the master answers


def pull_answer(request: RemotingCommand, outcome: PullOutcome, ids: RemotingIds | None = None) -> RemotingCommand:
    ext = {
        "suggestWhichBrokerId": MASTER_ID,
        "nextBeginOffset": str(outcome.next_begin_offset),
        "minOffset": str(outcome.min_offset),
        "maxOffset": str(outcome.max_offset),
    }
    body = outcome.buffer if outcome.status == FOUND else b""
    if body and ids is not None:
        body = ids.served_all(bytes(body))  # offset ids lead to this port (message_ids.py)
    return request.response(int(STATUS_CODES[outcome.status]), ext_fields=ext, body=body)


class PullMessageProcessor:
    def __init__(
        self, pulls: PullProcessor, suspender: PullSuspender, access: Access,
        subscription_of: SubscriptionOf | None = None, replication: GroupReplication | None = None,
        ids: RemotingIds | None = None,
    ) -> None:
        self.pulls, self.suspender, self.access = pulls, suspender, access
        self.ids = ids
        self.subscription_of = subscription_of
        self.replication = replication or GroupReplication(None)

    def process(self, request: RemotingCommand, context: RequestContext) -> Answer:
        try:
            req = parse_pull(request.ext_fields)
            with self.access.as_caller(context):
                args = pull_args(req, self.subscription_of)
                if not self.replication.is_master():
                    args.commit_offset = -1  # a slave keeps no offsets of its own
                outcome = self.pulls.pull(args)
            hold_ms = min(req.suspend_ms, self.pulls.max_suspend_ms)
            if outcome.status != NO_NEW_MSG or hold_ms <= 0:
                return pull_answer(request, outcome, self.ids)
            args.commit_offset = -1  # committed by the first try
            return self.suspender.suspend(args, hold_ms, lambda later: self._later(request, later), outcome)
        except BrokerError as e:
            return refusal(request, e)
        except Exception as e:  # noqa: BLE001 - the last line of defence: answered, and the broker serves on
            return failure(request, e)

    def _later(self, request: RemotingCommand, later: PullOutcome | Exception) -> RemotingCommand:
        if isinstance(later, PullOutcome):
            return pull_answer(request, later, self.ids)
        if isinstance(later, BrokerError):
            return refusal(request, later)
        return failure(request, later)
